"""What a dataset's samples cost in tokens: their lengths (the model's tokenizer, or characters where it is not
here), the default distribution where the data is not known, and the padded tokens per sample as litgpt's loader
pads each micro batch, or as tunelab's loop groups them."""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
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


MEASURED = CONFIGS_DIR / "measured" / "alpaca-lengths.yaml"
"""Token lengths of litgpt's Alpaca data (its file's first 2,000 records) per tokenizer family, measured
(``scripts/measure_alpaca_tokens.py``; evidence ``alpaca-tokens``)."""
MEASURED_SHOWN = "configs/measured/alpaca-lengths.yaml"


@dataclass(frozen=True)
class Family:
    """One tokenizer family's counts of the measured records (:data:`MEASURED`)."""

    name: str
    """Whose tokenizer, in words (``LLaMA 2's``)."""
    vocab_sizes: tuple
    """The ``vocab_size`` of litgpt's configs that tokenize with it."""
    lengths: tuple
    """Each record's tokens, with BOS and EOS as litgpt adds them."""
    characters_per_token: float
    """The records' characters over their text's tokens (BOS and EOS aside)."""
    longest: int | None = None
    """The whole file's longest training example in its tokens, where published (None: not)."""


@dataclass(frozen=True)
class Measured:
    """:data:`MEASURED`: the families, which is the default distribution's, and which data modules they count."""

    reference: str
    """The family the default length distribution was counted with (LLaMA 2's)."""
    families: dict
    """{family: :class:`Family`}."""
    data_modules: tuple
    """The litgpt data modules whose records these are."""
    longest_source: str
    """Whose the families' ``longest`` figures are."""

    def family(self, vocab_size: int | None) -> str | None:
        """The family of the tokenizer of a model of ``vocab_size``, None if not measured."""
        return next((k for k, f in self.families.items() if vocab_size in f.vocab_sizes), None)


@functools.cache
def _measured() -> Measured:
    """:data:`MEASURED` read and checked; a table that does not read: one line naming it."""
    where = "configs/measured/alpaca-lengths.yaml"
    raw = yaml_input.loads(read_text(MEASURED, yaml_input.MAX_BYTES, "length table", where, links=False), where)
    fix = f"fix: restore it (git checkout -- {where})"
    try:
        families = {
            str(k): Family(
                str(v["name"]),
                tuple(v["vocab_sizes"]),
                tuple(v["lengths"]),
                float(v["characters_per_token"]),
                v.get("longest"),
            )
            for k, v in raw["families"].items()
        }
        table = Measured(
            str(raw["reference"]), families, tuple(map(str, raw["data_modules"])), raw.get("longest_source")
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        raise InputError(
            f"{where}: needs reference, data_modules and families (name, vocab_sizes, characters_per_token, "
            f"lengths); {fix}"
        ) from None
    counts = [n for f in families.values() for n in (*f.vocab_sizes, *f.lengths, f.longest or 1)]
    if table.reference not in families or not all(type(n) is int and n > 0 for n in counts):
        raise InputError(f"{where}: the reference must be a family, sizes and lengths whole numbers above 0; {fix}")
    if not all(math.isfinite(f.characters_per_token) and f.characters_per_token > 0 for f in families.values()):
        raise InputError(f"{where}: characters_per_token must be a number above 0; {fix}")
    return table


def module_lengths(data_class: str | None, vocab_size: int | None, cap: int | None) -> tuple[tuple, str] | None:
    """(token lengths, the words that say whose) of a litgpt data module whose records were measured
    (:data:`MEASURED`: litgpt's Alpaca), under the tokenizer of a model of ``vocab_size`` (the reference family's for
    one not measured), capped at ``cap``; None for any other data."""
    table = _measured()
    if data_class not in table.data_modules:
        return None
    family = table.families[table.family(vocab_size) or table.reference]
    words = f"{data_class.rsplit('.', 1)[-1]}'s records in {family.name} tokens, measured ({MEASURED_SHOWN})"
    return tuple(min(cap or 10**9, n) for n in family.lengths), words


def module_longest(data_class: str | None, vocab_size: int | None) -> tuple[int, str] | None:
    """(the whole file's longest training example in tokens, whose figure) of a measured litgpt data module
    (:data:`MEASURED`) under the tokenizer of a model of ``vocab_size``, where published for its family; None
    otherwise."""
    table = _measured()
    family = table.families.get(table.family(vocab_size) or "")
    if data_class not in table.data_modules or family is None or family.longest is None:
        return None
    module = data_class.rsplit(".", 1)[-1]
    return family.longest, f"{module}'s longest training example in {family.name} tokens ({table.longest_source})"


def tokens_scale(vocab_size: int | None) -> tuple[float, str]:
    """(a sample's tokens under the tokenizer of a model with ``vocab_size`` over the default distribution's, the
    words that say so): its family's tokens over LLaMA 2's on Alpaca's records, measured (:data:`MEASURED`); (1.0,
    "") for LLaMA 2's family and a tokenizer not measured."""
    table = _measured()
    if (key := table.family(vocab_size)) in (None, table.reference):
        return 1.0, ""
    family, reference = table.families[key], table.families[table.reference]
    scale = sum(family.lengths) / sum(reference.lengths)
    return scale, (
        f"counted with {reference.name} tokenizer, scaled to {family.name}: {scale:.3f}x the tokens on Alpaca's "
        f"records (measured: {MEASURED_SHOWN})"
    )


def chars_per_token(vocab_size: int | None) -> tuple[float, str]:
    """(characters per token of Alpaca-format text, whose) for the tokenizer of a model of ``vocab_size``: its
    family's on Alpaca's records, measured (:data:`MEASURED`), else LLaMA 2's."""
    table = _measured()
    family = table.families[table.family(vocab_size) or table.reference]
    return family.characters_per_token, f"{family.name} on Alpaca's records, measured: {MEASURED_SHOWN}"


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
