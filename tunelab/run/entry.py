"""``python -m tunelab.run.entry <litgpt args>``: litgpt's own CLI, run in-process, that leaves per-rank figures at
exit.

The training loop stays litgpt's: this module only observes. It wraps ``litgpt.utils.CycleIterator.__next__`` to
note, per micro batch, its start time and its padded and real token counts, and litgpt's validation, samples and
step saves inside ``fit`` to note them as pauses; at exit (normal, exception or ``sys.exit``) it writes
``rank<N>.json`` into ``$TUNELAB_STATS_DIR``: the allocator's peaks and retries, the peak at each phase, the matmul
precision, the exception if any, and the iteration log. Random-weight benchmark runs can skip litgpt's saves and merge
(``TUNELAB_SKIP_SAVE=1``). docs/records.md."""

from __future__ import annotations

import atexit
import functools
import importlib
import os
import sys
import time
import traceback

from tunelab.run import memory_history, rank_stats


def _install_iterator_probe() -> None:
    from litgpt import utils

    original = utils.CycleIterator.__next__

    def __next__(self):
        rank_stats.note_phase("loaded")  # model, optimizer (and quantization) are in place before the first batch
        memory_history.mark_first_batch()
        t = time.monotonic()
        batch = original(self)
        try:
            padded = int(batch["input_ids"].numel())
            real = int(batch["token_counts"]["raw_plus_prompt_template"].sum())
        except (KeyError, TypeError, AttributeError):
            padded, real = -1, -1
        rank_stats.record_iteration(t, padded, real)
        return batch

    utils.CycleIterator.__next__ = __next__


FINETUNE_MODULES = (
    "litgpt.finetune.full",
    "litgpt.finetune.lora",
    "litgpt.finetune.adapter",
    "litgpt.finetune.adapter_v2",
)
"""litgpt's finetune scripts, whose ``fit`` the pause probes watch."""
PAUSING = (
    "validate",
    "generate_example",
    "save_lora_checkpoint",
    "save_adapter_checkpoint",
    "save_adapter_v2_checkpoint",
)
"""What litgpt's ``fit`` does between micro batches besides training (a step's checkpoint: these, or
``Fabric.save`` for full fine-tuning)."""


def _finetune_modules() -> list:
    """litgpt's finetune scripts this litgpt has (:data:`FINETUNE_MODULES`), imported."""
    out = []
    for module in FINETUNE_MODULES:
        try:
            out.append(importlib.import_module(module))
        except ImportError:
            continue
    return out


def _install_pause_probes() -> None:
    """Time validation, the generated sample and step checkpoints inside litgpt's ``fit``, once iterations have
    begun, as pauses of the iteration they interrupt (:func:`tunelab.run.rank_stats.note_pause`): the steady window
    then holds training alone, as tunelab's loop records it. Each pause begins and ends synchronised with the device
    (the training work queued before it stays the iteration's). What runs outside ``fit`` (the final validation and
    save) or before the first batch (the initial validation) is no pause of the loop."""
    import lightning.fabric
    import torch

    state = {"fit": False, "inside": False}

    def synchronise() -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def pausing(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not state["fit"] or state["inside"] or not rank_stats.iterations_begun():
                return fn(*args, **kwargs)
            state["inside"] = True  # one pause, whatever it calls of the others
            synchronise()
            t0 = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                synchronise()
                rank_stats.note_pause(t0, time.monotonic())
                state["inside"] = False

        return wrapper

    def fitting(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            state["fit"] = True
            try:
                return fn(*args, **kwargs)
            finally:
                state["fit"] = False

        return wrapper

    lightning.fabric.Fabric.save = pausing(lightning.fabric.Fabric.save)
    for mod in _finetune_modules():
        for name in (n for n in PAUSING if hasattr(mod, n)):
            setattr(mod, name, pausing(getattr(mod, name)))
        if hasattr(mod, "fit"):
            mod.fit = fitting(mod.fit)


SKIP_SAVE_ENV = "TUNELAB_SKIP_SAVE"
"""Set to 1 (tunelab does for random-weight runs) to skip litgpt's checkpoint saves and the LoRA merge: of random
weights they are worthless, take 2-26 GB of disk and up to a minute per run. Training is untouched; litgpt's
Training Time and Tok/sec are measured before the final save anyway."""


def _skip_saves() -> None:
    import lightning.fabric

    def no_save(self, path, state, filter=None):  # noqa: A002 - Fabric.save's signature
        print(f"tunelab: checkpoint save skipped ({SKIP_SAVE_ENV}=1): {path}", flush=True)

    lightning.fabric.Fabric.save = no_save
    for mod in _finetune_modules():
        if hasattr(mod, "merge_lora"):
            mod.merge_lora = lambda *a, **k: print("tunelab: LoRA merge skipped", flush=True)


def _write_memory_history() -> None:
    out_dir = os.environ.get("TUNELAB_STATS_DIR")
    if out_dir:
        memory_history.write(out_dir, rank_stats.global_rank())


def main() -> None:
    """Run litgpt's CLI on this process's arguments, recording this rank's figures at exit."""
    rank_stats.die_with_parent()
    os.environ.setdefault("JSONARGPARSE_DEPRECATION_WARNINGS", "off")
    sys.excepthook = rank_stats.excepthook
    atexit.register(rank_stats.write)
    memory_history.start()  # opt-in (TUNELAB_MEMORY_HISTORY=1): what is alive at the peaks, written at exit
    atexit.register(_write_memory_history)  # atexit runs last-registered first: before rank<N>.json
    _install_iterator_probe()
    rank_stats.install_step_hook()
    from tunelab.run.outputs import install_atomic_writes

    install_atomic_writes()  # every file litgpt leaves: a temporary name, fsynced, renamed; never through a link
    if os.environ.get(SKIP_SAVE_ENV) == "1":
        _skip_saves()
    _install_pause_probes()  # after _skip_saves: a skipped step save is a pause too, of no length
    from litgpt.__main__ import main as litgpt_main

    try:
        litgpt_main()  # parses sys.argv[1:], exactly as the `litgpt` command does
    except SystemExit:
        raise
    except BaseException as e:  # record, then let Python print and exit as usual
        rank_stats.record_exception(e)
        traceback.print_exc()
        sys.exit(1)


if __name__ == "__main__":
    main()
