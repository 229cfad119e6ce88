"""Count the tokens of Alpaca's records under each tokenizer family litgpt's models use, as litgpt's Alpaca data
module would feed them: the record through litgpt's ``alpaca`` prompt, its response, EOS, and BOS where the
family's tokenizer adds one.

    python scripts/measure_alpaca_tokens.py --records alpaca_data_cleaned_archive.json \\
        --vocab llama.cpp/models --out reports/<date>-alpaca-tokens-cpu \\
        --table configs/measured/alpaca-lengths.yaml

The tokenizers are rebuilt offline from llama.cpp's vocabulary-only GGUF files (``models/ggml-vocab-*.gguf``:
each family's tokens with its merges or scores, as the model's own tokenizer holds them; shipped in the
llama-cpp-python source distribution) and checked against llama.cpp's own test vectors beside them (the ``.inp`` /
``.out`` pairs: every vector's token ids). Needs ``gguf``, ``sentencepiece`` and ``protobuf`` besides the
project's packages (``pip install gguf sentencepiece protobuf``); nothing is downloaded.

Writes ``lengths.csv`` (one row per record: its index, characters, and tokens per family), ``vectors.csv`` (test
vectors reproduced per family) into ``--out``, and the planner's table (``--table``: the lengths per family, the
vocabulary sizes of litgpt's configs that use each, and the whole file's longest example where litgpt publishes it)
that ``tunelab/data/lengths.py`` reads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from tunelab.cli.common import number
from tunelab.errors import InputError
from tunelab.files import read_json, write_csv, write_text_atomic
from tunelab.report import evidence, resource_tables

FAMILIES = {
    # name: (vocabulary file, its test vectors, BOS added by litgpt, litgpt vocab sizes, who, the models using it)
    "llama-2": ("llama-spm", "llama-spm", True, [32000], "LLaMA 2's", "LLaMA 2, TinyLlama; Mistral, Phi-3 by size"),
    "llama-3": ("llama-bpe", "llama-bpe", True, [128000], "Llama 3's", "Llama 3, 3.1, 3.2, 3.3"),
    "qwen2": ("qwen2", "qwen2", False, [151643], "Qwen2's", "Qwen2.5, QwQ, Qwen3"),
    "gpt-2": ("gpt-2", "gpt-2", False, [50257], "GPT-2's", "phi-1.5, phi-2 (CodeGen's: GPT-2's with more spaces)"),
    "gpt-neox": ("gpt-neox", "mpt", False, [50254, 50280], "GPT-NeoX-20B's", "Pythia, StableLM, OLMo"),
    "falcon": ("falcon", "falcon", False, [65024], "Falcon's", "Falcon"),
}
"""The families measured: the vocabulary file, whose test vectors check it (MPT ships GPT-NeoX-20B's tokenizer
with vectors), whether litgpt prefixes BOS, and the ``vocab_size`` of litgpt's configs that tokenize with it."""


def published_longest() -> tuple[dict, str]:
    """({family: the whole file's longest training example in its tokens}, whose figures): litgpt's resource tables
    give it per model (``longest`` in configs/published/litgpt-resource-tables.yaml); a model's family is the one
    whose vocabulary sizes hold its config's. What a run without ``max_seq_length`` pads its longest micro batch to;
    the 2,000 records counted here do not hold it."""
    from litgpt import Config

    head, rows = evidence.published(resource_tables.TABLE, ("source", "note"), resource_tables.KEYS)
    longest = {}
    for row in rows:
        vocab = Config.from_name(row["model"]).vocab_size
        family = next((f for f, spec in FAMILIES.items() if vocab in spec[3]), None)
        if family is not None and longest.setdefault(family, row["longest"]) != row["longest"]:
            raise InputError(f"{resource_tables.TABLE}: two longest examples for {family}; fix: correct the table")
    return longest, f"{head['source']}: 'the number of tokens in the longest training example' of Alpaca, per model"


LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
"""Llama 3's pre-tokenizer split (its tokenizer.json); Qwen2's splits digits one by one instead of in threes."""


def _fields(path: Path):
    import gguf

    reader = gguf.GGUFReader(path)

    def get(key: str, many: bool = False):
        f = reader.fields.get(key)
        if f is None:
            return None
        text = f.types[-1] == gguf.GGUFValueType.STRING
        values = [bytes(f.parts[i]).decode() if text else f.parts[i].tolist()[0] for i in f.data]
        return values if many else values[0]

    return get


def _bpe(get, pre: str):
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers

    tokens, types = get("tokenizer.ggml.tokens", True), get("tokenizer.ggml.token_type", True)
    merges = [tuple(m.split(" ", 1)) for m in get("tokenizer.ggml.merges", True)]
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre in ("llama-bpe", "qwen2"):
        split = LLAMA3_SPLIT if pre == "llama-bpe" else LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), "isolated"), byte_level])
    elif pre == "falcon":
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Punctuation("contiguous"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                pre_tokenizers.Digits(individual_digits=False),
                pre_tokenizers.Split(Regex("[0-9][0-9][0-9]"), "isolated"),
            ]
        )
    else:  # GPT-2's byte-level split (GPT-2, GPT-NeoX-20B)
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    # user-defined tokens (GPT-NeoX-20B's runs of spaces) match before the split, as its tokenizer.json adds them
    tk.add_tokens([AddedToken(t, normalized=False) for t, ty in zip(tokens, types) if ty == 4 and "[PAD" not in t])
    return lambda text: tk.encode(text, add_special_tokens=False).ids


def _spm(get):
    import sentencepiece
    from sentencepiece import sentencepiece_model_pb2 as pb

    model = pb.ModelProto()
    model.trainer_spec.model_type = pb.TrainerSpec.BPE
    model.trainer_spec.byte_fallback = True
    norm = model.normalizer_spec
    norm.name, norm.add_dummy_prefix, norm.remove_extra_whitespaces, norm.escape_whitespaces = "identity", 1, 0, 1
    tokens, scores = get("tokenizer.ggml.tokens", True), get("tokenizer.ggml.scores", True)
    for i, (t, s, ty) in enumerate(zip(tokens, scores, get("tokenizer.ggml.token_type", True))):
        piece = model.pieces.add()
        piece.piece, piece.score, piece.type = t, s, 5 if ty == 2 and i else ty  # a second 'unknown': unused
    processor = sentencepiece.SentencePieceProcessor(model_proto=model.SerializeToString())
    return processor.encode


def encoder(vocab: Path, name: str):
    """The token ids of a text under llama.cpp's vocabulary ``name`` (no BOS or EOS)."""
    get = _fields(vocab / f"ggml-vocab-{name}.gguf")
    return _spm(get) if get("tokenizer.ggml.model") == "llama" else _bpe(get, get("tokenizer.ggml.pre") or name)


def vectors_passed(vocab: Path, encode, vectors: str) -> tuple[int, int]:
    """(test vectors whose ids ``encode`` reproduces, vectors) from llama.cpp's ``.inp`` / ``.out`` pair."""
    sep = "\n__ggml_vocab_test__\n"
    texts = (vocab / f"ggml-vocab-{vectors}.gguf.inp").read_text(encoding="utf-8").split(sep)
    ids = (vocab / f"ggml-vocab-{vectors}.gguf.out").read_text(encoding="utf-8").split("\n")
    return sum(encode(t) == [int(x) for x in i.split()] for t, i in zip(texts, ids)), len(texts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--records", type=Path, required=True, help="an Alpaca JSON file (a list of records)")
    p.add_argument("--vocab", type=Path, required=True, help="llama.cpp's models/ folder (ggml-vocab-*.gguf)")
    count = number(int, 1, 10**6, what="a number of records")
    p.add_argument("--first", type=count, default=2000, help="records counted, from the start (default 2000)")
    p.add_argument("--out", type=Path, required=True, help="the archive folder: lengths.csv, vectors.csv")
    p.add_argument("--table", type=Path, required=True, help="the planner's table to write (YAML)")
    a = p.parse_args(argv)
    try:
        import gguf  # noqa: F401
        import sentencepiece  # noqa: F401
    except ImportError as e:
        print(f"measure_alpaca_tokens: {e.name} is missing; fix: pip install gguf sentencepiece protobuf")
        return 2
    try:
        texts = _texts(a)
        counts, checks = {}, []
        for family, (name, vectors, bos, *_) in FAMILIES.items():
            encode = encoder(a.vocab, name)
            checks.append(
                {"family": family, "vocabulary": name, "vectors": vectors, **_checked(a.vocab, encode, vectors)}
            )
            counts[family] = [len(encode(t)) + 1 + bos for t in texts]  # EOS always; BOS where litgpt adds it
            print(f"{family}: mean {statistics.mean(counts[family]):.1f} tokens, {checks[-1]['passed']} vectors passed")
        _write(a, texts, counts, checks)
    except InputError as e:
        print(f"measure_alpaca_tokens: {e}")
        return 2
    return 0


def _texts(a) -> list[str]:
    """The records to count, as litgpt's alpaca prompt and their response; InputError for records that are not
    Alpaca's, a vocabulary folder that lacks a file, or an output folder that is something else."""
    from litgpt.prompts import Alpaca

    if a.out.exists() and not a.out.is_dir():
        raise InputError(f"--out {a.out}: exists and is not a folder; fix: give a new or existing folder")
    needed = {f"ggml-vocab-{n}.gguf" for n, *_ in FAMILIES.values()}
    needed |= {f"ggml-vocab-{v}.gguf.{x}" for _, v, *_ in FAMILIES.values() for x in ("inp", "out")}
    if missing := sorted(f for f in needed if not (a.vocab / f).is_file()):
        raise InputError(f"--vocab {a.vocab}: no {', '.join(missing)}; fix: give llama.cpp's models/ folder")
    records = read_json(a.records, 64 << 20, "Alpaca JSON file")
    try:
        return [Alpaca().apply(r["instruction"], input=r["input"]) + r["output"] for r in records[: a.first]]
    except (TypeError, KeyError):
        raise InputError(
            f"{a.records}: not Alpaca records; fix: a list of instruction, input, output records"
        ) from None


def _write(a, texts: list[str], counts: dict, checks: list) -> None:
    """lengths.csv and vectors.csv into ``--out``, the planner's table to ``--table`` (never through a link)."""
    a.out.mkdir(parents=True, exist_ok=True)
    rows = [{"record": i, "characters": len(t), **{f: counts[f][i] for f in FAMILIES}} for i, t in enumerate(texts)]
    write_csv(a.out / "lengths.csv", rows)
    write_csv(a.out / "vectors.csv", checks)
    text_tokens = {f: sum(counts[f]) - len(texts) * (1 + FAMILIES[f][2]) for f in FAMILIES}  # less BOS and EOS
    per_token = {f: sum(map(len, texts)) / text_tokens[f] for f in FAMILIES}
    write_text_atomic(a.table, _table(counts, per_token, published_longest(), len(texts)))


def _checked(vocab: Path, encode, vectors: str) -> dict:
    passed, total = vectors_passed(vocab, encode, vectors)
    return {"passed": passed, "total": total}


def _table(counts: dict, per_token: dict, longest: tuple[dict, str], n: int) -> str:
    """The planner's table: a header, then each family's vocabulary sizes, characters per token of the records'
    text (BOS and EOS aside) and lengths (one flow list each)."""
    lines = [
        "# Token lengths of litgpt's Alpaca data (alpaca_data_cleaned_archive.json, its first "
        f"{n:,} records) per tokenizer family,",
        "# as litgpt's Alpaca module feeds them (the alpaca prompt, the response, EOS, and BOS where the family adds"
        " one).",
        "# Measured by scripts/measure_alpaca_tokens.py (evidence: alpaca-tokens in reports/evidence.yaml); read by",
        "# tunelab/data/lengths.py. A model's family is matched by its litgpt config's vocab_size.",
        "evidence: alpaca-tokens",
        "data_modules: [litgpt.data.Alpaca]",
        "reference: llama-2",
        f"longest_source: {json.dumps(longest[1])}",
        "families:",
    ]
    for family, (_, _, _, sizes, who, models) in FAMILIES.items():
        lines += [f"  {family}:  # {models}", f"    name: {json.dumps(who)}", f"    vocab_sizes: {sizes}"]
        lines.append(f"    characters_per_token: {per_token[family]:.3f}")
        if family in longest[0]:  # published for the whole file; not every family
            lines.append(f"    longest: {longest[0][family]}")
        lines.append(f"    lengths: [{', '.join(map(str, counts[family]))}]")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
