"""What tunelab's loop (:mod:`tunelab.run.loop`) leaves beside its metrics, as ``litgpt finetune_*`` leaves it, so that
``litgpt generate``, ``chat``, ``merge_lora`` and ``evaluate`` load a model trained under ``--strategy``:

* full fine-tuning: ``<out_dir>/final/lit_model.pth`` (``{"model": state_dict}``) and, every ``train.save_interval``
  optimizer steps, ``<out_dir>/step-<NNNNNN>/lit_model.pth`` with the optimizer and scheduler states, iteration and
  step (litgpt's ``state``);
* LoRA: ``lit_model.pth.lora`` (the adapters only) in the same places; at the end litgpt's own ``merge_lora`` writes
  the merged ``final/lit_model.pth``;
* beside each: the checkpoint's config and tokenizer files (litgpt's ``copy_config_files``), ``hyperparameters.yaml``
  (the run's resolved arguments: what ``merge_lora`` reads) and ``prompt_style.yaml`` (litgpt's ``save_prompt_style``).

Every file is written to a temporary name in its directory and renamed into place: a run killed or a disk filled
mid-save leaves the previous file whole, never a truncated checkpoint under the final name. The full state dict
of a sharded model is gathered first (``torch.distributed.checkpoint.state_dict``; DeepSpeed ZeRO-3 through its
16-bit consolidation) and written by rank 0.

:func:`generate_example` is litgpt's sample generation after a validation (its ``generate`` on the
``eval.evaluate_example`` instruction), run eagerly.
"""

from __future__ import annotations

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


def write_side_files(directory: Path, args: dict, prompt_style) -> None:
    """litgpt's files beside a checkpoint: the base checkpoint's config and tokenizer files, the run's arguments as
    ``hyperparameters.yaml``, the prompt style (rank 0 only)."""
    from litgpt.prompts import save_prompt_style
    from litgpt.utils import copy_config_files

    copy_config_files(Path(args["checkpoint_dir"]), directory)
    files.write_text_atomic(directory / "hyperparameters.yaml", yaml.safe_dump(_plain(args), sort_keys=False))
    save_prompt_style(prompt_style, directory)


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
    """litgpt's ``merge_lora``: the base checkpoint plus the adapters into ``final_dir/lit_model.pth``."""
    from litgpt.scripts.merge_lora import merge_lora

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
