"""The plan's optimizer states against torch's own optimizers: each class stepped once on the CPU, its states
counted (what a plan of that optimizer holds on the device)."""

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tunelab.plan.model import optimizers

SHAPES = [(6, 5), (5,), (3, 4)]


def _stepped_state_elements(name: str, init: dict) -> int:
    """State elements (scalars left out) torch's ``name`` keeps over :data:`SHAPES` after one step."""
    params = [torch.nn.Parameter(torch.randn(*shape)) for shape in SHAPES]
    opt = getattr(torch.optim, name)(params, lr=1e-3, **init)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    return sum(t.numel() for state in opt.state.values() for t in state.values() if torch.is_tensor(t) and t.dim())


CASES = [(name, {}) for name in optimizers.STATE_TENSORS] + [
    ("Adam", {"amsgrad": True}),
    ("AdamW", {"amsgrad": True}),
    ("SGD", {"momentum": 0.9}),
    ("RMSprop", {"momentum": 0.9}),
    ("RMSprop", {"momentum": 0.9, "centered": True}),
]


@pytest.mark.parametrize(("name", "init"), CASES, ids=[f"{n}-{'-'.join(i) or 'plain'}" for n, i in CASES])
def test_each_optimizers_state_count_is_torchs(name, init):
    elements = sum(torch.Size(shape).numel() for shape in SHAPES)
    assert optimizers.known(name) and optimizers.known(f"torch.optim.{name}")
    assert _stepped_state_elements(name, init) == optimizers.state_tensors(name, init) * elements


def test_a_factored_optimizer_keeps_row_and_column_means():
    """torch's Adafactor: a 6 x 5 matrix keeps 6 + 5 elements, a vector of 5 keeps 5 (not 2 x 41 as Adam)."""
    assert optimizers.known("Adafactor")
    assert _stepped_state_elements("Adafactor", {}) == optimizers.factored_elements(SHAPES) == 6 + 5 + 5 + 3 + 4


def test_the_classes_that_take_fused_are_those_whose_signature_has_it():
    """The fast path asks for ``fused=True``; litgpt's helper drops it for a class without the argument, whose step
    then runs for-each with its temporaries."""
    import inspect

    takes = {
        n
        for n in [*optimizers.STATE_TENSORS, *optimizers.FACTORED]
        if "fused" in inspect.signature(getattr(torch.optim, n)).parameters
    }
    assert takes == set(optimizers.FUSED) == {n for n in takes if optimizers.takes_fused(n)}


def test_a_class_outside_torch_optim_or_not_listed_is_not_known():
    assert not optimizers.known("bitsandbytes.optim.AdamW8bit") and not optimizers.known("LBFGS")
    assert not optimizers.known("mypackage.AdamW") and not optimizers.known("bitsandbytes.optim.AdamW")


class _LiveElements(TorchDispatchMode):
    """The most elements of new tensors alive at once while it is on (inputs' storages and scalars left out)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.seen: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in tree_flatten((args, kwargs))[0] if torch.is_tensor(a)}
        for t in tree_flatten(out)[0]:
            key = t.untyped_storage().data_ptr() if torch.is_tensor(t) and t.dim() else None
            if key is None or key in self.seen or key in inputs:
                continue
            self.seen.add(key)
            self.live += t.numel()
            self.peak = max(self.peak, self.live)
            weakref.finalize(t.untyped_storage(), self._freed, t.numel(), key)
        return out

    def _freed(self, numel: int, key: int) -> None:
        self.live -= numel
        self.seen.discard(key)


@pytest.mark.parametrize("name", sorted(optimizers.STEP_TEMPORARIES))
def test_each_optimizers_step_temporaries_are_torchs_for_each_step(name):
    """torch's for-each step (CUDA's default) of each class, its second step (the states exist) on the CPU: the most
    parameter-sized temporaries alive at once. AdamW's one (the square root of its second moment) is the term the
    plan's memory was measured with on GPUs; Adagrad's two would go uncounted under it."""
    params = [torch.nn.Parameter(torch.randn(*shape)) for shape in SHAPES]
    opt = getattr(torch.optim, name)(params, lr=1e-3, foreach=True)
    for _ in range(2):
        for p in params:
            p.grad = torch.randn_like(p)
        with _LiveElements() as live:
            opt.step()
    elements = sum(torch.Size(shape).numel() for shape in SHAPES)
    assert optimizers.step_temporaries(name) - 0.1 <= live.peak / elements <= optimizers.step_temporaries(name) + 0.01


def test_the_plan_counts_the_recipes_optimizer_states_and_step_temporaries():
    """TinyLlama full at bf16-true: AdamW's two moments and one temporary, Adagrad's one sum and two temporaries,
    Adafactor's row and column means (not Adam's two moments, which the plan assumed for any class it did not name)."""
    from tunelab.models import param_tensor_shapes
    from tunelab.plan.model import memory
    from tunelab.plan.recipe import plan_recipe
    from tunelab.recipes import resolve

    def states(optimizer: str) -> tuple[memory.ModelStates, list[str]]:
        overrides = ["--precision", "bf16-true", "--optimizer", optimizer]
        notes: list[str] = []
        return memory.model_states(
            plan_recipe(resolve("tiny-llama-1.1b/full"), overrides, gpu=None).input, notes
        ), notes

    config = plan_recipe(resolve("tiny-llama-1.1b/full"), [], gpu=None).input.config

    adam = states("AdamW")[0]
    assert adam.optimizer == 2 * 2 * adam.trainable and adam.step_temp == 2 * adam.trainable
    adagrad = states("Adagrad")[0]
    assert adagrad.optimizer == 2 * adagrad.trainable and adagrad.step_temp == 2 * 2 * adagrad.trainable
    adafactor, notes = states("torch.optim.Adafactor")
    factored = optimizers.factored_elements(param_tensor_shapes(config))
    assert adafactor.optimizer == 2 * factored and factored < adafactor.trainable / 100 and adafactor.step_temp > 0
    assert any("Adafactor: factored states" in n for n in notes)
    for name, temporaries in (("Adagrad", 0), ("RMSprop", 1)):  # fused where the class takes it, else for-each
        case = plan_recipe(resolve("tiny-llama-1.1b/full"), ["--optimizer", name], gpu=None).input
        fused = memory.model_states(case.changed(fused_optimizer=True), [])
        assert fused.step_temp == temporaries * fused.trainable * fused.s_param, name


BNB = [f"{family}{bits}" for family in optimizers.BNB_STATES for bits in ("", "32bit", "8bit")]
BNB_CPU_FAILS = {
    "AdEMAMix32bit": "bitsandbytes 0.50's CPU step of it fails on its own shapes; AdEMAMix, the same class"
}


@pytest.mark.parametrize("name", BNB)
def test_each_bitsandbytes_optimizers_state_bytes_are_its_own(name):
    """bitsandbytes' optimizers stepped once on the CPU, over a bf16 tensor of 8,192 elements (above its 8-bit minimum
    of 4,096; 32 blocks): float32 states whatever the parameter's dtype (the plan counted Adam's two in bf16, half
    of them), or uint8 with a float32 absmax a block; its quantile maps (shared, 1 KB) and LAMB's norm left out."""
    from tunelab.plan.model import memory

    bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is in requirements.txt; here it did not import")
    cls = getattr(bnb.optim, name, None)
    if cls is None or name in BNB_CPU_FAILS:
        pytest.skip(BNB_CPU_FAILS.get(name) or f"bitsandbytes {bnb.__version__} has no {name}")
    param = torch.nn.Parameter(torch.randn(128, 64, dtype=torch.bfloat16))
    kwargs = {"momentum": 0.9} if name.startswith(("SGD", "RMSprop", "LARS")) else {}  # bitsandbytes requires it
    opt = cls([param], lr=1e-3, **kwargs)
    param.grad = torch.randn_like(param)
    opt.step()
    states = {k: t for k, t in opt.state[param].items() if torch.is_tensor(t) and not k.startswith(("qmap", "unorm"))}
    case = type("Case", (), {"optimizer": f"bitsandbytes.optim.{name}"})()
    assert sum(t.numel() * t.element_size() for t in states.values()) == memory.optimizer_state_bytes(case, 8192, 2)


def test_a_strategy_that_flattens_the_parameters_gives_a_factored_optimizer_a_full_state():
    """FSDP1 steps each rank's slice of its flat parameters and ZeRO its fp32 partitions, 1-D both: Adafactor keeps a
    vector's full state there (FSDP2's shards keep their shapes). ZeRO keeps the optimizer's own states in fp32
    (Adagrad one, not Adam's two)."""
    from tunelab.plan.model import memory
    from tunelab.plan.recipe import plan_recipe
    from tunelab.recipes import resolve

    def states(optimizer: str, **fields) -> memory.ModelStates:
        case = plan_recipe(
            resolve("tiny-llama-1.1b/full"), ["--precision", "bf16-true", "--optimizer", optimizer], gpu=None
        )
        return memory.model_states(case.input.changed(devices=2, **fields) if fields else case.input, [])

    one = states("torch.optim.Adafactor")
    assert 0 < one.optimizer < one.trainable * 2 / 100  # factored
    assert states("torch.optim.Adafactor", strategy="fsdp", fsdp_root_kept=True).optimizer == one.trainable * 2  # FSDP1
    assert states("torch.optim.Adafactor", strategy="fsdp", fsdp_root_kept=False).optimizer == one.optimizer  # FSDP2
    zero = states("Adagrad", strategy="deepspeed", zero_stage=2)
    assert zero.optimizer == zero.trainable * 4 and zero.master == zero.trainable * 4
    assert states("torch.optim.Adafactor", strategy="deepspeed", zero_stage=2).optimizer == zero.trainable * 4


@pytest.mark.parametrize(
    ("value", "on"),
    [(0.9, True), (0, False), ("0.9", True), ("0.0", False), ("false", False), (True, True), (None, False)],
)
def test_an_option_read_from_text_is_on_as_torch_would_take_it(value, on):
    """A YAML or command line may give ``momentum: "0.0"`` or ``amsgrad: "false"``: no state is added for them."""
    assert optimizers.is_set(value) is on
    assert optimizers.state_tensors("SGD", {"momentum": value}) == int(on)


def test_adams_amsgrad_step_is_traced_with_its_host_reads_of_the_step_counters(configs):
    """Adam with amsgrad is traced as its own step (a third state read and written each step) and keeps AdamW's
    host work per trainable tensor (its for-each step reads each step counter on the host, as AdamW's does)."""
    from tunelab.plan.model import kernels
    from tunelab.plan.trace.tables import TRACED

    config = configs["tiny-llama-1.1b"]
    plain, ams = (
        kernels.step_time(kernels.Step(config, "full", "bf16-true", 1, 128, name), "H100-SXM", tables=TRACED)
        for name in ("AdamW", "torch.optim.Adam amsgrad")
    )
    extra = {t.ops_by_phase["optimizer"] - t.host_ops("optimizer") for t in (plain, ams)}
    assert len(extra) == 1 and extra.pop() < -100  # the same host reads beside each one's kernels
    assert ams.gpu_by_phase["optimizer"] > plain.gpu_by_phase["optimizer"]  # its third state read and written


class _ScalarReads(TorchDispatchMode):
    """Counts the reads of a tensor's value on the host (``aten._local_scalar_dense``: ``.item()``)."""

    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.reads += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", sorted(optimizers.STEP_COUNTER_READS))
def test_each_classes_step_counter_reads_are_torchs(name):
    """torch's for-each step without ``capturable`` reads each tensor's step counter on the host as many times as the
    table says (AdamW twice: the two bias corrections; NAdam and RAdam five times; RMSprop never)."""
    params = [torch.nn.Parameter(torch.randn(*shape)) for shape in SHAPES]
    opt = getattr(torch.optim, name)(params, lr=1e-3, foreach=True, **({"momentum": 0.9} if name == "SGD" else {}))
    for _ in range(2):
        for p in params:
            p.grad = torch.randn_like(p)
        with _ScalarReads() as counted:
            opt.step()
    assert counted.reads == optimizers.STEP_COUNTER_READS[name] * len(SHAPES)


def test_the_kernel_model_scales_adamws_host_work_by_the_step_counter_reads(configs):
    """NAdam reads each step counter five times where AdamW reads it twice: 2.5x AdamW's host work per tensor beside
    its kernels; RMSprop none."""
    from tunelab.plan.model import kernels
    from tunelab.plan.trace.tables import TRACED

    def beside(name: str) -> int:
        t = kernels.step_time(
            kernels.Step(configs["tiny-llama-1.1b"], "full", "bf16-true", 1, 128, name), "H100-SXM", tables=TRACED
        )
        return t.host_ops("optimizer") - t.ops_by_phase["optimizer"]

    adamw = beside("AdamW")
    assert adamw > 100 and beside("torch.optim.NAdam") == pytest.approx(2.5 * adamw, abs=1)
    assert beside("torch.optim.RMSprop") == 0
