"""What is alive in GPU memory at a run's peaks, from CUDA's allocator history (opt-in: ``TUNELAB_MEMORY_HISTORY=1``).

Each rank records torch's allocator history from its start (``torch.cuda.memory._record_memory_history``, Python
stacks only), marks the first training batch, and at exit writes ``memory-rank<N>.json`` beside its rank file: for
the "loaded" phase and for the rest of the run, the peak of the bytes requested, replayed from the history, and the
bytes alive then grouped by the first caller outside torch (file:line). docs/records.md."""

from __future__ import annotations

import os
import sys
from collections import Counter

from tunelab.files import write_json_atomic

ENV = "TUNELAB_MEMORY_HISTORY"
MAX_ENTRIES = 2_000_000
"""Allocator events kept (torch's ring buffer: older ones are dropped beyond this)."""
TOP = 30
"""Allocating callers listed per phase, the largest first."""
_STATE: dict = {"on": False, "marked": False}


def start() -> None:
    """Begin recording if ``TUNELAB_MEMORY_HISTORY=1`` and a CUDA device is present."""
    if os.environ.get(ENV) != "1":
        return
    import torch

    if not torch.cuda.is_available():
        print(f"tunelab: {ENV}=1 ignored: no CUDA device", file=sys.stderr, flush=True)
        return
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=MAX_ENTRIES)
    _STATE["on"] = True


def mark_first_batch() -> None:
    """The "loaded" phase ends here: the length of the history so far (the snapshot taken for it also leaves a
    'snapshot' event at this point)."""
    if _STATE["on"] and not _STATE["marked"]:
        import torch

        _STATE["marked"] = True
        _STATE["mark"] = max((len(t) for t in torch.cuda.memory._snapshot().get("device_traces", [])), default=0)


def caller(frames: list[dict]) -> str:
    """The first frame outside torch (frames run innermost first), as 'path:line function' with the path cut to
    its package; the innermost frame when every frame is torch's; '?' without frames."""
    outside = [
        f
        for f in frames
        if "/torch/" not in str(f.get("filename", "")) and not str(f.get("filename", "")).startswith("<")
    ]
    f = (outside or frames or [None])[0]
    if f is None:
        return "?"
    return f"{str(f.get('filename', '')).split('site-packages/')[-1]}:{f.get('line')} {f.get('name')}"


def summarise(snapshot: dict, max_entries: int = MAX_ENTRIES, top: int = TOP, mark: int | None = None) -> dict:
    """Replay a snapshot's history into the peak of each phase and what is alive there: an 'alloc' adds its size, a
    'free_requested' takes it away (when the allocator's own allocated count drops; 'free_completed', when the block
    may be reused, can come later for memory another stream used).

    Phases: "loaded" until event number ``mark`` (the history's length at the first training batch), or without
    it until the first 'snapshot' event; "training" after. Sizes are the bytes requested, as the history records
    them. Two passes: the first finds each phase's peak event, the second groups what is alive at each by caller."""
    traces = [t for t in snapshot.get("device_traces", []) if t]
    trace = max(traces, key=len) if traces else []
    if mark is None:
        mark = next((i for i, e in enumerate(trace) if e.get("action") == "snapshot"), len(trace))
    peaks = {"loaded": (0, -1), "training": (0, -1)}  # phase -> (bytes, index of the event that reached them)
    live: dict[int, int] = {}
    current = 0
    for i, e in enumerate(trace):
        action, addr = e.get("action"), e.get("addr")
        if action == "alloc":
            live[addr] = int(e["size"])
            current += live[addr]
            phase = "loaded" if i < mark else "training"
            if current > peaks[phase][0]:
                peaks[phase] = (current, i)
        elif action == "free_requested" and addr in live:
            current -= live.pop(addr)
    phases = {name: {"peak_bytes": peak, "alive_by_caller": []} for name, (peak, _at) in peaks.items()}
    at = {i: name for name, (_peak, i) in peaks.items() if i >= 0}
    alive: dict[int, tuple[int, list]] = {}
    for i, e in enumerate(trace[: max(at, default=-1) + 1]):
        if e.get("action") == "alloc":
            alive[e["addr"]] = (int(e["size"]), e.get("frames") or [])
        elif e.get("action") == "free_requested":
            alive.pop(e.get("addr"), None)
        if i in at:
            by_caller: Counter = Counter()
            for size, frames in alive.values():
                by_caller[caller(frames)] += size
            phases[at[i]]["alive_by_caller"] = [[who, n] for who, n in by_caller.most_common(top)]
    return {
        "events": len(trace),
        "truncated": len(trace) >= max_entries,
        "units": "bytes requested (before the allocator's rounding; max_memory_allocated counts its blocks)",
        "phases": phases,
    }


def write(out_dir: str, rank: int) -> None:
    """At exit: stop recording and write ``memory-rank<rank>.json`` (nothing unless recording)."""
    if not _STATE["on"]:
        return
    import torch

    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    _STATE["on"] = False
    summary = summarise(snapshot, mark=_STATE.get("mark"))
    summary["max_memory_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
    write_json_atomic(os.path.join(out_dir, f"memory-rank{rank}.json"), summary, indent=1)
