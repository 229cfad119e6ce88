"""Replay measured runs on this CPU: litgpt's loop over each run's own sequence lengths on fake tensors, its
allocations through a model of CUDA's caching allocator (tunelab/plan/allocator.py), beside what the GPU reported.

    python scripts/replay_allocator.py reports/2026-11-23-qlora-memory-h100/records.tgz \\
        tiny-lora-all-mb2 tiny-qlora-all-mb2 --out reports/planner-accuracy/allocator-replay.md

For each row of the archive: the run's recipe and overrides give the model, method, precision, micro batch,
accumulation, optimizer and LoRA targets (as ``tunelab plan`` reads them); its rank file gives the padded tokens of
every micro batch, in order. Printed per phase (loaded, first step, end: the run record's ``phase_peak_allocated``):
the measured peak allocated, the simulated bytes requested (what the planner counts), the replayed allocated (the
allocator's blocks), and the run's peak reserved beside the replayed one. A few minutes per 1B-model row.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
from pathlib import Path

from tunelab.files import RECORD_MAX_BYTES, write_text_atomic
from tunelab.plan.recipe import plan_recipe
from tunelab.plan.simulate import optimizer_of, replay_run
from tunelab.recipes import resolve
from tunelab.record import RunRecord


def _member(tar: tarfile.TarFile, names: dict, suffix: str) -> dict:
    member = names.get(suffix)
    if member is None or not member.isfile() or member.size > RECORD_MAX_BYTES:
        raise SystemExit(f"replay_allocator: {suffix}: not a regular file of at most {RECORD_MAX_BYTES} bytes")
    return json.loads(tar.extractfile(member).read())


def replay_row(tar: tarfile.TarFile, row: str) -> dict:
    names = {m.name.split("/", 1)[-1]: m for m in tar.getmembers()}
    rec = RunRecord.from_dict(_member(tar, names, f"{row}/record.json"))
    rank = _member(tar, names, f"{row}/stats/rank0.json")
    x = plan_recipe(resolve(rec.recipe), list(rec.overrides), gpu=None).input
    seq_lens = [int(padded) // x.micro_batch_size for _t, padded, _real in rank["iters"]]
    print(f"{row}: {x.config.name} {x.method} {x.precision}, micro {x.micro_batch_size}, {len(seq_lens)} micro "
          "batches ...", file=sys.stderr, flush=True)  # fmt: skip
    peaks = replay_run(
        x.config, x.method, str(x.precision), x.micro_batch_size, seq_lens, x.accumulation, optimizer_of(x),
        x.lora_r, x.lora_targets,
    )  # fmt: skip
    measured = rank.get("phase_peak_allocated") or {}
    return {
        "row": row, "device": rec.device_name, "seq_lens": seq_lens, "peak_reserved": rec.peak_reserved_bytes,
        "phases": {p: (measured.get(p), peaks[p]) for p in ("loaded", "first_step", "end") if p in peaks},
    }  # fmt: skip


def render(results: list[dict], archive: str) -> str:
    gb = lambda b: f"{b / 1e9:.3f}" if b else ""  # noqa: E731
    lines = [
        "# The caching allocator's share of the peak, replayed on CPU",
        "",
        f"Regenerate with `python scripts/replay_allocator.py {archive} ROW ... --out FILE`. Each run replayed with "
        "its own padded sequence lengths, in order (litgpt's two-batch sanity validation at the longest), on fake "
        "tensors at full depth; allocations through a model of CUDA's caching allocator "
        "(`tunelab/plan/allocator.py`: 512-byte rounding, 2 MiB / 20 MiB segments, best fit, split and merge rules). "
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
    results = []
    with tarfile.open(args.archive) as tar:
        for row in args.rows:  # the table is rewritten after each row: a long replay cut short keeps what it did
            results.append(replay_row(tar, row))
            if args.out:
                write_text_atomic(args.out, render(results, args.archive))
    if not args.out:
        print(render(results, args.archive), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
