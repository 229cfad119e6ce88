"""The planner's strategies, one module each behind one interface (:class:`base.Strategy`), and the registry that
names them: the one place a strategy's name is read. Adding one: docs/contributing.md."""

from __future__ import annotations

from tunelab.plan.model.case import PlanInput
from tunelab.plan.model.strategies.base import Strategy
from tunelab.plan.model.strategies.ddp import DDP
from tunelab.plan.model.strategies.fsdp1 import FSDP1
from tunelab.plan.model.strategies.fsdp2 import FSDP2
from tunelab.plan.model.strategies.single import Single
from tunelab.plan.model.strategies.zero import ZeRO

REGISTRY: dict[str, Strategy] = {
    "single": Single(),
    "ddp": DDP(),
    "fsdp1": FSDP1(),
    "fsdp2": FSDP2(),
    "deepspeed": ZeRO(),
}
"""Every strategy the planner models, by its key."""
NAMES = tuple(dict.fromkeys(strategy.name for strategy in REGISTRY.values()))
"""The names :attr:`PlanInput.strategy` takes (``fsdp``: FSDP1 where its root unit is kept, else FSDP2)."""
ONE_DEVICE = "single"
"""The choice of one device with no strategy file: litgpt's own command (advise's word for it)."""


def without_file(choice: str) -> bool:
    """Whether ``choice`` (a strategy file's name or :data:`ONE_DEVICE`) runs without a strategy file."""
    return choice in REGISTRY[ONE_DEVICE].files


def fields_of(config, world: int) -> dict:
    """:class:`PlanInput` fields for a strategy file's ``StrategyConfig`` on ``world`` devices (None: litgpt's own
    choice, one device or FSDP on several)."""
    if config is None:
        return {"strategy": ONE_DEVICE if world == 1 else "fsdp"}
    for strategy in REGISTRY.values():
        if config.name in strategy.files:
            return strategy.fields(config, world)
    raise ValueError(f"strategy {config.name!r} has no memory model")


def litgpt_defaults(name: str, world: int, lora: bool) -> dict:
    """What litgpt's own choice implies where a strategy file did not say: on several devices it checkpoints each
    block, full fine-tuning under FSDP1 (Lightning's FSDPStrategy, its root unit kept through backward), LoRA under
    FSDP2 (its root kept too, by torch's default since 2.8: ``reshard_after_forward=None``)."""
    fsdp = name == "fsdp"
    return {
        "activation_checkpointing": fsdp and world > 1,
        "fsdp_root_kept": fsdp and not lora,
        "fsdp2_root_kept": fsdp and lora,
    }


def of(case: PlanInput) -> Strategy:
    """The strategy that plans ``case`` (None plans as one device)."""
    name = case.strategy or ONE_DEVICE
    if name not in NAMES:
        raise ValueError(f"strategy {name!r} has no memory model; one of {', '.join(NAMES)}")
    if name == "fsdp":
        name = "fsdp1" if case.options.fsdp_root_kept else "fsdp2"
    return REGISTRY[name]
