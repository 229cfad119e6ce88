"""What is alive in GPU memory at a run's peaks, from CUDA's allocator history (opt-in: ``TUNELAB_MEMORY_HISTORY=1``).

With the variable set, each rank records torch's allocator history from its start
(``torch.cuda.memory._record_memory_history``, Python stacks only), marks the first training batch, and at exit
writes ``memory-rank<N>.json`` beside ``rank<N>.json``: for the "loaded" phase (model, optimizer, quantization and
litgpt's sanity validation, before the first training batch) and for the rest of the run, the peak of the bytes
requested from the allocator, replayed from the history, and at that moment those bytes grouped by the first caller
outside torch that asked for them (file:line function). The history records requested sizes (the planner's
quantity); ``max_memory_allocated``, written beside them, counts the allocator's blocks (rounded up to 512 bytes,
sometimes a split remainder more), so it is the larger. The snapshot stays in memory: nothing is pickled or read.

Costs host memory and time (a stack per allocation): a measurement run, not a benchmark. Without CUDA it is a no-op
with one line on stderr. A history longer than ``MAX_ENTRIES`` loses its start; the file then says ``truncated``.
"""

from __future__ import annotations

import os
import sys
from collections import Counter

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
    for f in frames:
        name = str(f.get("filename", ""))
        if "/torch/" not in name and not name.startswith("<"):
            short = name.split("site-packages/")[-1]
            return f"{short}:{f.get('line')} {f.get('name')}"
    if frames:
        f = frames[0]
        return f"{str(f.get('filename', '')).split('site-packages/')[-1]}:{f.get('line')} {f.get('name')}"
    return "?"


def summarise(snapshot: dict, max_entries: int = MAX_ENTRIES, top: int = TOP, mark: int | None = None) -> dict:
    """Replay a snapshot's history into the peak of each phase and what is alive there: an 'alloc' adds its size, a
    'free_requested' takes it away (when the allocator's own allocated count drops; 'free_completed', when the block
    may be reused, can come later for memory another stream used).

    Phases: "loaded" until event number ``mark`` (the history's length at the first training batch), or without
    it until the first 'snapshot' event; "training" after. Sizes are the bytes requested, as the history records
    them."""
    traces = [t for t in snapshot.get("device_traces", []) if t]
    trace = max(traces, key=len) if traces else []
    live: dict[int, tuple[int, str]] = {}
    by_caller: Counter = Counter()
    current = 0
    phase = "loaded"
    best: dict[str, tuple[int, Counter]] = {"loaded": (0, Counter()), "training": (0, Counter())}
    for i, e in enumerate(trace):
        action = e.get("action")
        if (i >= mark) if mark is not None else action == "snapshot":
            phase = "training"
        if action == "alloc":
            size, who = int(e["size"]), caller(e.get("frames") or [])
            live[e["addr"]] = (size, who)
            by_caller[who] += size
            current += size
            if current > best[phase][0]:
                best[phase] = (current, +by_caller)
        elif action == "free_requested" and e.get("addr") in live:
            size, who = live.pop(e["addr"])
            by_caller[who] -= size
            current -= size
    return {
        "events": len(trace),
        "truncated": len(trace) >= max_entries,
        "units": "bytes requested (before the allocator's rounding; max_memory_allocated counts its blocks)",
        "phases": {
            name: {"peak_bytes": peak, "alive_by_caller": [[who, n] for who, n in alive.most_common(top)]}
            for name, (peak, alive) in best.items()
        },
    }


def write(out_dir: str, rank: int) -> None:
    """At exit: stop recording and write ``memory-rank<rank>.json`` (nothing unless recording)."""
    if not _STATE["on"]:
        return
    import torch

    from tunelab.files import write_json_atomic

    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    _STATE["on"] = False
    summary = summarise(snapshot, mark=_STATE.get("mark"))
    summary["max_memory_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
    write_json_atomic(os.path.join(out_dir, f"memory-rank{rank}.json"), summary, indent=1)
