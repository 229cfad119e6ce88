"""Build litgpt checkpoint directories offline: the embedded tiny model, or a real architecture with random weights.

A directory holds ``lit_model.pth``, ``model_config.yaml``, a tokenizer and ``generation_config.json``;
``litgpt finetune_*`` accepts what :func:`build` writes as it is. ``tiny``: a 2-layer model with TinyLlama's layout
(RMSNorm, SwiGLU, rotary embeddings, grouped-query attention) and a 512-token BPE vocabulary trained here on the
shipped dataset: a training step takes milliseconds on a CPU. A real architecture (``tunelab build-model NAME``):
litgpt's config at full size with random weights and the benchmark tokenizer, for GPU runs without a download."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import pickle
import re
import shutil
import sys
import time
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from tunelab import files
from tunelab.data import alpaca as data_mod
from tunelab.data import benchmark
from tunelab.errors import InputError
from tunelab.models import count_params
from tunelab.paths import DATASET, cache_dir
from tunelab.units import size

if TYPE_CHECKING:  # torch is imported where a weight file is read or a model built: a refusal never waits for it
    import torch

TINY = "tiny"
TINY_CONFIG = dict(
    name="tunelab-tiny-llama",
    block_size=2048,  # TinyLlama's context; the recipes' max_seq_length 512 must fit in it
    vocab_size=512,
    padded_vocab_size=512,
    padding_multiple=64,
    n_layer=2,
    n_head=4,
    n_query_groups=2,  # grouped-query attention, as TinyLlama (32 heads / 4 groups)
    n_embd=64,
    head_size=16,
    rotary_percentage=1.0,
    parallel_residual=False,
    bias=False,
    norm_class_name="RMSNorm",
    norm_eps=1e-5,
    mlp_class_name="LLaMAMLP",
    intermediate_size=172,
    rope_base=10000,
)
TINY_DEEP = "tiny-deep"
TINY_DEEP_CONFIG = dict(
    TINY_CONFIG, name="tunelab-tiny-deep", n_layer=24, n_embd=128, head_size=32, intermediate_size=344
)
"""24 narrow blocks (4.5 M parameters): activations dominate its memory, as in a real model at long sequences, so
activation checkpointing changes what fits (tests and `tune-batch` demonstrations on CPU)."""
EMBEDDED = {TINY: TINY_CONFIG, TINY_DEEP: TINY_DEEP_CONFIG}
"""The models built here from nothing (float32, the BPE tokenizer trained on the shipped data)."""
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]


def default_dir(name: str) -> Path:
    """Where ``tunelab build-model NAME`` puts its checkpoint by default."""
    return cache_dir() / "checkpoints" / (name if name in EMBEDDED else f"random-{name}")


WEIGHT_GLOBS = ("*.pth", "*.bin", "*.pt", "*.ckpt")
"""Files in a checkpoint directory that litgpt (or torch) would unpickle."""


def unsafe_files(checkpoint_dir: Path) -> list[str]:
    """The weight files in ``checkpoint_dir`` that are not plain tensor data: ``torch.load(weights_only=True)``
    refuses them (a pickle that builds arbitrary objects runs code when litgpt's lazy loader, a plain unpickler,
    opens it), and any that is not a regular file (a FIFO or a device). Cheap: memory-mapped and loaded to the
    meta device, so no tensor data is read."""
    out = []
    for pattern in WEIGHT_GLOBS:
        for f in sorted(Path(checkpoint_dir).glob(pattern)):
            if not f.is_file():  # a FIFO or a device would block or never end when litgpt reads it
                out.append(f.name)
                continue
            st = f.stat()
            if not _loads_as_weights(str(f.resolve()), st.st_size, st.st_mtime_ns):
                out.append(f.name)
    return out


@functools.lru_cache(maxsize=64)
def _loads_as_weights(path: str, size: int, mtime_ns: int) -> bool:
    import torch

    try:
        if zipfile.is_zipfile(path):  # torch's format since 1.6: only the pickled index is read, via mmap
            torch.load(path, mmap=True, weights_only=True, map_location="meta")
        else:  # the legacy format cannot be memory-mapped: read it, still with the restricted unpickler
            torch.load(path, weights_only=True, map_location="cpu")
        return True
    except (pickle.UnpicklingError, RuntimeError, ValueError, EOFError, AttributeError, OSError):
        return False


def is_complete(out_dir: Path) -> bool:
    """Whether ``out_dir`` holds a whole checkpoint (the weights are renamed into place last)."""
    out_dir = Path(out_dir)
    return (out_dir / "lit_model.pth").is_file() and (out_dir / "model_config.yaml").is_file()


def model_config(name: str):
    """The ``litgpt.Config`` for ``tiny`` or for a litgpt config name; ValueError with a hint if unknown."""
    from litgpt import Config

    if name in EMBEDDED:
        return Config(**EMBEDDED[name])
    try:
        return Config.from_name(name)
    except ValueError:
        raise ValueError(
            f"unknown model {name!r}; fix: 'tiny', 'tiny-deep' or a litgpt config name such as 'open_llama_7b' "
            "(list them with: python -c 'from litgpt.config import name_to_config; "
            "print(sorted(name_to_config))')"
        ) from None


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer trained here with the `tokenizers` library (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def construct(cls, config, device, dtype):
    """``cls(config)`` constructed on ``device`` with ``dtype`` as the default dtype (what Fabric's ``init_module``
    does under a true precision): parameters are created and initialised there, in that dtype."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return cls(config)
    finally:
        torch.set_default_dtype(previous)


def build(
    name: str = TINY,
    out_dir: Path | None = None,
    *,
    dataset: Path = DATASET,
    seed: int = 1337,
    dtype: torch.dtype | None = None,
    device: str = "cpu",
    force: bool = False,
) -> Path:
    """Write a litgpt checkpoint directory for ``name`` and return its path.

    ``dtype`` defaults to float32 for ``tiny`` and bfloat16 for real architectures (half the disk and RAM; the
    recipes load weights into the precision they train in anyway). An existing complete directory is reused
    unless ``force``.
    """
    config = model_config(name)
    out_dir = Path(out_dir) if out_dir is not None else default_dir(name)
    if is_complete(out_dir) and not force:
        return out_dir
    weight_bytes = _room_for(name, config, out_dir, dtype)
    if name not in EMBEDDED:  # minutes for a 7B on a CPU: say what is coming
        print(f"tunelab: building {name}: {size(weight_bytes)} of random weights into {out_dir}", file=sys.stderr)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(out_dir):  # two sweeps (or test workers) needing the same model build it once
        if is_complete(out_dir) and not force:
            return out_dir
        return _build(name, config, out_dir, dataset=dataset, seed=seed, dtype=dtype, device=device)


def _room_for(name: str, config, out_dir: Path, dtype) -> int:
    """The bytes of ``name``'s weights as :func:`build` writes them (``dtype``: None for its default); InputError,
    before anything is written, where the disk under ``out_dir`` or this machine's available memory (every weight
    passes through it on the way to ``torch.save``) has not that much room, with 5% to spare."""
    import torch

    dtype = dtype or (torch.float32 if name in EMBEDDED else torch.bfloat16)
    need = count_params(config)[0] * dtype.itemsize
    where = next((p for p in (out_dir, *out_dir.parents) if p.exists()), Path("."))
    free = shutil.disk_usage(where).free
    if free < need * 1.05:
        raise InputError(
            f"{out_dir}: {name}'s weights take {size(need)} ({str(dtype).replace('torch.', '')}) and "
            f"{size(free)} is free there; fix: --out on a disk with room"
        )
    available = _memory_available()
    if available is not None and available < need * 1.05:
        raise InputError(
            f"{name}: its weights take {size(need)} of memory on their way to disk and {size(available)} is "
            "available here; fix: build it on a machine with more memory"
        )
    return need


def _memory_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (Linux), else None."""
    try:
        text = files.read_text(Path("/proc/meminfo"), 1 << 16)
    except (OSError, files.FileRefused):
        return None
    found = re.search(r"^MemAvailable:\s+(\d+) kB", text, re.M)
    return int(found.group(1)) * 1024 if found else None


@contextlib.contextmanager
def _build_lock(out_dir: Path):
    """An exclusive flock on a file inside ``out_dir`` (nothing is left beside it; never through a link; released
    by the kernel if the holder dies)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with files.open_output(out_dir / ".tunelab-build.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build(name: str, config, out_dir: Path, *, dataset: Path, seed: int, dtype, device: str) -> Path:
    import torch
    from litgpt.model import GPT
    from litgpt.utils import save_config

    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = dtype or (torch.float32 if name in EMBEDDED else torch.bfloat16)
    tok = _write_tokenizer(name, config, out_dir, dataset)
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    files.write_text_atomic(
        out_dir / "generation_config.json",
        json.dumps({"bos_token_id": bos, "eos_token_id": eos, "max_length": config.block_size}, indent=2),
    )

    torch.manual_seed(seed)
    t0 = time.perf_counter()
    model = construct(GPT, config, device, dtype)
    tmp = out_dir / "lit_model.pth.tmp"
    try:
        torch.save({k: v.cpu() for k, v in model.state_dict().items()}, tmp)  # CPU tensors load anywhere
    except BaseException:  # a full disk, an interrupt: no partial weight file left to hold the space
        tmp.unlink(missing_ok=True)
        raise
    save_config(config, out_dir)
    files.write_text_atomic(
        out_dir / "tunelab_build.json",
        json.dumps(
            {
                "model": name,
                "weights": "random",
                "seed": seed,
                "dtype": str(dtype).replace("torch.", ""),
                "parameters": sum(p.numel() for p in model.parameters()),
                "tokenizer_vocab": tok.get_vocab_size(),
                "build_seconds": round(time.perf_counter() - t0, 3),
                "config": asdict(config),
            },
            indent=2,
            default=str,
        ),
    )
    tmp.replace(out_dir / "lit_model.pth")  # last: is_complete() sees a whole directory or none
    return out_dir


def _write_tokenizer(name: str, config, out_dir: Path, dataset: Path):
    """The model's tokenizer files in ``out_dir`` and the tokenizer: an embedded model's trained on the dataset (or
    the generated one), a real architecture's the benchmark tokenizer (whose token counts reproduce the lab's)."""
    if name in EMBEDDED:
        records = (
            files.read_json(dataset, files.DATASET_MAX_BYTES, "dataset")
            if Path(dataset).exists()
            else data_mod.generate()
        )
        tok = train_tokenizer(data_mod.corpus(records), vocab_size=min(config.vocab_size, 32000))
        benchmark.save_tokenizer(tok, out_dir, config.block_size)
    else:  # real architecture: the benchmark tokenizer, whose token counts reproduce the lab's batches
        benchmark.write_tokenizer(out_dir)
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    return tok
