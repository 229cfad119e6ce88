"""What an optimizer keeps per trainable parameter, by class: the states of each ``torch.optim`` class litgpt can
build and of bitsandbytes' families, the temporaries of a for-each step, which classes take ``fused`` and which the
tracer cannot follow. Each table is checked against the library's own optimizers in tests/plan/test_optimizers.py;
the memory model turns them into bytes (:func:`tunelab.plan.model.memory.optimizer_state_bytes`)."""

from __future__ import annotations

import math

STATE_TENSORS = {
    "Adam": 2,
    "AdamW": 2,
    "Adamax": 2,
    "NAdam": 2,
    "RAdam": 2,
    "Adadelta": 2,
    "Adagrad": 1,
    "ASGD": 1,
    "RMSprop": 1,
    "SGD": 0,
}
"""Parameter-sized state tensors each ``torch.optim`` class keeps per trainable tensor once it has stepped, in the
parameter's dtype (scalars such as ``step`` left out), before :data:`OPTION_STATES`."""
OPTION_STATES = {"Adam": ("amsgrad",), "AdamW": ("amsgrad",), "SGD": ("momentum",), "RMSprop": ("momentum", "centered")}
"""Init arguments that each add one parameter-sized state when set: the maximum of the second moment (``amsgrad``),
the momentum buffer (``momentum`` above 0), the mean gradient (``centered``)."""
STEP_TEMPORARIES = {
    "Adam": 1,
    "AdamW": 1,
    "Adamax": 1,
    "NAdam": 1,
    "RAdam": 1,
    "ASGD": 1,
    "RMSprop": 1,
    "Adafactor": 1,
    "Adagrad": 2,
    "Adadelta": 2,
    "SGD": 0,
}
"""Parameter-sized temporaries alive at once in each class's for-each step (torch's default on CUDA); a fused step
has none. Rprop is in neither table: its step's boolean masks make its temporaries depend on the dtype, the shapes
and the device (1.1 to 2.3 parameter sizes measured), and it is no fine-tuning optimizer."""
STEP_COUNTER_READS = {
    "Adam": 2,
    "AdamW": 2,
    "Adamax": 1,
    "Adagrad": 1,
    "NAdam": 5,
    "RAdam": 5,
    "Adadelta": 0,
    "RMSprop": 0,
    "SGD": 0,
}
"""Reads of each trainable tensor's step counter on the host (``.item()``) in a class's for-each step without
``capturable`` (torch's default): the Python work per tensor that the kernel model scales AdamW's fitted host work by
(:data:`tunelab.plan.model.kernels.ADAM_FOREACH_HOST_OPS_PER_TENSOR`, for its 2)."""
FUSED = ("Adam", "AdamW", "Adagrad", "SGD")
"""Classes that take ``fused=True`` (one kernel over every tensor, no temporaries): tunelab's fast path asks for it,
and litgpt's helper passes it only to a class whose signature has it."""
HOST_READS = ("ASGD", "Adafactor")
"""Classes whose step reads a tensor's value on the host (``.item()``): not traced on fake tensors, so neither
simulated nor timed by kernel (their time by the fitted curve; their memory is counted as the tables here say)."""
FACTORED = ("Adafactor",)
"""Classes whose second moment is factored: a matrix keeps its row and column means, a vector a state of its size."""


BNB_STATES = {
    "Adam": 2,
    "AdamW": 2,
    "AdEMAMix": 3,
    "LAMB": 2,
    "Lion": 1,
    "SGD": 1,
    "RMSprop": 1,
    "Adagrad": 1,
    "LARS": 1,
}
"""Parameter-sized states each ``bitsandbytes.optim`` family keeps (AdEMAMix: two first moments and a second; SGD,
RMSprop and LARS: their momentum, which bitsandbytes requires), whatever the parameter's dtype: float32 for the
plain and ``32bit`` classes, one byte an element for ``8bit`` ones (with a float32 absmax per
:data:`tunelab.plan.model.memory.EIGHT_BIT_BLOCK` elements). The ``Paged`` classes keep the same states outside
torch's allocator (:func:`tunelab.plan.model.memory.paged_optimizer_device_states`)."""


def bnb_states(optimizer: str) -> tuple[int, bool] | None:
    """(states, 8-bit) of a bitsandbytes optimizer of :data:`BNB_STATES` (``bitsandbytes.optim.AdamW8bit``), else
    None."""
    module, _, name = str(optimizer).rpartition(".")
    return bnb_class_states(name) if module == "bitsandbytes.optim" else None


def bnb_class_states(name: str) -> tuple[int, bool] | None:
    """(states, 8-bit) of a bitsandbytes class by its name (``PagedAdamW8bit``: its family's, 8-bit), else None."""
    family = name.removeprefix("Paged").removesuffix("8bit").removesuffix("32bit")
    return (BNB_STATES[family], name.endswith("8bit")) if family in BNB_STATES else None


def class_name(optimizer: str) -> str:
    """The class of a recipe's optimizer name (``AdamW``, ``torch.optim.AdamW``)."""
    return str(optimizer).rsplit(".", 1)[-1]


def known(optimizer: str) -> bool:
    """Whether the states of ``optimizer`` are counted here (a torch.optim class of :data:`STATE_TENSORS` or
    :data:`FACTORED`)."""
    module = str(optimizer).rpartition(".")[0]
    name = class_name(optimizer)
    return module in ("", "torch.optim") and (name in STATE_TENSORS or name in FACTORED)


def state_tensors(optimizer: str, init: dict) -> int:
    """Parameter-sized states per trainable tensor of a :func:`known` optimizer that is not :data:`FACTORED`."""
    name = class_name(optimizer)
    return STATE_TENSORS[name] + sum(1 for option in OPTION_STATES.get(name, ()) if is_set(init.get(option)))


def is_set(value) -> bool:
    """Whether an init argument turns its option on: a number other than 0, true, or text that reads as either
    (``"0.9"``, ``"true"``; ``"0.0"`` and ``"false"`` are off)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("true", "yes", "on"):
            return True
        try:
            return float(text) != 0
        except ValueError:
            return False
    return bool(value)


def factored_elements(shapes: list[tuple[int, ...]]) -> int:
    """State elements of a :data:`FACTORED` optimizer over tensors of ``shapes``: a tensor of two or more dimensions
    keeps its mean over the last dimension and over the one before it; a vector one state of its size."""
    total = 0
    for shape in shapes:
        if len(shape) < 2:
            total += math.prod(shape)
        else:
            total += math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]
    return total


def step_temporaries(optimizer: str) -> float:
    """Parameter-sized temporaries of a :func:`known` optimizer's for-each step (:data:`STEP_TEMPORARIES`)."""
    return STEP_TEMPORARIES[class_name(optimizer)]


def takes_fused(optimizer: str) -> bool:
    """Whether a :func:`known` optimizer's class takes ``fused=True`` (:data:`FUSED`)."""
    return known(optimizer) and class_name(optimizer) in FUSED


TRACED_PREFIX = "torch.optim."
"""How a traced name of a :func:`known` class begins (:func:`traced_name`; read back by :func:`traced_class`)."""


def traced_name(optimizer: str, init: dict) -> str | None:
    """The name a :func:`known` class other than AdamW and SGD is traced under (``torch.optim.RMSprop momentum``:
    the class and the options that add states), or None where it is not traced (:data:`HOST_READS`)."""
    name = class_name(optimizer)
    if not known(optimizer) or name in HOST_READS:
        return None
    return " ".join([f"{TRACED_PREFIX}{name}", *(o for o in OPTION_STATES.get(name, ()) if is_set(init.get(o)))])


def traced_class(traced: str) -> tuple[str, dict] | None:
    """(class name, init arguments that turn its options on) of a :func:`traced_name`, else None: what the tracer
    builds (momentum 0.9, flags true)."""
    if not traced.startswith(TRACED_PREFIX):
        return None
    name, *options = traced.removeprefix(TRACED_PREFIX).split()
    return name, {option: 0.9 if option == "momentum" else True for option in options}


def states_per_parameter(optimizer: str, init: dict, trainable: int, shapes: list | None = None) -> float:
    """Parameter-sized states per trainable parameter: bitsandbytes' (:data:`BNB_STATES`), a :func:`known` class's
    (:func:`state_tensors`; a factored one's row and column means over the trainable tensors' ``shapes``, or one state
    where it steps flattened 1-D shards: ``shapes`` None), else Adam's two."""
    if bnb := bnb_states(optimizer):
        return bnb[0]
    if not known(optimizer):
        return 2
    if class_name(optimizer) in FACTORED:
        return factored_elements(shapes) / trainable if shapes is not None and trainable else 1
    return state_tensors(optimizer, init)


def host_reads_per_tensor(traced: str) -> int:
    """:data:`STEP_COUNTER_READS` of a traced optimizer name (``AdamW``, ``torch.optim.NAdam``; 0: a fused step,
    SGD, bitsandbytes' paged AdamW, whose Python work per tensor the model counts apart)."""
    if traced == "AdamW":
        return STEP_COUNTER_READS["AdamW"]
    built = traced_class(traced)
    return STEP_COUNTER_READS.get(built[0], 0) if built else 0
