"""The plan a run record carries, and the one place that plans a finished run again.

The runner plans each run once, before it launches, from the Settings and strategy it launches (:func:`for_run`),
for the GPU the launching machine has (memory, fit, largest micro batch and, on a GPU the table knows, the time by
cause), and stores it in the record (``RunRecord.plan``). A report then prints that plan beside the measurement:
the prediction made for that run, whatever the planner has become since. Records made before plans were stored
(schema 3 and older) have none; :func:`of_record` plans them again with today's planner from their recipe and
overrides and says so (``TODAYS``): the only re-planning from a record's override strings in the package.
"""

from __future__ import annotations

import dataclasses
import math

from tunelab import hardware
from tunelab.errors import InputError
from tunelab.plan import recipe as recipe_mod
from tunelab.plan.model import fast_step
from tunelab.plan.projection import project_recipe
from tunelab.recipes import resolve
from tunelab.record import RunRecord, StoredPlan

STORED = "stored"
"""The plan came from the record: made before its run."""
TODAYS = "today's planner"
"""The record holds no plan (made before plans were stored): planned now, from its recipe and overrides."""
REFUSED = (InputError, ValueError, KeyError, OSError)
"""What planning a run may raise for a configuration the planner refuses or cannot read (a recipe or checkpoint
gone, a model litgpt does not know): a plan that cannot be made is a missing prediction, never a lost run or
report."""


def from_planned(planned, projection, planner: str) -> StoredPlan:
    """The stored form of a :class:`tunelab.plan.recipe.PlannedRecipe` (and its projection, or None)."""
    plan = planned.plan
    causes = (projection.seconds_by_cause or {}) if projection is not None else {}
    seconds = projection.seconds if projection is not None else None
    if seconds is not None and not (math.isfinite(seconds) and all(map(math.isfinite, causes.values()))):
        seconds, causes = None, {}  # a time the model could not put a number on: none stored (records are finite)
    return StoredPlan(
        planner=planner,
        gpu=plan.gpu,
        peak_allocated_bytes=int(plan.peak_allocated_bytes),
        predicted_reserved_bytes=int(plan.predicted_reserved_bytes),
        breakdown_bytes={k: int(v) for k, v in plan.breakdown_bytes.items()},
        fits=plan.fits if plan.gpu else None,
        max_micro_batch_size=plan.max_micro_batch_size if plan.gpu else None,
        seconds=seconds,
        seconds_by_cause={k: float(v) for k, v in causes.items()},
    )


def for_run(settings, strategy, device_name: str | None, planner: str) -> tuple[StoredPlan | None, str | None]:
    """(the plan, None) of a run about to launch: its resolved ``settings`` under its loaded ``strategy`` (None:
    litgpt's own choice) on the GPU ``device_name`` names (None, or a board the table does not know: memory only);
    (None, the planner's one line) when the planner refuses it, or a fault of the planner's own (the run goes on:
    the plan is a prediction beside it, never a reason to lose it). ``planner``: what made it (version and commit)."""

    try:
        gpu = hardware.identify(device_name) if device_name else None
        planned = recipe_mod.plan_settings(settings, gpu=gpu, strategy=strategy)
        projection = project_recipe(planned, gpu)[0] if gpu is not None else None
    except REFUSED as e:
        return None, f"{type(e).__name__}: {str(e)[:300]}"
    except Exception as e:  # noqa: BLE001 - a fault of the planner must not cost the run: kept in the record
        return None, f"planner fault, not the run's: {type(e).__name__}: {str(e)[:300]}"
    return from_planned(planned, projection, planner), None


def todays_plan(rec: RunRecord, gpu: hardware.GPU | None, strategy=...):
    """Today's planner on a finished run's recipe and overrides (a :class:`tunelab.plan.recipe.PlannedRecipe`), for
    ``gpu`` (None: no verdict), under ``strategy`` (a loaded StrategyConfig or a file; default: the record's own
    file): what the planner-accuracy reports check against measurements, and what :func:`of_record` falls back to.
    Its loop reads the fused loss back as the run's did (``fused_loss_reads``; a record without the field ran
    Liger's own wrapper). Raises what the planner raises for a recipe it refuses (:data:`REFUSED`)."""

    chosen = rec.strategy_file if strategy is ... else strategy
    planned = recipe_mod.plan_recipe(resolve(rec.recipe), list(rec.overrides), gpu=gpu, strategy=chosen)
    if not planned.input.loop.fused_loss:
        return planned
    reads = fast_step.LIGER_WRAPPER_READS if rec.fused_loss_reads is None else rec.fused_loss_reads
    return dataclasses.replace(planned, input=planned.input.changed(fused_loss_reads=reads))


def of_record(rec: RunRecord, gpu: hardware.GPU) -> tuple[StoredPlan | None, str]:
    """(the plan for ``rec`` on ``gpu``, where it came from: :data:`STORED` or :data:`TODAYS`); (None, why) when
    the record has no plan for ``gpu`` and today's planner refuses its recipe and overrides."""
    if rec.plan is not None and rec.plan.gpu == gpu.name:
        return rec.plan, STORED
    try:
        planned = todays_plan(rec, gpu)
    except REFUSED as e:
        return None, f"not planned ({type(e).__name__}: {str(e)[:200]})"
    return from_planned(planned, None, TODAYS), TODAYS
