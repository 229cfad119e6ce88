"""`tunelab bench` on CPU: litgpt's own command and tunelab's fast path side by side on the tiny model, the report
written from the records, and the records reused by a second call."""

from __future__ import annotations

import contextlib
import io

from tunelab import cli


def bench(argv: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli.main(argv) == 0
    return buf.getvalue()


def test_a_fast_run_whose_blocks_ran_eagerly_leaves_the_ratios():
    """A fast run that hit torch.compile's recompile limit (some blocks eager: a slower loop than its strategy says)
    is refused like one that recompiled in the loop: its pair leaves the ratios, and the reason names the limit."""
    from tunelab.record import RunRecord
    from tunelab.tune.bench import Arm, Phase, refused

    def rec(tok: float, hits: int | None = None) -> RunRecord:
        return RunRecord(status="ok", tok_s_real=tok, graphs_compiled_in_loop=0, recompile_limit_hits=hits)

    lit, fast = Arm("litgpt", None), Arm("fast", "fast")
    lit.records = [(0, rec(100.0), None), (1, rec(100.0), None)]
    fast.records = [(0, rec(300.0, 0), None), (1, rec(200.0, 2), None)]
    assert Phase("recipe", [lit, fast]).ratios() == [3.0]
    assert "recompile limit 2 time(s)" in refused(fast.records[1][1]) and refused(fast.records[0][1]) is None
