"""The recipe registry: every ``recipes/<model>/<method>.yaml``, read from the files themselves.

A recipe is a complete LitGPT config file, ours or any other (litgpt's config_hub, the lab's originals). Its method
comes from its contents (``quantize`` -> QLoRA, ``lora_*`` keys -> LoRA, else full) and names the litgpt command
that runs it; a file name that contradicts the contents (a full config saved as ``lora.yaml``) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tunelab import settings, yaml_input
from tunelab.errors import InputError
from tunelab.paths import RECIPES_DIR, display_path

COMMANDS = {
    "full": "finetune_full",
    "lora": "finetune_lora",
    "qlora": "finetune_lora",
    "adapter": "finetune_adapter",
    "adapter_v2": "finetune_adapter_v2",
}
"""Recipe method -> the ``litgpt`` subcommand that runs it."""


class RecipeError(InputError):
    """A recipe reference that names no recipe file, or a file that is not a recipe."""


@dataclass
class Recipe:
    """One recipe file and what its keys say."""

    path: Path
    """The YAML file."""
    config: dict
    """Its keys as written (no litgpt defaults applied: ``tunelab validate`` resolves those)."""

    @property
    def key(self) -> str:
        """``<model>/<method>`` for files under recipes/, else the path as given."""
        try:
            rel = self.path.resolve().relative_to(RECIPES_DIR)
            return str(rel.with_suffix(""))
        except ValueError:
            return str(self.path)

    def slug(self) -> str:
        """A directory name for this recipe's runs: ``<model>-<method>`` (a recipe outside recipes/ included: its
        folder and file stem, never a leading '-' or a path)."""
        return f"{self.path.parent.name or 'recipe'}-{self.path.stem}".lstrip("-.") or "recipe"

    @property
    def shipped(self) -> bool:
        """Whether the file is one of recipes/ (the suite runs litgpt's parser on each of them)."""
        return self.path.resolve().is_relative_to(RECIPES_DIR)

    @property
    def model(self) -> str:
        return self.path.parent.name

    @property
    def method(self) -> str:
        """full, lora, qlora, adapter or adapter_v2: from the file's contents (quantize -> qlora, lora_* keys ->
        lora), else from its name (adapter files have no keys of their own), else full. See :func:`load`."""
        return method_of(self.config, self.path.stem)

    @property
    def command(self) -> str:
        """The litgpt subcommand, e.g. ``finetune_lora``."""
        return COMMANDS[self.method]

    def get(self, dotted: str, default=None):
        """A value of the file by dotted key (:func:`tunelab.settings.dotted`)."""
        return settings.dotted(self.config, dotted, default)

    def summary(self) -> dict:
        """The row ``tunelab ls`` prints (litgpt's defaults applied: see tunelab.settings)."""
        s = settings.resolve(self)
        return {
            "recipe": self.key,
            "model": self.model,
            "method": self.method,
            "precision": s.precision,
            "quantize": s.quantize or "-",
            "micro": s.micro_batch_size,
            "global": s.global_batch_size,
            "accum": s.accumulation,
            "devices": s.devices,
            "nodes": s.num_nodes,
        }

    def launch_command(self) -> str:
        return f"litgpt {self.command} --config {display_path(self.path)}"

    def tiny_command(self) -> str:
        """The launch command on the embedded tiny model, on a CPU, for two steps (litgpt takes the checkpoint
        directory as its positional argument, after the options)."""
        extra = " --quantize null" if self.get("quantize") else ""  # bitsandbytes' 4-bit layers need a CUDA GPU
        return (
            f"{self.launch_command()} --precision 32-true --devices 1 --train.max_steps 2 "
            f"--data.num_workers 0{extra} $(tunelab build-model tiny)"
        )

    def download_command(self) -> str | None:
        ckpt = self.get("checkpoint_dir")
        if not ckpt:
            return None
        parts = Path(ckpt).parts
        repo = "/".join(parts[1:]) if parts and parts[0] == "checkpoints" else str(ckpt)
        return f"litgpt download {repo}"


def load(path: Path) -> Recipe:
    """The recipe in ``path``; RecipeError when it is not a YAML mapping or its name contradicts its contents."""
    path = Path(path)
    try:
        config = yaml_input.load_file(path, display_path(path))
    except InputError as e:
        raise RecipeError(str(e)) from None
    if not isinstance(config, dict):
        raise RecipeError(
            f"{display_path(path)}: a recipe is a YAML mapping of litgpt arguments, got {type(config).__name__}; "
            "fix: give a recipe (a key such as tiny-llama-1.1b/lora, or a litgpt YAML; `tunelab ls` lists them)"
        )
    if "name" in config and ("rows" in config or "grid" in config):  # a sweep file: rows or a grid of runs
        raise RecipeError(
            f"{display_path(path)}: a sweep file (name: {str(config['name'])[:40]}), not a recipe; fix: run it with "
            f"`tunelab sweep {display_path(path)}`, or give a recipe (a key such as tiny-llama-1.1b/lora)"
        )
    if "name" in config and "checkpoint_dir" not in config:  # litgpt takes no `name`; a strategy file has one
        raise RecipeError(
            f"{display_path(path)}: a strategy file (name: {str(config['name'])[:40]}), not a recipe; fix: give a "
            f"recipe (a key such as tiny-llama-1.1b/lora, or a litgpt YAML) and this file as --strategy "
            f"{display_path(path)}"
        )
    recipe = Recipe(path=path, config=config)
    named, content = path.stem.split("-")[0], method_of(config, "")
    if named in COMMANDS and not _name_agrees(named, content):
        raise RecipeError(
            f"{display_path(path)}: the file is named {named} but holds a {content} config "
            f"({_why(content)}); fix: rename it {content}.yaml, or give it the keys of a {named} config"
        )
    return recipe


def method_of(config: dict, stem: str = "") -> str:
    """The fine-tuning method a litgpt config describes, from its keys: ``quantize`` set -> qlora, any ``lora_*``
    key -> lora; otherwise the file name's method when it names an adapter (adapter configs have no keys of their
    own), else full."""
    if config.get("quantize"):
        return "qlora"
    if any(str(k).startswith("lora_") for k in config):
        return "lora"
    named = stem.split("-")[0]
    return named if named in ("adapter", "adapter_v2") else "full"


def _name_agrees(named: str, content: str) -> bool:
    if named in ("adapter", "adapter_v2"):
        return content in ("full", "adapter", "adapter_v2", "qlora")  # adapters may quantize as well
    return named == content or (named == "lora" and content == "qlora")  # QLoRA is LoRA with quantize


def _why(content: str) -> str:
    return {"qlora": "quantize is set", "lora": "it has lora_* keys", "full": "no lora_* key and no quantize"}.get(
        content, content
    )


def discover(root: Path = RECIPES_DIR) -> list[Recipe]:
    """Every recipe under ``recipes/``, sorted by model then method."""
    return [load(p) for p in sorted(root.glob("*/*.yaml"))]


def resolve(ref: str) -> Recipe:
    """A recipe from a path (``recipes/open-llama-7b/lora.yaml``) or a key (``open-llama-7b/lora``)."""
    candidates = [Path(ref), RECIPES_DIR / ref, RECIPES_DIR / f"{ref}.yaml"]
    for c in candidates:
        if c.is_file() or (c is candidates[0] and c.exists() and not c.is_dir()):  # a FIFO, a device: the reader
            return load(c)  # refuses it by name
    known = ", ".join(r.key for r in discover())
    raise RecipeError(f"no recipe {ref!r}; fix: give a YAML path or one of: {known}")
