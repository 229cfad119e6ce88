"""The package's shape, as docs/architecture.md draws it: stages that import only downwards, no import cycle, no
private name used across modules, one small CLI module per subcommand, each concept computed in one place."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tunelab"

LAYERS = {"core": 0, "data": 0, "plan": 1, "run": 2, "tune": 3, "report": 4, "cli": 5}
"""Stage of each subpackage (top-level modules are the core); a module may import its own stage and those below."""


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imports(path: Path, all_levels: bool) -> list[tuple[str, list[str]]]:
    """(module, names) for every ``import tunelab...`` / ``from tunelab... import ...`` in the file: at module level
    only unless ``all_levels`` (function-local imports run later and cannot form an import-time cycle)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = ast.walk(tree) if all_levels else tree.body
    out = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tunelab"):
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("tunelab")]
    return out


def stage(module: str) -> str:
    parts = module.split(".")
    if module == "tunelab.__main__":
        return "cli"  # `python -m tunelab` is the command line
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "core"


def import_graph(all_levels: bool = True) -> dict[str, set[str]]:
    """{module: the tunelab modules it imports} (function-local imports included unless ``all_levels`` is False)."""
    mods = modules()
    graph = {}
    for name, path in mods.items():
        targets = set()
        for module, names in imports(path, all_levels=all_levels):
            for n in names:  # `from tunelab.plan import recipe` imports the submodule tunelab.plan.recipe
                if f"{module}.{n}" in mods:
                    targets.add(f"{module}.{n}")
            if module in mods and not any(f"{module}.{n}" in mods for n in names):
                targets.add(module)
        graph[name] = targets - {name}
    return graph


def test_no_import_cycle_at_any_level():
    """Function-local imports included: a cycle hidden inside a function is still one module needing the other."""
    graph = import_graph()
    state: dict[str, int] = {}

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*trail, node, nxt]))
            if state.get(nxt) is None:
                visit(nxt, [*trail, node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_the_plan_model_never_imports_the_tracer_nor_torch():
    """plan/model/ reads traces only through the Tables it is handed, and names neither torch nor litgpt (importing
    it loads neither: tests/e2e/test_packaging.py)."""
    found = [
        f"{name} imports {target}"
        for name, targets in import_graph().items()
        if name.startswith("tunelab.plan.model")
        for target in targets
        if target.startswith("tunelab.plan.") and not target.startswith("tunelab.plan.model")
    ]
    assert not found, found
    for path in (PACKAGE / "plan" / "model").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"^\s*(import|from) (torch|litgpt)\b", text, re.M), path.name


def test_no_private_name_crosses_modules():
    found = [
        f"{path.relative_to(ROOT)}: {module}.{n}"
        for path in PACKAGE.rglob("*.py")
        for module, names in imports(path, all_levels=True)
        for n in names
        if n.startswith("_")
    ]
    assert not found, found


def test_stages_import_only_downwards():
    """core <- plan <- run <- tune <- report <- cli (function-local imports included)."""
    found = []
    for name, path in modules().items():
        for module, names in imports(path, all_levels=True):
            targets = (
                [f"{module}.{n}" for n in names]
                if module in ("tunelab",) + tuple(f"tunelab.{k}" for k in LAYERS)
                else [module]
            )
            for target in targets:
                if LAYERS[stage(target)] > LAYERS[stage(name)]:
                    found.append(f"{name} ({stage(name)}) imports {target} ({stage(target)})")
    assert not found, found


def test_the_data_stage_imports_only_the_core_below_it():
    """The core and data share layer 0, but the core's domain modules (settings, validate, checkpoints) read the data
    stage: a data module may import only core modules that do not import the data stage back (the utilities:
    paths, files, errors, litgpt_source; function-local imports included). data/modules.py reading litgpt's data
    defaults from settings, which imports the data stage's records, was such an upward import; both now read
    tunelab.litgpt_source."""
    mods = modules()

    def targets(name):
        out = set()
        for module, names in imports(mods[name], all_levels=True):
            out |= {f"{module}.{n}" for n in names if f"{module}.{n}" in mods} or ({module} & set(mods))
        return out

    found = []
    for name in mods:
        for target in targets(name):
            if stage(name) == "data" and stage(target) == "core":
                back = [t for t in targets(target) if stage(t) == stage(name)]
                if back:
                    found.append(f"{name} imports {target}, which imports {back[0]} (data)")
    assert not found, found


def test_one_small_module_per_subcommand():
    from tunelab.cli import COMMANDS

    files = {p.stem for p in (PACKAGE / "cli").glob("*.py")} - {"__init__", "common"}
    assert files == {m.__name__.rsplit(".", 1)[1] for m in COMMANDS}
    for path in (PACKAGE / "cli").glob("*.py"):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= 160, f"{path.name}: {lines} lines; a subcommand module is its parser and a thin handler"


def test_concepts_are_computed_in_one_place():
    """World size, accumulation and the LoRA target list have one definition each (tunelab.settings); litgpt's
    default LoRA rank is not spelled as a literal fallback anywhere."""
    sources = {p: p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py")}
    where = {
        "world size": re.compile(r"\*\s*(max\(1,\s*)?(int\()?[\w.]*num_nodes\b"),
        "accumulation": re.compile(r"global_batch_size\)?\s*//"),
        "LoRA target list": re.compile(r"\(\s*\"query\",\s*\"key\",\s*\"value\",\s*\"projection\""),
        "LoRA rank fallback": re.compile(r"lora_r\s+or\s+8"),
    }
    for concept, pattern in where.items():
        hits = [str(p.relative_to(ROOT)) for p, text in sources.items() if pattern.search(text)]
        allowed = [] if concept == "LoRA rank fallback" else ["tunelab/settings.py"]
        assert hits == allowed, f"{concept} computed in {hits}, expected only in {allowed}"


def test_units_and_the_number_formatter_are_in_one_place():
    """Bytes become GB (1e9) and GiB (2^30) through tunelab.units' constants, and a figure that may be missing is
    formatted by its fmt / gb: no byte literal divides or multiplies elsewhere, no module keeps its own formatter."""
    literal = re.compile(r"[/*]\s*(1e9|2\s*\*\*\s*30|1024\s*\*\*\s*3)\b(?!\s*/\s*SCALE)|^\s*GB\s*=", re.M)
    formatter = re.compile(r"^def _(gb|num|fmt)\(", re.M)
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "units.py":
            continue
        code = path.read_text(encoding="utf-8")
        text = re.sub(r'"""[\s\S]*?"""', '""', code)  # docstrings may say how; code (f-strings too) may not
        found += [f"{path.relative_to(ROOT)}: {m.group(0).strip()}" for m in literal.finditer(text)]
        found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in formatter.finditer(code)]
    assert not found, found


def test_public_functions_are_documented():
    missing = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if ast.get_docstring(tree) is None:
            missing.append(f"{path.relative_to(ROOT)}: module")
        for node in tree.body:
            if (
                isinstance(node, (ast.FunctionDef, ast.ClassDef))
                and not node.name.startswith("_")
                and ast.get_docstring(node) is None
            ):
                missing.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert not missing, missing


def test_a_finished_run_is_planned_again_in_one_labelled_place():
    """A report prints the plan its record stored before the run; planning a finished run again from its override
    strings (today's planner, which may differ) happens in one helper that says so (tunelab.plan.stored), nowhere
    else in the package or its scripts."""
    pattern = re.compile(r"plan_recipe\(.*\brec\.overrides")
    sources = [*PACKAGE.rglob("*.py"), *(ROOT / "scripts").rglob("*.py")]
    hits = [str(p.relative_to(ROOT)) for p in sources if pattern.search(p.read_text(encoding="utf-8"))]
    assert hits == ["tunelab/plan/stored.py"], hits


LONG_FUNCTIONS: frozenset = frozenset()
"""Functions of more than 60 lines not yet split into named steps: none left (a list that may only shrink)."""


def test_no_new_function_over_60_lines():
    """Every function in the package fits in 60 lines but those still listed in :data:`LONG_FUNCTIONS`; a function
    split into named steps leaves the list (the test fails until it does), a new long one fails it."""
    found = set()
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                found.add(f"{name}.{node.name}")
    assert found - LONG_FUNCTIONS == set(), f"new functions over 60 lines: {sorted(found - LONG_FUNCTIONS)}"
    assert LONG_FUNCTIONS - found == set(), f"split, so leave LONG_FUNCTIONS: {sorted(LONG_FUNCTIONS - found)}"


def test_the_tests_mirror_the_package_in_their_layers():
    """Every test file sits in a layer's folder (tests/conftest.py names them: the unit layer's one per stage, then
    e2e and accuracy), and each stage folder of the unit layer is a stage of the package: a module's tests are found
    by path."""
    from tests.conftest import UNIT_LAYER

    tests = ROOT / "tests"
    misplaced = [
        str(p.relative_to(ROOT))
        for p in tests.rglob("test_*.py")
        if p.parent.name not in (*UNIT_LAYER, "e2e", "accuracy") or p.parent.parent != tests
    ]
    assert not misplaced, f"test files outside the layers' folders: {misplaced}"
    stages = set(UNIT_LAYER) - {"cli", "repo"}
    assert stages <= set(LAYERS), stages - set(LAYERS)


HEAVY = ("torch", "litgpt", "lightning", "deepspeed", "bitsandbytes", "liger_kernel", "numpy", "matplotlib", "pynvml")
"""Third-party packages slow to import (seconds) or absent on some machines: imported where they are used."""
LAZY_THIRD_PARTY = HEAVY + ("jsonargparse", "tokenizers", "torchmetrics", "triton")
"""What a function may import besides a heavy tunelab module: :data:`HEAVY`, and the packages that come with
litgpt or torch (its parser, its tokenizers, torch's metrics and kernel compiler), imported only where used."""


def heavy_at_import(module: str, mods: dict, seen: set | None = None) -> bool:
    """Whether importing ``module`` loads a :data:`HEAVY` package (its own module-level imports, followed)."""
    seen = set() if seen is None else seen
    if module in seen or module not in mods:
        return False
    seen.add(module)
    for node in ast.parse(mods[module].read_text(encoding="utf-8")).body:
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name.split(".")[0] in HEAVY or (name.startswith("tunelab") and heavy_at_import(name, mods, seen)):
                return True
    return False


def test_a_function_imports_only_what_is_heavy_to_import():
    """Outside the CLI's lazy loading, a tunelab module imported inside a function is one whose import loads torch,
    litgpt or another heavy package, and a package one of :data:`LAZY_THIRD_PARTY`; everything else (the standard
    library included) is imported at the top, where the graph shows it."""
    mods = modules()
    found = []
    for name, path in mods.items():
        if stage(name) == "cli":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        functions = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in {id(n): n for f in functions for n in ast.walk(f)}.values():
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tunelab"):
                targets = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods]
                if not any(heavy_at_import(t, mods) for t in targets or [node.module]):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):  # the standard library, or another package
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if not _lazy(n)]
    assert not found, found


def _lazy(name: str) -> bool:
    """Whether a module a function imports may be imported there (:data:`LAZY_THIRD_PARTY`)."""
    return name.split(".")[0] in LAZY_THIRD_PARTY


STRATEGY_NAMES = {"single", "ddp", "fsdp", "fsdp1", "fsdp2", "deepspeed"}
"""Names of strategies (a strategy file's ``name``, :attr:`PlanInput.strategy`)."""
REGISTRY = "tunelab/plan/model/strategies/__init__.py"
NAME_TESTS_LEFT: dict[str, int] = {}
"""Where a strategy's name is still compared outside the registries (none). Ceilings that may only come down. The
registries: the planner's (``tunelab.plan.model.strategies``) and the run's (``tunelab.strategies.KINDS``)."""


def name_tests(path: Path) -> int:
    """Comparisons in ``path`` with a strategy's name on one side (``x == "fsdp"``, ``name in ("ddp", "fsdp")``) or
    as a prefix or suffix (``name.startswith("fsdp")``)."""

    def names_a_strategy(side) -> bool:
        items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
        return any(isinstance(c, ast.Constant) and c.value in STRATEGY_NAMES for c in items)

    count = 0
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            count += any(names_a_strategy(side) for side in (node.left, *node.comparators))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            count += node.func.attr in ("startswith", "endswith") and any(map(names_a_strategy, node.args))
    return count


def test_no_strategy_name_is_compared_outside_the_registry():
    """The planner asks a strategy object (``tunelab.plan.model.strategies.of``) what it does; only the registry reads
    names. The places left may only shrink."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel != REGISTRY and (n := name_tests(path)):
            found[rel] = n
    over = {rel: n for rel, n in found.items() if n > NAME_TESTS_LEFT.get(rel, 0)}
    assert not over, f"a strategy's name compared outside {REGISTRY}: {over}; ask the strategy object instead"
    assert not any(rel.startswith("tunelab/plan/model/") for rel in found), found


def test_the_case_and_the_strategy_go_by_their_names():
    """A planned case is ``case``, resolved settings ``settings``, a strategy ``strategy`` (or ``strategy_config``):
    never ``x``, ``s`` or ``strat`` (issue: names that say what they hold)."""
    short = {"x": "PlanInput", "s": "Settings", "strat": None}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Name) and node.id == "strat":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} strat")
            if isinstance(node, ast.arg) and node.arg in short and node.annotation is not None:
                kind = ast.unparse(node.annotation)
                if kind == short[node.arg]:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.arg}: {kind}")
    assert not found, found


def test_a_strategys_own_keys_are_read_by_the_strategy_modules_alone():
    """The case holds the run flat and a strategy file's own keys in one group (``PlanInput.options``:
    ``StrategyOptions``), beside the loop's switches (``PlanInput.loop``); outside ``plan/model/strategies/`` no
    module reads ``.options.<key>``: it asks the strategy object."""
    from dataclasses import fields

    from tunelab.plan.model.case import LoopFeatures, PlanInput, StrategyOptions

    flat = {f.name for f in fields(PlanInput)}
    grouped = {f.name for f in fields(StrategyOptions)} | {f.name for f in fields(LoopFeatures)}
    assert not flat & grouped and {"options", "loop"} <= flat
    case = PlanInput.of(config=None, zero_stage=2, fabric=False, micro_batch_size=3)
    assert (case.options.zero_stage, case.loop.fabric, case.micro_batch_size) == (2, False, 3)
    changed = case.changed(sharding="NO_SHARD", micro_batch_size=4)
    assert (changed.options.zero_stage, changed.options.sharding, changed.micro_batch_size) == (2, "NO_SHARD", 4)
    keys = {f.name for f in fields(StrategyOptions)}
    readers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "plan/model/strategies/" in path.relative_to(ROOT).as_posix():
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in keys and isinstance(node.value, ast.Attribute):
                if node.value.attr == "options":
                    readers.append(f"{path.relative_to(ROOT)}:{node.lineno} .options.{node.attr}")
    assert not readers, readers


def test_the_training_loop_imports_nothing_of_the_planner():
    """Each rank runs ``tunelab.run.loop``: what it trains with (a strategy file's keys, the bitsandbytes optimizer a
    key names) comes from the core (``tunelab.strategies``), never from the planner, at any import level."""
    planned = [m for m, _ in imports(PACKAGE / "run" / "loop.py", all_levels=True) if m.startswith("tunelab.plan")]
    assert not planned, planned


def test_the_wheel_lists_every_package_of_the_tree():
    """`pip install .` builds the packages pyproject.toml names, no more: a package directory left out is missing
    from the wheel (the planner's model and tracer were, until a slow test installed one). The slow test
    tests/e2e/test_packaging.py installs the wheel; this one keeps the list whole in CI's run."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    tree = {".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "tunelab").rglob("__init__.py")}
    assert tree <= listed, sorted(tree - listed)
