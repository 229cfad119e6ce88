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


def test_nesting_past_the_depth_cap_is_refused_with_its_line():
    """Python's recursion limit would end the parse in a RecursionError: the loader refuses past MAX_DEPTH, naming
    the line; a file at the cap still reads."""
    from tunelab import yaml_input
    from tunelab.errors import InputError

    at_cap = "[" * yaml_input.MAX_DEPTH + "]" * yaml_input.MAX_DEPTH
    assert yaml_input.loads(f"a: 1\nb: {at_cap[1:-1]}\n", "x.yaml")["a"] == 1
    with pytest.raises(InputError, match=r"x.yaml:3: nested more than 64 levels deep; fix:"):
        yaml_input.loads("a: 1\nb:\n  c: " + "[" * 5000 + "]" * 5000 + "\n", "x.yaml")


def test_an_error_line_keeps_its_start_and_its_fix(capsys):
    """A value of thousands of characters echoed back in a refusal is elided in the middle, the fix kept."""
    from tunelab.cli.common import MESSAGE_MAX, fail

    assert fail("k: " + "x" * 10_000 + "; fix: shorten it") == 2
    err = capsys.readouterr().err
    assert len(err) < MESSAGE_MAX + 100 and err.startswith("tunelab: error: k: xxx")
    assert err.rstrip().endswith("; fix: shorten it") and "[... 8,020 characters ...]" in err
    fail("short; fix: none")
    assert capsys.readouterr().err == "tunelab: error: short; fix: none\n"


@pytest.mark.parametrize(
    ("where", "args", "text"),
    [
        ("strategy", ["plan", "tiny-llama-1.1b/lora", "--devices", 2, "--strategy"], "name: fsdp\n1: x\nfoo: y\n"),
        ("sweep", ["sweep"], "name: s\n1: x\nfoo: y\nrows: []\n"),
        ("recipe", ["plan"], "on: 1\n"),
    ],
)
def test_a_key_yaml_reads_as_a_number_or_a_boolean_is_one_line_naming_its_line(tmp_path, where, args, text):
    """``1:`` or ``on:`` is a number or a boolean to YAML, never a key tunelab or litgpt has: a strategy or sweep file
    holding one beside a name ended in "TypeError: '<' not supported between 'str' and 'int'" (unexpected) where the
    unknown keys were sorted; every file tunelab reads now refuses it at its line."""
    from tests.conftest import tunelab_here

    path = tmp_path / f"{where}.yaml"
    path.write_text(text)
    code, out, err = tunelab_here(*args, str(path))
    line = next(n for n, row in enumerate(text.splitlines(), 1) if row.split(":")[0] in ("1", "on"))
    assert code == 2 and len(err.splitlines()) == 1 and f"{where}.yaml:{line}: key " in err, (out, err)
    assert "not a name; fix: quote it" in err and "unexpected" not in err, err
