"""Replay measured runs on this CPU: litgpt's loop over each run's own sequence lengths on fake tensors, its
allocations through a model of CUDA's caching allocator (tunelab/plan/model/allocator.py), beside what the GPU reported.

    python scripts/replay_allocator.py reports/2026-11-23-qlora-memory-h100/records.tgz \\
        tiny-lora-all-mb2 tiny-qlora-all-mb2 --out reports/planner-accuracy/allocator-replay.md

For each row of the archive: the run's recipe and overrides give the model, method, precision, micro batch,
accumulation, optimizer and LoRA targets (as ``tunelab plan`` reads them); its rank file gives the padded tokens of
every micro batch, in order; its tokenizer and data settings (litgpt/final/) give the two batches litgpt validated
on before training. Printed per phase (loaded, first step, end: the run record's ``phase_peak_allocated``):
the measured peak allocated, the simulated bytes requested (what the planner counts), the replayed allocated (the
allocator's blocks), and the run's peak reserved beside the replayed one. A few minutes per 1B-model row.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tarfile
import tempfile
from pathlib import Path

import yaml

from tunelab.data import benchmark
from tunelab.errors import InputError
from tunelab.files import RECORD_MAX_BYTES, FileRefused, check_target, write_text_atomic
from tunelab.plan import stored
from tunelab.plan.trace.simulate import replay_run
from tunelab.record import RunRecord


def _bytes(tar: tarfile.TarFile, names: dict, suffix: str) -> bytes | None:
    member = names.get(suffix)
    if member is None or not member.isfile() or member.size > RECORD_MAX_BYTES:
        return None
    return tar.extractfile(member).read()


def _member(tar: tarfile.TarFile, names: dict, suffix: str) -> dict:
    """The JSON object at ``suffix`` (``<row>/record.json``, ``<row>/stats/rank0.json``); InputError (one line with a
    fix) for a row the archive does not hold, a member that is not a regular file of at most 16 MiB, or not JSON."""
    if suffix not in names:
        rows = sorted({n.split("/")[0] for n in names if n.endswith("/record.json")})
        shown = ", ".join(rows[:8]) + (", ..." if len(rows) > 8 else "")
        raise InputError(f"{suffix}: not in the archive; fix: a row id it holds ({shown or 'none'})")
    data = _bytes(tar, names, suffix)
    if data is None:
        raise InputError(
            f"{suffix}: not a regular file of at most {RECORD_MAX_BYTES:,} bytes in the archive; fix: "
            "an archive the runbook wrote"
        )
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"{suffix}: not JSON ({str(e)[:80]}); fix: an archive the runbook wrote") from None
    if not isinstance(value, dict):
        raise InputError(f"{suffix}: not a JSON object; fix: an archive the runbook wrote")
    return value


SANITY_BATCHES = 2
"""litgpt's fit() validates on two batches before it trains (its sanity check): the 'loaded' phase's peak."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def validation_lengths(tar: tarfile.TarFile, names: dict, row: str, micro_batch_size: int) -> tuple[list[int], str]:
    """The padded lengths of the batches litgpt's sanity validation ran: the run's validation split through litgpt's
    own data module (its split, order and collate) with the run's tokenizer and data settings, both read from the
    archive (litgpt/final/). ([], why) where that data cannot be rebuilt here: only the benchmark dataset, which
    this project regenerates byte for byte, can (then the replay validates at the longest training length)."""
    hp_text = _bytes(tar, names, f"{row}/litgpt/final/hyperparameters.yaml")
    if hp_text is None:
        return [], "no hyperparameters.yaml in the archive"
    try:
        hp = yaml.safe_load(hp_text)
    except yaml.YAMLError:
        return [], "hyperparameters.yaml is not valid YAML"
    mapping = lambda v: v if isinstance(v, dict) else {}  # noqa: E731 (a missing or malformed section: empty)
    data, train = mapping(mapping(hp).get("data")), mapping(mapping(hp).get("train"))
    init = mapping(data.get("init_args"))
    if (
        data.get("class_path") != "litgpt.data.JSON"
        or Path(str(init.get("json_path"))).name != benchmark.default_path().name
    ):
        return [], f"its data ({data.get('class_path')}) is not the benchmark dataset"
    from litgpt.data import JSON
    from litgpt.tokenizer import Tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        for name in TOKENIZER_FILES:
            text = _bytes(tar, names, f"{row}/litgpt/final/{name}")
            if text is None:
                return [], f"no {name} in the archive"
            (Path(tmp) / name).write_bytes(text)
        keys = ("mask_prompt", "val_split_fraction", "prompt_style", "ignore_index", "seed")
        try:  # settings of the wrong type or a tokenizer that cannot be read: say so, validate at the longest
            dm = JSON(json_path=benchmark.ensure(), num_workers=0, **{k: init[k] for k in keys if k in init})
            dm.connect(Tokenizer(tmp), batch_size=micro_batch_size, max_seq_length=train.get("max_seq_length"))
            dm.setup()
            batches = itertools.islice(dm.val_dataloader(), SANITY_BATCHES)
            return [int(b["input_ids"].shape[1]) for b in batches], "the run's validation split and tokenizer"
        except Exception as e:  # noqa: BLE001 (the tokenizers library raises a bare Exception for a bad file)
            return [], f"its data settings could not be rebuilt ({type(e).__name__}: {str(e)[:120]})"


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def replay_row(tar: tarfile.TarFile, row: str) -> dict:
    names = {m.name.split("/", 1)[-1]: m for m in tar.getmembers()}
    rec = RunRecord.from_dict(_member(tar, names, f"{row}/record.json"))
    rank = _member(tar, names, f"{row}/stats/rank0.json")
    iters = rank.get("iters")
    if not isinstance(iters, list) or not iters:
        raise InputError(f"{row}/stats/rank0.json: no iterations (iters) to replay; fix: a run that trained")
    if not all(isinstance(it, list) and len(it) == 3 and all(_number(v) for v in it) for it in iters):
        raise InputError(
            f"{row}/stats/rank0.json: iters are not [time, padded, real] numbers; fix: the run's own rank file"
        )
    x = stored.todays_plan(rec, None, None).input  # the runs replayed ran litgpt's own loop
    seq_lens = [int(padded) // x.micro_batch_size for _t, padded, _real in rank["iters"]]
    val_lens, val_source = validation_lengths(tar, names, row, x.micro_batch_size)
    print(
        f"{row}: {x.config.name} {x.method} {x.precision}, micro {x.micro_batch_size}, {len(seq_lens)} micro "
        f"batches, validation batches {val_lens or 'unknown'} ({val_source}) ...",
        file=sys.stderr,
        flush=True,
    )
    peaks = replay_run(x, seq_lens, validation_seqs=val_lens or None)
    measured = rank.get("phase_peak_allocated") or {}
    return {
        "row": row,
        "device": rec.device_name,
        "seq_lens": seq_lens,
        "peak_reserved": rec.peak_reserved_bytes,
        "validation": (val_lens, val_source),
        "phases": {p: (measured.get(p), peaks[p]) for p in ("loaded", "first_step", "end") if p in peaks},
    }


def render(results: list[dict], archive: str) -> str:
    gb = lambda b: f"{b / 1e9:.3f}" if b else ""  # noqa: E731
    lines = [
        "# The caching allocator's share of the peak, replayed on CPU",
        "",
        f"Regenerate with `python scripts/replay_allocator.py {archive} ROW ... --out FILE`. Each run replayed with "
        "its own padded sequence lengths, in order, and litgpt's two-batch sanity validation at the longer of the "
        "two batches the run's own validation split gives (listed below the table), on fake "
        "tensors at full depth; allocations through a model of CUDA's caching allocator "
        "(`tunelab/plan/model/allocator.py`: 512-byte rounding, 2 MiB / 20 MiB segments, best fit, split and merge rules). "
        "GB = 1e9 bytes. requested = what the simulated step holds (the planner's quantity); allocated = the "
        "allocator's blocks (`max_memory_allocated`); the difference is the allocator's rounding, which depends on "
        "the order of sequence lengths.",
        "",
        "| row | device | phase | measured allocated | replayed requested | replayed allocated | allocator's share | "
        "error | measured reserved | replayed reserved |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for phase, (measured, p) in r["phases"].items():
            end = phase == "end"
            lines.append(
                f"| {r['row']} | {r['device']} | {phase} | {gb(measured)} | {gb(p.requested)} | {gb(p.allocated)} | "
                f"{gb(p.allocated - p.requested)} | "
                + (f"{p.allocated / measured - 1:+.1%}" if measured else "")
                + f" | {gb(r['peak_reserved']) if end else ''} | {gb(p.reserved) if end else ''} |"
            )
    lines += ["", "Sanity validation (padded tokens of litgpt's two validation batches; 'loaded' holds the longer):"]
    for r in results:
        lens, source = r["validation"]
        lines.append(
            f"- {r['row']}: {' and '.join(map(str, lens))} ({source}); training batches up to {max(r['seq_lens'])}"
            if lens
            else f"- {r['row']}: unknown ({source}): the longest training length, {max(r['seq_lens'])}, taken"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("archive", help="a report's records.tgz")
    ap.add_argument("rows", nargs="+", help="row ids in the archive")
    ap.add_argument("--out", type=Path, help="write the Markdown table here (else print it)")
    args = ap.parse_args(argv)
    if not Path(args.archive).is_file():
        print(f"replay_allocator: {args.archive}: no such archive", file=sys.stderr)
        return 2
    if args.out is not None and (why := _unwritable(args.out)):  # before minutes of replay, not after
        print(f"replay_allocator: --out {args.out}: {why}", file=sys.stderr)
        return 2
    results = []
    try:
        tar = tarfile.open(args.archive)
    except (tarfile.TarError, OSError) as e:
        print(f"replay_allocator: {args.archive}: not a tar archive ({str(e).splitlines()[0]})", file=sys.stderr)
        return 2
    with tar:
        for row in args.rows:  # the table is rewritten after each row: a long replay cut short keeps what it did
            try:
                results.append(replay_row(tar, row))
            except InputError as e:
                print(f"replay_allocator: {args.archive}: {e}", file=sys.stderr)
                return 2
            except (ValueError, KeyError, TypeError, tarfile.TarError) as e:  # a record of the wrong shape
                print(
                    f"replay_allocator: {args.archive}: row {row}: {e}; fix: an archive the runbook wrote",
                    file=sys.stderr,
                )
                return 2
            if args.out:
                write_text_atomic(args.out, render(results, args.archive))
    if not args.out:
        print(render(results, args.archive), end="")
    return 0


def _unwritable(out: Path) -> str | None:
    """Why ``out`` cannot take the table (None: it can): its folder missing, or a folder, link, FIFO in its place."""
    try:
        check_target(out, "table file")  # the project's check: a link, FIFO, device or folder in its place
    except FileRefused as e:
        return str(e)
    if not out.parent.is_dir():
        return f"its folder {out.parent} does not exist"
    return None


if __name__ == "__main__":
    raise SystemExit(main())
