"""Reading YAML that a user wrote: plain data only, bounded, and one line with file:line when it is wrong.

PyYAML's SafeLoader builds only plain types (no Python objects), but it expands aliases: a few hundred bytes of
nested ``*a`` references (the "billion laughs") grow into gigabytes before anything can check them. tunelab's
files (recipes, sweeps, strategies, the GPU table, model_config.yaml) never need aliases, so they are refused
when they are read, before any expansion. A key given twice in one mapping is refused too (PyYAML keeps the last).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from tunelab import files
from tunelab.errors import InputError

MAX_BYTES = 4 * 2**20
"""Largest YAML file read (4 MiB: every tunelab file is a few KiB; litgpt's own configs are under 10 KiB)."""

MAX_DEPTH = 64
"""Deepest nesting of mappings and lists read (tunelab's files and litgpt's configs nest five levels at most); a
deeper file would exhaust PyYAML's recursion before any check could name the line."""


class _PlainLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases (the only way a small YAML file becomes a large object), a key given twice
    in one mapping (PyYAML keeps the last without a word: a table row or a setting silently replaced), a key that is
    not text (a number, a boolean such as ``on``, null: the checks that list and sort keys assume names) and nesting
    deeper than :data:`MAX_DEPTH`."""

    depth = 0

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):  # every tunelab and litgpt key is a name; `on:`, `1:` or `null:` is not
                raise InputError(
                    f"{self.name}:{key_node.start_mark.line + 1}: key {str(key_node.value)[:40]!r} is read as "
                    f'{type(key).__name__}, not a name; fix: quote it ("{str(key_node.value)[:40]}":) or rename it'
                )
            if key in seen:
                raise InputError(
                    f"{self.name}:{key_node.start_mark.line + 1}: key {key!r} is given twice in one mapping "
                    f"(first at line {seen[key]}); fix: keep one"
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise InputError(
                f"{self.name}:{event.start_mark.line + 1}: YAML alias *{event.anchor} is not accepted "
                "(aliases can expand a small file into gigabytes); fix: write the value out in full"
            )
        if self.depth >= MAX_DEPTH:
            raise InputError(
                f"{self.name}:{self.peek_event().start_mark.line + 1}: nested more than {MAX_DEPTH} levels deep; "
                "fix: flatten it (tunelab's files nest a few levels)"
            )
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _code(ch) -> str:
    return f"U+{ch if isinstance(ch, int) else ord(ch[:1] or ' '):04X}"


def loads(text: str, name: str = "<text>"):
    """Parse YAML text into plain data; InputError naming ``name:line`` if it is not valid or uses aliases."""
    try:
        loader = _PlainLoader(text)  # the reader checks every character here: a control character fails now
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        raise InputError(
            f"{name}:{line}: not valid YAML (character {_code(e.character)} is not allowed in YAML text); "
            "fix: remove the control character"
        ) from None
    loader.name = name
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as e:
        mark = e.context_mark or e.problem_mark  # where the broken construct starts, if known
        where = f"{name}:{mark.line + 1}" if mark else name
        what = " ".join(x for x in (e.context, e.problem) if x)
        fix = (
            "remove the tag: tunelab files hold plain data only"
            if "for the tag" in what
            else "correct the syntax there"
        )
        raise InputError(f"{where}: not valid YAML ({what}); fix: {fix}") from None
    except yaml.YAMLError as e:
        raise InputError(f"{name}: not valid YAML ({str(e).splitlines()[0]}); fix: correct the syntax") from None
    finally:
        loader.dispose()


def load_file(path: Path | str, shown: str | None = None):
    """Read and parse a YAML file (see :func:`loads`): a regular file of at most :data:`MAX_BYTES`, UTF-8 text
    (:func:`tunelab.files.read_text`); InputError otherwise."""
    return loads(files.read_text(path, MAX_BYTES, "YAML file", shown or str(path)), shown or str(path))


def load_mapping(path: Path | str, what: str, shown: str | None = None) -> dict:
    """A YAML file that must hold a mapping (empty file: {})."""
    shown = shown or str(path)
    data = load_file(path, shown)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(
            f"{shown}: {what} is a YAML mapping of keys to values, got a {type(data).__name__}; "
            "fix: write `key: value` lines"
        )
    return data
