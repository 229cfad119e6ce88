"""What a dataset's samples cost in tokens: their lengths (the model's tokenizer, or characters where it is not
here), the default distribution where the data is not known, and the padded tokens per sample as litgpt's loader
pads each micro batch, or as tunelab's loop groups them."""

from __future__ import annotations

import functools
import math
import random
from pathlib import Path

from tunelab import yaml_input
from tunelab.data import benchmark
from tunelab.data import records as dataset_records
from tunelab.data.grouping import bucket, plan_epoch
from tunelab.errors import InputError
from tunelab.files import read_json, read_text
from tunelab.paths import CONFIGS_DIR
from tunelab.strategies import StrategyConfig

LAB_PADDED_TOKENS_PER_SAMPLE = 437
"""The lab's padded tokens per training sample (spec: 7,646 tok/s x 57.19 s over 1,000 samples, micro 8)."""


TOKENIZED_MAX = 2_000
"""Records the planner tokenises at most: the longest by characters for ``--dataset`` (the longest in tokens is
among them in any natural text), a seeded sample for the padded tokens per sample; a million-record file plans in
seconds."""


def longest_sample_tokens(json_path: Path, checkpoint_dir: Path, prompt_style: str = "alpaca") -> int:
    """Token count of the dataset's longest sample with its prompt template (needs the checkpoint's tokenizer):
    the :data:`TOKENIZED_MAX` longest records by characters are tokenised."""
    records = [r for part in dataset_records.split_files(json_path) for r in dataset_records.read(part)]
    return sample_lengths(records, checkpoint_dir, prompt_style)[1]


def has_tokenizer(checkpoint_dir: Path) -> bool:
    """Whether the checkpoint directory holds a tokenizer litgpt can load."""
    return (Path(checkpoint_dir) / "tokenizer.json").is_file() or (Path(checkpoint_dir) / "tokenizer.model").is_file()


TOKENIZER_MAX_BYTES = 64 * 2**20
"""Largest tokenizer file read (64 MiB: the largest litgpt models' tokenizer.json are under 35 MB)."""


def load_tokenizer(checkpoint_dir: Path):
    """litgpt's Tokenizer of a checkpoint, its JSON files checked first (bounded, UTF-8, valid JSON: one line
    naming the file), and anything litgpt or the tokenizers library then refuses said in one line too."""
    from litgpt.tokenizer import Tokenizer

    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (checkpoint_dir / name).exists():
            read_json(checkpoint_dir / name, TOKENIZER_MAX_BYTES, "tokenizer file")
    try:
        return Tokenizer(checkpoint_dir)
    except Exception as e:  # the tokenizers library's own errors (a malformed model) have no common class
        raise InputError(
            f"{checkpoint_dir}: its tokenizer could not be loaded ({type(e).__name__}: {str(e)[:200]}); fix: "
            "download the checkpoint's tokenizer files again"
        ) from None


def sample_lengths(
    records: list[dict],
    checkpoint_dir: Path,
    prompt_style: str = "alpaca",
    cap: int | None = None,
    seed: int = 42,
    vocab_size: int | None = None,
) -> tuple[list[int], int, str]:
    """(token lengths of a seeded sample of at most :data:`TOKENIZED_MAX` records, the longest sample's length
    (among the :data:`TOKENIZED_MAX` longest by characters), how they were counted), each with the prompt template
    and EOS, capped at ``cap``: with the checkpoint's tokenizer, else characters over the published characters per
    token of the tokenizer of a model of ``vocab_size`` (:func:`chars_per_token`)."""
    from litgpt.prompts import PromptStyle

    style = PromptStyle.from_name(prompt_style)
    if has_tokenizer(checkpoint_dir):
        tok = load_tokenizer(Path(checkpoint_dir))
        how = "tokenised with the model's tokenizer"

        def count(text):
            return len(tok.encode(text, eos=True))
    else:
        chars, whose = chars_per_token(vocab_size)
        how = f"estimated at {chars:g} characters per token ({whose}; no tokenizer in {checkpoint_dir})"

        def count(text):
            return math.ceil(len(text) / chars) + 1

    def text(r):
        return style.apply(r["instruction"], input=r.get("input", "")) + r["output"]

    limit = cap or 10**9
    picked = random.Random(seed).sample(records, TOKENIZED_MAX) if len(records) > TOKENIZED_MAX else records
    lengths = [min(limit, count(text(r))) for r in picked]
    longest_texts = sorted((text(r) for r in records), key=len)[-TOKENIZED_MAX:]
    longest = min(limit, max((count(t) for t in longest_texts), default=0))
    return lengths, longest, how


def padded_per_sample(lengths: list[int], micro: int, seed: int = 42) -> float:
    """Mean tokens per sample after padding each micro batch to its longest sample, the samples shuffled as
    litgpt's loader shuffles them (seeded)."""
    if not lengths:
        return 0.0
    order = list(lengths)
    random.Random(seed).shuffle(order)
    batches = [order[i : i + micro] for i in range(0, len(order), micro)]
    return sum(max(b) * len(b) for b in batches) / len(order)


def grouped_padded_per_sample(
    lengths: list[int], micro: int, group: int | None, multiple: int | None, cap: int, seed: int = 42
) -> float:
    """Mean tokens per sample under tunelab's fast path: the micro batches its loop forms (length-grouped within
    windows of ``group`` micro batches, :func:`tunelab.data.grouping.plan_epoch`, the loop's own code), each padded
    to its longest sample rounded up to ``multiple`` (:func:`tunelab.data.grouping.bucket`), the order shuffled as
    litgpt's loader shuffles (seeded)."""

    if not lengths:
        return 0.0
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    batches = plan_epoch(order, micro, lengths, group, seed, 0)
    return sum(bucket(max(lengths[i] for i in b), multiple, cap) * len(b) for b in batches) / len(lengths)


def padded_tokens_per_sample(lengths: list[int], micro: int, strategy: StrategyConfig | None, cap: int) -> float:
    """Padded tokens per sample of a run: as its strategy's loop forms the micro batches where it forms them its own
    way (:attr:`StrategyConfig.regroups`: :func:`grouped_padded_per_sample`), else as litgpt pads
    (:func:`padded_per_sample`). ``cap``: the sequence length no micro batch is padded past. Remembered per lengths
    and settings (advise asks the same figure for hundreds of configurations)."""
    if strategy is not None and strategy.regroups:
        return _padded(tuple(lengths), micro, (strategy.length_grouping, strategy.pad_to_multiple), cap)
    return _padded(tuple(lengths), micro, None, cap)


@functools.lru_cache(maxsize=256)
def _padded(lengths: tuple, micro: int, grouping: tuple | None, cap: int) -> float:
    if grouping is not None:
        return grouped_padded_per_sample(list(lengths), micro, grouping[0], grouping[1], cap)
    return padded_per_sample(list(lengths), micro)


TOKENIZERS = CONFIGS_DIR / "published" / "tokenizers.yaml"
"""Published characters per token of English text by tokenizer, against the default distribution's."""


@functools.cache
def _tokenizer_table() -> tuple:
    """(reference characters per token, its name, {tokenizer: (vocab sizes, characters per token)}) from
    :data:`TOKENIZERS`. A table that does not read: one line naming it."""
    where = "configs/published/tokenizers.yaml"
    raw = yaml_input.loads(read_text(TOKENIZERS, yaml_input.MAX_BYTES, "tokenizer table", where, links=False), where)
    if not isinstance(raw, dict):
        raise InputError(f"{where}: a mapping of reference and tokenizers; fix: restore it (git checkout -- {where})")
    fix = f"fix: restore it (git checkout -- {where})"
    try:
        ref = float(raw["reference"]["chars_per_token"])
        rows = {str(k): (list(v["vocab_sizes"]), float(v["chars_per_token"])) for k, v in raw["tokenizers"].items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        raise InputError(f"{where}: needs reference and tokenizers, each with chars_per_token; {fix}") from None
    if not all(math.isfinite(c) and c > 0 for c in (ref, *(c for _, c in rows.values()))):
        raise InputError(f"{where}: chars_per_token must be a number above 0; {fix}")
    if not all(isinstance(v, int) and not isinstance(v, bool) for sizes, _ in rows.values() for v in sizes):
        raise InputError(f"{where}: vocab_sizes must be a list of whole numbers; {fix}")
    return ref, str(raw["reference"].get("name", "the reference")), rows


def _listed(vocab_size: int | None) -> tuple | None:
    """(name, characters per token) of the listed tokenizer of a model of ``vocab_size``, None if not listed."""
    return next(((n, c) for n, (sizes, c) in _tokenizer_table()[2].items() if vocab_size in sizes), None)


def tokens_scale(vocab_size: int | None) -> tuple[float, str]:
    """(a sample's tokens under the tokenizer of a model with ``vocab_size`` over the default distribution's, the
    words that say so) from :data:`TOKENIZERS`; (1.0, "") for a tokenizer it does not list."""
    ref, ref_name, _ = _tokenizer_table()
    if (listed := _listed(vocab_size)) is None:
        return 1.0, ""
    name, chars = listed
    return ref / chars, (
        f"counted with {ref_name} tokenizer, scaled to {name} {chars:g} characters per token against {ref:g} "
        "(configs/published/tokenizers.yaml)"
    )


def chars_per_token(vocab_size: int | None) -> tuple[float, str]:
    """(characters per token of English text, whose) for the tokenizer of a model of ``vocab_size``, as
    :data:`TOKENIZERS` publishes it: a listed tokenizer's, else the reference's (LLaMA 2's)."""
    ref, ref_name, _ = _tokenizer_table()
    name, chars = _listed(vocab_size) or (ref_name, ref)
    return chars, f"{name}, as published: configs/published/tokenizers.yaml"


DEFAULT_LENGTH_DRAWS = 20_000
"""Sample lengths drawn from the default distribution (seeded): enough for the mean padding at micro 128."""


@functools.cache
def default_lengths(cap: int = 512, vocab_size: int | None = None) -> tuple:
    """Sample lengths in tokens where the data's are not known: the benchmark data's stated distribution (the
    lab's Alpaca subset: LogNormal(5.43, 0.5) tokens, at least 48; ``tunelab/data/benchmark.py``), counted with
    LLaMA 2's tokenizer and scaled to the tokenizer of a model of ``vocab_size`` (:func:`tokens_scale`), capped at
    ``cap`` (the recipe's max_seq_length). Padded per micro batch as litgpt pads (:func:`padded_per_sample`):
    253 tokens per sample at micro 1, 383 at 4, 440 at 8 (the lab measured 437 there), 482 at 16, 505 at 32."""

    rng = random.Random(benchmark.SEED)
    draw = lambda: max(benchmark.MIN_LEN, round(math.exp(rng.gauss(benchmark.LOG_MEAN, benchmark.LOG_STD))))  # noqa: E731
    scale = tokens_scale(vocab_size)[0]
    return tuple(min(cap, max(1, round(draw() * scale))) for _ in range(DEFAULT_LENGTH_DRAWS))


def default_padded_per_sample(micro: int, cap: int | None = None, vocab_size: int | None = None) -> float:
    """Padded tokens per sample at ``micro`` under :func:`default_lengths`."""
    return padded_per_sample(list(default_lengths(cap or 512, vocab_size)), micro)
