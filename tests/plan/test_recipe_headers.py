"""Every recipe's header example (`Override:`) is planned on the GPU its `Check:` line names, and fits."""

from __future__ import annotations

import re
import shlex

from tunelab import hardware
from tunelab.plan.recipe import plan_recipe
from tunelab.recipes import discover


def test_each_header_override_example_fits_the_gpu_the_header_names():
    checked = 0
    for recipe in discover():
        text = recipe.path.read_text()
        override = re.search(r"^# Override: (.+)$", text, re.M).group(1)
        gpu = re.search(r"^# Check: .*--gpu (\S+)", text, re.M).group(1)
        argv = shlex.split(override)
        assert argv[:2] == ["litgpt", recipe.command] and argv[3].endswith(f"{recipe.key}.yaml"), override
        plan = plan_recipe(recipe, argv[4:], gpu=hardware.lookup(gpu)).plan
        assert plan.fits and not plan.edge, (recipe.key, override, plan.peak_allocated_bytes / 1e9)
        checked += 1
    assert checked == len(discover()) >= 12
