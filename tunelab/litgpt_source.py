"""What litgpt's own source says its defaults are, read without importing litgpt's training code: the arguments
of a ``finetune_*`` command's ``setup``, the fields of its argument dataclasses (``TrainArgs``, ...) and of a data
module's class (``litgpt.data.Alpaca2k`` and the classes it extends), each parsed with :mod:`ast` from the installed
package's files (nothing executed). A leaf of the core (it imports only tunelab.errors), so the data stage and the
settings both read it."""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path

from tunelab.errors import InputError


def source(relative: str) -> Path:
    """A file of the installed litgpt package (``args.py``, ``finetune/lora.py``)."""
    spec = importlib.util.find_spec("litgpt")
    return Path(next(iter(spec.submodule_search_locations))) / relative


@cache
def dataclass_defaults(cls_name: str) -> dict:
    """Field defaults of one of litgpt's argument dataclasses (``TrainArgs``, ``EvalArgs``, ``LogArgs``)."""
    tree = ast.parse(source("args.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            return {
                stmt.target.id: literal(stmt.value)
                for stmt in node.body
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value
            }
    raise InputError(f"litgpt's args.py has no {cls_name}: is the pinned litgpt installed?")


def literal(node):
    """A default's value from its AST node: a literal, an argument dataclass call (its defaults updated by the
    call's keywords), ``Path(...)`` as its text; None for anything else."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.endswith("Args"):
        values = dict(dataclass_defaults(node.func.id))
        values.update({kw.arg: literal(kw.value) for kw in node.keywords})
        return values
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Path" and node.args:
        return literal(node.args[0])
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


@cache
def command_defaults(command: str) -> dict:
    """The defaults of ``litgpt <command>``'s ``setup`` arguments (``finetune_full``, ``finetune_lora``, ...), cached:
    callers copy before changing them."""
    module = {
        "finetune_full": "full",
        "finetune_lora": "lora",
        "finetune_adapter": "adapter",
        "finetune_adapter_v2": "adapter_v2",
    }[command]
    tree = ast.parse(source(f"finetune/{module}.py").read_text(encoding="utf-8"))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "setup")
    a = fn.args
    defaults = [None] * (len(a.args) - len(a.defaults)) + list(a.defaults)
    return {arg.arg: (literal(d) if d is not None else None) for arg, d in zip(a.args, defaults)}


@cache
def data_classes() -> frozenset[str]:
    """The names ``litgpt.data`` exports (its data modules and their helpers), read from its ``__init__.py``."""
    init = ast.parse(source("data/__init__.py").read_text(encoding="utf-8"))
    return frozenset(alias.name for node in init.body if isinstance(node, ast.ImportFrom) for alias in node.names)


@cache
def data_defaults(class_path: str) -> dict:
    """The constructor arguments of a litgpt data module with their defaults (``litgpt.data.Alpaca2k`` ->
    {'val_split_fraction': 0.05, ...}), read from litgpt's source; {} for a class outside litgpt.data."""
    module, _, cls = class_path.rpartition(".")
    if module != "litgpt.data":
        return {}
    init = ast.parse(source("data/__init__.py").read_text(encoding="utf-8"))
    where = {alias.name: node.module for node in init.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    return class_fields(where.get(cls), cls) if where.get(cls) else {}


def class_fields(module: str, cls: str) -> dict:
    """A litgpt data class's constructor fields with their defaults, its bases' first."""
    tree = ast.parse(source(module.replace("litgpt.", "", 1).replace(".", "/") + ".py").read_text(encoding="utf-8"))
    imported = {
        alias.asname or alias.name: node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("litgpt.data")
        for alias in node.names
    }
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
    if node is None:
        return {}
    out = {}
    for base in node.bases:  # inherited fields first (Alpaca2k extends Alpaca)
        if isinstance(base, ast.Name) and base.id in imported and base.id != "DataModule":
            out.update(class_fields(imported[base.id], base.id))
        elif isinstance(base, ast.Name) and any(isinstance(n, ast.ClassDef) and n.name == base.id for n in tree.body):
            out.update(class_fields(module, base.id))
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        value = stmt.value
        if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
            kw = {k.arg: k.value for k in value.keywords}
            if isinstance(kw.get("init"), ast.Constant) and kw["init"].value is False:
                continue
            value = kw.get("default")
        out[stmt.target.id] = literal(value) if value is not None else None
    return out
