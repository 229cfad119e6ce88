"""The commands the project prints for a user to type, read from where they are printed, and the CPU variants the
tests run instead where this 2-core machine without a GPU or a model hub cannot run them as printed.

Printed in: the code blocks of the README and of ``docs/*.md`` (``bash`` lines, ``$ `` lines of ``text`` blocks), the
examples of
``tunelab --help`` and of each subcommand's ``--help``, each recipe's header (Download, Launch, Override, Check)
and the lines ``tunelab show`` adds after the file (download, launch, the tiny-model CPU command).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT


@dataclass(frozen=True)
class Printed:
    source: str
    """Where a user reads it: README.md, tunelab --help, tunelab <command> --help, <recipe file> header,
    tunelab show <recipe>."""
    command: str
    """As printed, comments and line continuations removed; one command per `&&`."""


def _strip_comment(line: str) -> str:
    return re.split(r"\s+#\s", line, maxsplit=1)[0].strip()


def _commands(line: str) -> list[str]:
    return [" ".join(part.split()) for part in _strip_comment(line).split("&&") if part.strip()]


DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
"""The pages a user reads commands from."""


def readme() -> list[Printed]:
    """The commands of the README's and the docs' code blocks."""
    found = []
    for page in DOCS:
        text = (ROOT / page).read_text()
        for lang, body in re.findall(r"^[ \t]*```(\w*)\n(.*?)^[ \t]*```", text, re.M | re.S):
            for line in body.replace("\\\n", " ").splitlines():
                line = line.strip()
                if lang == "bash" and line and not line.startswith("#"):
                    found += [Printed(page, c) for c in _commands(line)]
                elif lang == "text" and line.startswith("$ "):
                    found += [Printed(page, c) for c in _commands(line[2:])]
    return found


def help_examples() -> list[Printed]:
    from tunelab.cli import build_parser

    parser = build_parser()
    parsers = [("tunelab --help", parser)]
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    parsers += [(f"tunelab {name} --help", p) for name, p in sub.choices.items()]
    found = []
    for source, p in parsers:
        epilog = p.epilog or ""
        if "examples:" not in epilog:
            continue
        for line in epilog.split("examples:", 1)[1].splitlines():
            if line.strip().startswith("tunelab "):
                found += [Printed(source, c) for c in _commands(line.strip())]
    return found


def recipe_headers() -> list[Printed]:
    from tunelab.recipes import discover

    found = []
    for recipe in discover():
        rel = recipe.path.relative_to(ROOT)
        for key, command in re.findall(r"^# (Download|Launch|Override|Check):\s+(.+)$", recipe.path.read_text(), re.M):
            found.append(Printed(f"{rel} header ({key})", command.strip()))
    return found


def show_lines() -> list[Printed]:
    from tunelab import cli
    from tunelab.recipes import discover

    found = []
    for recipe in discover():
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert cli.main(["show", recipe.key]) == 0
        for line in buf.getvalue().splitlines():
            m = re.match(r"# (download|launch|on the tiny model \(CPU\)):\s+(.+?)(\s{3}\(.*\))?$", line)
            if m:
                found.append(Printed(f"tunelab show {recipe.key} ({m.group(1)})", m.group(2).strip()))
    return found


def everything() -> list[Printed]:
    return readme() + help_examples() + recipe_headers() + show_lines()


TINY_CHECKPOINT = re.compile(r'"?\$\(tunelab build-model tiny\)"?')
"""How a printed command names the embedded tiny checkpoint (a shell substitution of `tunelab build-model tiny`)."""


def split(command: str, ckpt: Path | str = "TINY_CHECKPOINT") -> list[str]:
    """A printed command's words, as the shell would pass them, with ``ckpt`` for ``$(tunelab build-model tiny)``
    (the same command, run once by the tests' fixture)."""
    return shlex.split(TINY_CHECKPOINT.sub(shlex.quote(str(ckpt)), command))


def tiny_training_argv(command: str, ckpt: Path, out_dir: Path) -> list[str]:
    """A printed `litgpt finetune_* ...` line as the tests run it on CPU: the embedded tiny checkpoint in place of
    ``$(tunelab build-model tiny)``, its output under ``out_dir`` instead of the recipe's ``out/``, and validation
    cut to 2 batches. Returns the argv after ``litgpt``."""
    argv = split(command, ckpt)
    assert argv[0] == "litgpt" and not any("$(" in a for a in argv), command
    return [*argv[1:], "--out_dir", str(out_dir), "--eval.max_iters", "2"]
