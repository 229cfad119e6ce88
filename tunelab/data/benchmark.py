"""The benchmark workload for random-weight GPU runs: 2,000 Alpaca-shaped records and a word-level tokenizer whose
token counts reproduce the lab's batches.

The lab's figures imply about 437 padded tokens per training sample at micro batch 8 (1,000 training samples, each
batch padded to its longest, truncated at 512). Memory and tok/s only compare with the lab's when the workload has
that shape, so each record here is drawn to a length distribution that gives it, and the tokenizer counts one token
per word. ``tunelab build-model`` writes it beside a random-weight checkpoint (docs/gpu-runbook.md)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from tunelab.data.alpaca import write
from tunelab.files import write_text_atomic
from tunelab.paths import cache_dir

SIZE = 2000
"""Records (the lab's subset: 1,000 train + 1,000 validation after the 0.5 split)."""
SEED = 2024
LOG_MEAN, LOG_STD = 5.43, 0.5
"""Target length (tokens, template and BOS/EOS included) ~ LogNormal(LOG_MEAN, LOG_STD), at least MIN_LEN."""
MIN_LEN = 48
LAB_PADDED_PER_SAMPLE = 437
"""The lab's padded tokens per training sample at micro batch 8 (derived from s3 and s4)."""
VOCAB_WORDS = 4000
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def default_path() -> Path:
    """Where the dataset is generated (deterministic; rebuilt when missing): ``<cache>/data/alpaca_benchmark.json``."""
    return cache_dir() / "data" / "alpaca_benchmark.json"


def words(n: int = VOCAB_WORDS) -> list[str]:
    """``n`` distinct pseudo-words (two or three consonant-vowel syllables), the same every time."""
    syll = [c + v for c in _CONSONANTS for v in _VOWELS]
    out = [a + b for a in syll for b in syll]
    out += [a + b + c for a in syll[:20] for b in syll for c in syll[:10]]
    return out[:n]


def template_pieces() -> list[str]:
    """The words and punctuation of litgpt's Alpaca prompt templates, as the word-level tokenizer splits them."""
    from litgpt.prompts import Alpaca
    from tokenizers.pre_tokenizers import Whitespace

    style = Alpaca()
    text = style.apply("ba", input="ba") + " " + style.apply("ba")  # "ba" is one of the pseudo-words
    return sorted({piece for piece, _ in Whitespace().pre_tokenize_str(text)})


def build_tokenizer():
    """The word-level tokenizer (``tokenizers`` library): specials, template pieces, then the pseudo-words."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab: dict[str, int] = {}
    for tok in [*SPECIAL_TOKENS, *template_pieces(), *words()]:
        vocab.setdefault(tok, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def _template_tokens(tok, with_input: bool) -> int:
    from litgpt.prompts import Alpaca

    # one pseudo-word per field, so the template's own tokens are the total minus those
    text = Alpaca().apply("ba", input="ba") if with_input else Alpaca().apply("ba")
    return len(tok.encode(text).ids) - (2 if with_input else 1)


def generate(n: int = SIZE, seed: int = SEED) -> list[dict]:
    """``n`` Alpaca records; record i has exactly its target number of tokens (BOS + prompt + output + EOS)."""
    rng = random.Random(seed)
    tok = build_tokenizer()
    vocab = words()
    overhead = {True: _template_tokens(tok, True) + 2, False: _template_tokens(tok, False) + 2}  # + BOS, EOS
    records = []
    for _ in range(n):
        target = max(MIN_LEN, round(math.exp(rng.gauss(LOG_MEAN, LOG_STD))))
        with_input = rng.random() < 0.4  # about the share of Alpaca records that have an input
        n_instr = rng.randint(4, 24)
        n_input = rng.randint(2, 40) if with_input else 0
        n_out = max(1, target - overhead[with_input] - n_instr - n_input)
        pick = lambda k: " ".join(rng.choice(vocab) for _ in range(k))  # noqa: E731
        records.append(
            {"instruction": pick(n_instr), "input": pick(n_input) if with_input else "", "output": pick(n_out)}
        )
    return records


def write_tokenizer(out_dir: Path) -> None:
    """Write the benchmark tokenizer into a litgpt checkpoint directory (tokenizer.json + its config)."""
    save_tokenizer(build_tokenizer(), Path(out_dir))


def save_tokenizer(tok, out_dir: Path, model_max_length: int | None = None) -> None:
    """A tokenizer as litgpt reads it from a checkpoint directory: tokenizer.json and a tokenizer_config.json with
    the BOS token added, the special tokens named (and the model's length, where given)."""
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": True,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
    }
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    write_text_atomic(out_dir / "tokenizer_config.json", json.dumps(config, indent=2))


def ensure(path: Path | None = None) -> Path:
    """The dataset file, generated if it is missing (written atomically)."""
    path = Path(path or default_path())
    if not path.is_file():
        write(path, generate())
    return path
