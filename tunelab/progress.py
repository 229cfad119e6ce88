"""The progress line of long work (``run``, ``sweep``, ``tune-batch``): which run of how many, the current run's
iteration, optimizer step and tokens/s, elapsed time and an estimate of the time left.

On a terminal the line is rewritten in place; otherwise (a log file, CI) it is printed every ``every_s`` seconds.
The runner feeds it :class:`tunelab.run.runner.Progress` snapshots through ``on_progress``.
"""

from __future__ import annotations

import sys
import time


def fmt_time(seconds: float) -> str:
    """Seconds as H:MM:SS."""
    whole = int(max(0, seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


class ProgressLine:
    """One status line on stderr for ``total`` runs (None: not known in advance, as for tune-batch's probes)."""

    def __init__(self, total: int | None, stream=sys.stderr, every_s: float = 10.0):
        self.total, self.stream, self.every_s = total, stream, every_s
        self.tty = stream.isatty()
        self.t0 = time.monotonic()
        self.durations: list[float] = []
        self.last_print = 0.0
        self.done, self.label, self.run_t0 = 0, "", self.t0

    def started(self, done: int, label: str, show: bool = True) -> None:
        """A run begins; ``done`` runs are finished before it; ``label`` names it (row id and recipe). ``show``
        False: print nothing until the run reports progress (a run refused before launch stays one line)."""
        self.done, self.label, self.run_t0 = done, label, time.monotonic()
        if show:
            self.show(None, force=True)

    def show(self, p=None, force: bool = False) -> None:
        """Print the line for progress snapshot ``p`` (iteration, step, tok/s), at most every ``every_s`` off a
        terminal."""
        now = time.monotonic()
        if not force and not self.tty and now - self.last_print < self.every_s:
            return
        self.last_print = now
        left = None if self.total is None else self.total - self.done
        mean = (sum(self.durations) / len(self.durations)) if self.durations else None
        eta = f"~{fmt_time(mean * left - (now - self.run_t0))}" if mean and left is not None else "?"
        count = f"[{self.done} done]" if left is None else f"[{self.done}/{self.total} done, {left} left]"
        it, step = (p.iter, p.step) if p is not None else (0, 0)
        speed = f" | {p.tok_s:,.0f} tok/s" if p is not None and p.tok_s else ""
        line = (
            f"{count} {self.label} | iter {it} step {step}{speed} | elapsed {fmt_time(now - self.t0)} | remaining {eta}"
        )
        self.stream.write(("\r\033[K" + line) if self.tty else (line + "\n"))
        self.stream.flush()

    def completed(self) -> None:
        """A unit of work without a run record ended (a simulated case): counted, and its time feeds the estimate
        of what remains."""
        self.durations.append(time.monotonic() - self.run_t0)
        self.done += 1

    def finished(self, rec) -> None:
        """A run ended with record ``rec``: one line with its status, error, speed and time."""
        self.durations.append(time.monotonic() - self.run_t0)
        self.done += 1
        msg = (
            f"{rec.row_id}: {rec.status}"
            + (f" ({rec.error})" if rec.error else "")
            + (f" | {rec.tok_s_padded:,.0f} tok/s padded" if rec.tok_s_padded else "")
            + f" | {rec.wall_s:.0f} s"
        )
        self.stream.write(("\r\033[K" if self.tty else "") + msg + "\n")
        self.stream.flush()
