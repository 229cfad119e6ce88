"""Bad input, tried as a hostile but realistic user would, against the real ``tunelab`` CLI as subprocesses: every
case is refused in one line with a non-zero exit, names what is wrong, and prints no Python traceback; nothing
from a file runs as code; nothing is written outside the output directory.

The cases run a few at a time (each is its own process: the exit code and the output are the real ones).
"""

from __future__ import annotations

import time

import pytest


def test_alias_bomb_is_refused_before_it_grows():
    """The loader refuses the first alias: a 30-level bomb (9**29 elements) is refused at once."""
    from tunelab import yaml_input
    from tunelab.errors import InputError

    bomb = "a0: &a0 [1, 1]\n" + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 30))
    t0 = time.process_time()
    with pytest.raises(InputError, match=r"x.yaml:2: YAML alias \*a0 is not accepted"):
        yaml_input.loads(bomb, "x.yaml")
    assert time.process_time() - t0 < 1.0
