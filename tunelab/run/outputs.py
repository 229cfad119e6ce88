"""What tunelab's loop (:mod:`tunelab.run.loop`) leaves beside its metrics, as ``litgpt finetune_*`` leaves it, so that
``litgpt generate``, ``chat``, ``merge_lora`` and ``evaluate`` load a model trained under ``--strategy``.

Full fine-tuning: ``final/lit_model.pth`` and, every ``train.save_interval`` optimizer steps,
``step-<NNNNNN>/lit_model.pth`` with the optimizer and scheduler states, iteration and step; LoRA: the adapters
(``lit_model.pth.lora``) in the same places, then litgpt's own ``merge_lora`` for the merged model; beside each the
checkpoint's config and tokenizer files and the run's hyperparameters. Written atomically
(:mod:`tunelab.files`): a crash leaves the last whole checkpoint, never a torn one."""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

import torch
import torch.distributed as dist
import yaml

from tunelab import files


def full_state_dict(model, engine=None, sharded: bool = False) -> dict[str, torch.Tensor] | None:
    """The whole model's state dict on the CPU, on rank 0 (None on the other ranks), gathered from any strategy
    (``sharded``: FSDP1 or FSDP2). Every rank must call it (the gather is a collective under sharding)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    if engine is not None:  # DeepSpeed: ZeRO-3 partitions the parameters, stages 1-2 keep them whole
        if getattr(engine, "zero_optimization_stage", lambda: 0)() == 3:
            sd = engine._zero3_consolidated_16bit_state_dict()
        else:
            sd = engine.module.state_dict()
    elif sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        on_gpu = any(p.is_cuda for p in model.parameters())  # offloading CPU tensors crashes FSDP1's gather (gloo)
        sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=on_gpu))
    else:
        sd = getattr(model, "module", model).state_dict()
    if rank != 0 or sd is None:
        return None
    return {_plain_key(k): v.detach().cpu() for k, v in sd.items()}


def _plain_key(key: str) -> str:
    """A state-dict key without the wrappers' prefixes (DDP's ``module.``, activation checkpointing's
    ``_checkpoint_wrapped_module.``, FSDP1's ``_fsdp_wrapped_module.``, torch.compile's ``_orig_mod.``)."""
    for part in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod."):
        key = key.replace(part, "")
    return key.removeprefix("module.")


def _plain(value):
    """Resolved litgpt arguments as YAML-safe values (paths as strings)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _folder(directory: Path) -> Path:
    """``directory``, made if missing, refused (:class:`tunelab.files.FileRefused`) when it or what is in its place
    is a link or not a folder: nothing is written through it."""
    directory = Path(directory)
    if directory.is_symlink() or (directory.exists() and not directory.is_dir()):
        raise files.FileRefused(
            f"{directory}: is not a folder (a link or a file); tunelab never writes through links; fix: remove it"
        )
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def staged(directory: Path, write) -> list[Path]:
    """``write(folder)`` (a litgpt helper that writes files in place) into a private folder beside ``directory``;
    each file it made is fsynced and renamed into ``directory``, never through a link: a kill or a full disk leaves
    every file whole or as it was. Returns the files placed."""
    directory = _folder(directory)
    stage = Path(tempfile.mkdtemp(prefix=".tunelab-stage-", dir=directory))
    placed = []
    try:
        write(stage)
        for made in sorted(stage.iterdir()):
            fd = os.open(made, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            target = files.check_target(directory / made.name)
            os.replace(made, target)
            placed.append(target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return placed


def copy_config_files(source_dir: Path, out_dir: Path) -> None:
    """litgpt's ``copy_config_files`` (the base checkpoint's config and tokenizer files), atomically (:func:`staged`)."""
    staged(out_dir, lambda stage: _litgpt("copy_config_files")(Path(source_dir), stage))


def save_prompt_style(style, checkpoint_dir: Path) -> None:
    """litgpt's ``save_prompt_style`` (``prompt_style.yaml``), atomically (:func:`staged`)."""
    staged(checkpoint_dir, lambda stage: _litgpt("save_prompt_style")(style, stage))


def save_hyperparameters(function, checkpoint_dir: Path, known_commands=None) -> None:
    """litgpt's ``save_hyperparameters`` (``hyperparameters.yaml``: the command line as parsed), atomically."""
    staged(checkpoint_dir, lambda stage: _litgpt("save_hyperparameters")(function, stage, known_commands))


def atomic_torch_save(obj, path) -> None:
    """``torch.save(obj, path)`` through :func:`tunelab.files.write_atomic` (Lightning's ``_atomic_save`` truncates
    the target first and writes it in place)."""
    files.write_atomic(Path(path), lambda f: torch.save(obj, f))


class _TorchSavingAtomically:
    """torch, but ``save`` to a path goes through :func:`atomic_torch_save`: set as the ``torch`` of a module whose
    helper saves with a plain ``torch.save`` (litgpt's ``merge_lora``, Lightning's FSDP full state dict)."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def save(obj, f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)) and not args and not kwargs:
            return atomic_torch_save(obj, f)
        return torch.save(obj, f, *args, **kwargs)


_LITGPT: dict = {}
"""litgpt's own helpers, kept before :func:`install_atomic_writes` replaces them in litgpt's modules."""


def _litgpt(helper: str):
    """litgpt's own ``helper`` (as litgpt defines it, whatever has replaced it in its modules since)."""
    if not _LITGPT:
        from litgpt.parser_config import save_hyperparameters as litgpt_save_hyperparameters
        from litgpt.prompts import save_prompt_style as litgpt_save_prompt_style
        from litgpt.utils import copy_config_files as litgpt_copy_config_files

        _LITGPT.update(
            copy_config_files=litgpt_copy_config_files,
            save_prompt_style=litgpt_save_prompt_style,
            save_hyperparameters=litgpt_save_hyperparameters,
        )
    return _LITGPT[helper]


_HELPERS = {
    "copy_config_files": copy_config_files,
    "save_prompt_style": save_prompt_style,
    "save_hyperparameters": save_hyperparameters,
}
_LITGPT_MODULES = (
    "litgpt.utils",
    "litgpt.prompts",
    "litgpt.parser_config",
    "litgpt.finetune.full",
    "litgpt.finetune.lora",
    "litgpt.finetune.adapter",
    "litgpt.finetune.adapter_v2",
)


def install_atomic_writes() -> None:
    """Every file litgpt's finetune scripts leave is written atomically and never through a link: its helpers
    (config and tokenizer files, hyperparameters, prompt style) replaced in its modules by the staged ones above,
    Lightning's checkpoint writer and FSDP's full-state save, and ``merge_lora``'s ``torch.save``."""

    from lightning.fabric.plugins.io import torch_io
    from lightning.fabric.strategies import fsdp
    from litgpt.scripts import merge_lora

    for name in _LITGPT_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for helper, ours in _HELPERS.items():
            if getattr(module, helper, None) is _litgpt(helper):
                setattr(module, helper, ours)
    torch_io._atomic_save = atomic_torch_save
    fsdp.torch = merge_lora.torch = _TorchSavingAtomically()


def write_side_files(directory: Path, args: dict, prompt_style) -> None:
    """litgpt's files beside a checkpoint: the base checkpoint's config and tokenizer files, the run's arguments as
    ``hyperparameters.yaml``, the prompt style (rank 0 only); each atomically, never through a link."""
    copy_config_files(Path(args["checkpoint_dir"]), directory)
    files.write_text_atomic(directory / "hyperparameters.yaml", yaml.safe_dump(_plain(args), sort_keys=False))
    save_prompt_style(prompt_style, directory)


WEIGHT_FILES = ("lit_model.pth", "lit_model.pth.lora")
"""The weight files litgpt loads from a checkpoint folder (torch.save's zip archives)."""


def whole(final_dir: Path, method: str) -> str | None:
    """Why the final checkpoint a run left in ``final_dir`` is not what litgpt loads (None: it is): a weight file
    missing (full: ``lit_model.pth``; LoRA: the adapters and the merged model) or cut short (a torch.save archive
    without its closing directory), or the config it needs missing. Reads each archive's directory only."""
    final_dir = Path(final_dir)
    wanted = ["lit_model.pth"] if method == "full" else list(WEIGHT_FILES)
    for name in [*wanted, "model_config.yaml"]:
        path = final_dir / name
        if path.is_symlink() or not path.is_file():
            return f"{path}: missing (or not a regular file)"
        if name in WEIGHT_FILES:
            try:
                with zipfile.ZipFile(path):
                    pass
            except (zipfile.BadZipFile, OSError) as e:
                return f"{path}: not whole ({e}); the save was cut short"
    return None


def save(
    directory: Path,
    method: str,
    model,
    engine,
    args: dict,
    prompt_style,
    state: dict | None = None,
    sharded: bool = False,
) -> Path | None:
    """Save the model into ``directory`` as litgpt does: full -> ``lit_model.pth`` (with ``state``'s optimizer and
    scheduler when given), LoRA -> ``lit_model.pth.lora`` (adapters only). Returns the file (rank 0) or None."""
    sd = full_state_dict(model, engine, sharded)
    if sd is None:
        return None
    if method == "full":
        path = directory / "lit_model.pth"
        payload = {"model": sd, **(state or {})}
    else:
        path = directory / "lit_model.pth.lora"
        payload = {"model": {k: v for k, v in sd.items() if "lora_" in k}}
    files.write_atomic(path, lambda f: torch.save(payload, f))
    write_side_files(directory, args, prompt_style)
    return path


def merge(final_dir: Path, args: dict) -> None:
    """litgpt's ``merge_lora``: the base checkpoint plus the adapters into ``final_dir/lit_model.pth``, written
    atomically (:func:`install_atomic_writes`)."""
    from litgpt.scripts.merge_lora import merge_lora

    install_atomic_writes()
    merge_lora(
        checkpoint_dir=final_dir,
        pretrained_checkpoint_dir=Path(args["checkpoint_dir"]),
        precision=args.get("precision"),
    )


@torch.no_grad()
def generate_example(model, tokenizer, eval_args, data, device, dtype) -> str | None:
    """litgpt's sample after a validation: the ``eval.evaluate_example`` instruction in the data's prompt style,
    ``eval.max_new_tokens`` tokens at temperature 0.8, eagerly (compiled blocks are not recompiled for it).
    Returns the text, or None when prompt + new tokens exceed the model's sequence length (litgpt skips it too)."""
    from litgpt.generate.base import generate
    from litgpt.utils import select_sft_generate_example

    instruction = select_sft_generate_example(eval_args, data)
    encoded = tokenizer.encode(data.prompt_style.apply(instruction), device=device)
    max_returned = len(encoded) + eval_args.max_new_tokens
    if max_returned >= model.max_seq_length:
        return None
    model.eval()
    try:
        with torch.compiler.set_stance("force_eager"):
            model.set_kv_cache(batch_size=1, device=device, dtype=dtype)
            output = generate(
                model, encoded, max_returned_tokens=max_returned, temperature=0.8, eos_id=tokenizer.eos_id
            )
    finally:
        model.clear_kv_cache()
        model.train()
    return f"{instruction}\n{tokenizer.decode(output)}"
