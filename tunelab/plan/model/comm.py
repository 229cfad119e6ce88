"""Communication of a multi-device run: the bytes each device moves per optimizer step under its strategy, over the
links of ``configs/hardware/links.yaml``, and the seconds of it that compute does not hide.

:func:`per_step` builds the symbols (:class:`tunelab.plan.model.strategies.base.Sizes`), asks the case's strategy
object for its volumes and calls (``Strategy.volumes``: ring all-reduce 2(n-1)/n, all-gather and reduce-scatter
(n-1)/n of the bytes), adds NCCL's ring latency per call (:data:`BASE_LATENCY_S` plus the link's latency per ring
step), runs a ring that spans nodes at the network's speed, and :meth:`Comm.exposed` says what the schedule leaves
unhidden (k equal calls beside a window W end max(C/k, C - W (1 - 1/k)) after it). The formulas per strategy and
the links' sources: docs/planner.md, "Communication"."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache

from tunelab import yaml_input
from tunelab.errors import InputError
from tunelab.models import count_params, lora_param_count
from tunelab.paths import CONFIGS_DIR
from tunelab.plan.model import strategies
from tunelab.plan.model.case import PlanInput
from tunelab.plan.model.strategies.base import Sizes, Strategy
from tunelab.plan.model.strategies.fsdp1 import flat_parameter_frozen_grad_elements
from tunelab.units import GB

LINK_TABLE = CONFIGS_DIR / "hardware" / "links.yaml"
BASE_LATENCY_S = 8.4e-6
"""NCCL's base latency of a ring collective, Simple protocol (``baseLat`` in src/graph/tuning.cc, in us there)."""
BACKWARD_SHARE = 2 / 3
"""Share of a step's matmul FLOPs in the backward pass (4 of the 6 FLOPs per parameter and token)."""


SCHEDULES = {
    "backward": "its buckets run beside the last micro batch's backward, which fills them",
    "step": "each unit's collectives run beside the forward and backward passes of its neighbours",
    "none": "hidden behind no compute (one unit gathered before the forward and reduced after the backward; "
    "DeepSpeed's reductions on the compute stream)",
}
"""What each :attr:`Comm.hideable_under` runs beside, in words (``tunelab plan`` prints it)."""


@dataclass(frozen=True)
class Link:
    """One row of the link table."""

    name: str
    """The table's key, e.g. ``nvlink4``."""
    scope: str
    """gpu (between the GPUs of a node), node (between nodes, shared by the node's GPUs) or host (GPU <-> RAM)."""
    gbs: float
    """Peak bandwidth per direction, GB/s (per GPU; per node for scope node)."""
    efficiency: float
    """Fraction of the peak a ring collective reaches."""
    source: str
    """Where the peak comes from."""
    latency_us: float = 0.0
    """Latency per ring step over this link, us (NCCL's ``hwLat``, ring, Simple protocol); host copies: none
    modelled."""

    @property
    def bytes_per_s(self) -> float:
        """Achieved bandwidth, bytes/s."""
        return self.gbs * GB * self.efficiency


@lru_cache(maxsize=1)
def table() -> dict[str, Link]:
    """The links of ``configs/hardware/links.yaml``, checked (positive bandwidth, efficiency in (0, 1])."""
    raw = yaml_input.load_mapping(LINK_TABLE, "the link table").get("links") or {}
    out = {}
    for name, row in raw.items():
        where = f"{LINK_TABLE}: links: {name}"
        keys = {"scope", "gbs", "efficiency", "source"} | (
            {"latency_us"} if isinstance(row, dict) and row.get("scope") != "host" else set()
        )
        if not isinstance(row, dict) or set(row) != keys:
            raise InputError(
                f"{where}: not a link row; fix: give exactly scope, gbs, efficiency, source and (gpu and node links) "
                "latency_us"
            )
        gbs, eff, lat = row["gbs"], row["efficiency"], row.get("latency_us", 0.0)
        if row["scope"] not in ("gpu", "node", "host"):
            raise InputError(f"{where}: scope: {str(row['scope'])[:40]!r} is not a scope; fix: gpu, node or host")
        if type(gbs) not in (int, float) or not (0 < gbs < 1e5) or type(eff) not in (int, float) or not 0 < eff <= 1:
            raise InputError(
                f"{where}: gbs or efficiency out of range; fix: gbs a positive GB/s, efficiency within (0, 1]"
            )
        if type(lat) not in (int, float) or not 0 <= lat < 1e4:
            raise InputError(f"{where}: latency_us out of range; fix: a number of microseconds, 0 or more")
        out[name] = Link(name, row["scope"], float(gbs), float(eff), str(row["source"]), float(lat))
    return out


OPTIONS = {"gpu": "--interconnect", "node": "--internode"}
"""The command-line option that names a link of each scope."""


def lookup(name: str, scope: str, given: bool = False) -> Link:
    """A link of the table by name and scope; InputError naming the ones there are (``given``: the user named it,
    so the error names the option too)."""
    links = table()
    if name in links and links[name].scope == scope:
        return links[name]
    known = ", ".join(k for k, v in links.items() if v.scope == scope)
    option = f"{OPTIONS.get(scope, 'link')} {name}: " if given else ""
    raise InputError(f"{option}unknown {scope} link {name!r}; fix: one of {known} (configs/hardware/links.yaml)")


@dataclass
class Comm:
    """Bytes one device moves per optimizer step over each link, and the seconds they take."""

    bytes_gpu: float = 0.0
    """Over the links between the GPUs of a node."""
    bytes_node: float = 0.0
    """Over the network between nodes (the part of a ring that crosses it)."""
    bytes_host: float = 0.0
    """Between the GPU and host RAM (CPU offload)."""
    hideable_under: str = "backward"
    """The compute the traffic runs beside, by its schedule: 'backward' (gradient buckets, issued as the last micro
    batch's backward fills them), 'step' (per-unit gathers ahead of the unit that needs them, beside the forward and
    backward passes; reduce-scatters beside the next unit's backward) or 'none' (FSDP with one unit, DeepSpeed's
    ZeRO-1 and ZeRO-2 with ``overlap_comm`` off)."""
    pipelined: int = 0
    """Collective calls per optimizer step that pipeline with that compute (buckets, units' gathers and
    reduce-scatters; 0: every call of :attr:`calls`): the last of them waits for the window's end."""
    unhidden: float = 0.0
    """Share of the GPU and network traffic no compute hides where the rest pipelines (ZeRO-3's gradient
    reduce-scatters, on the compute stream beside its prefetched gathers)."""
    seconds: float = 0.0
    """Seconds of communication per optimizer step (no overlap)."""
    host_s: float = 0.0
    """Of :attr:`seconds`, the host link's (offload's copies: hidden behind nothing here)."""
    links: dict = field(default_factory=dict)
    """The links used: {'gpu': name, 'node': name, 'host': name}."""
    formula: str = ""
    """The volume in words."""
    calls: list = field(default_factory=list)
    """The collective calls per optimizer step: (kind, calls, ring steps per call, of them across nodes)."""
    latency_s: float = 0.0
    """Seconds per step of the calls' latency (in :attr:`seconds`)."""
    forward_bytes: float = 0.0
    """Bytes per device one forward without gradients gathers (a validation batch, a generated token): not in
    :attr:`seconds`, which is the training step's."""
    forward_s: float = 0.0
    """Seconds those gathers take, their calls' latency included."""

    def exposed(self, backward_s: float, passes_s: float) -> float:
        """Seconds per optimizer step the communication adds beyond the compute, by its schedule. ``backward_s``:
        one micro batch's backward (the last: gradients sync there); ``passes_s``: the forward and backward passes
        of every micro batch of the step. :attr:`pipelined` equal calls beside a window W, each ready W/k after the
        last and taking C/k on its own stream, end max(C/k, C - W (1 - 1/k)) after the window: the last call when
        the link keeps up, else what the window could not hold; :attr:`unhidden` and the host's copies add whole."""
        window = {"backward": backward_s, "step": passes_s}.get(self.hideable_under, 0.0)
        wire = self.seconds - self.host_s
        held = wire * self.unhidden
        c, k = wire - held, max(self.pipelined, 1)
        return max(c / k, c - max(window, 0.0) * (1 - 1 / k)) + held + self.host_s

    def scaled(self, factor: float) -> Comm:
        """This traffic over links ``factor`` times as slow (bandwidth only: the calls' latency stays)."""
        bandwidth = (self.seconds - self.latency_s) * factor
        return dataclasses.replace(self, seconds=bandwidth + self.latency_s, host_s=self.host_s * factor)


def call_latency(steps: int, across: int, gpu_link: Link, node_link: Link | None) -> float:
    """NCCL's ring latency of one call of ``steps`` ring steps, ``across`` of them between nodes."""
    net = node_link.latency_us if node_link is not None else 0.0
    return BASE_LATENCY_S + ((steps - across) * gpu_link.latency_us + across * net) * 1e-6


def calls_latency(calls: list, gpu_link: Link, node_link: Link | None) -> float:
    """Seconds of NCCL's ring latency over ``calls`` (:attr:`Comm.calls`' rows)."""
    return sum(k * call_latency(steps, across, gpu_link, node_link) for _, k, steps, across in calls)


def per_step(
    case: PlanInput,
    gpu_link: Link,
    node_link: Link | None = None,
    host_link: Link | None = None,
    *,
    params: tuple[int, int] | None = None,
    param_bytes: int | None = None,
) -> Comm:
    """The communication of one optimizer step of ``case`` (its strategy, devices, nodes, accumulation).

    ``params``: (total, trainable) parameter counts instead of those of ``case.config`` (a model given by its size
    only); ``param_bytes``: bytes per gathered parameter and gradient instead of the precision's (4 under mixed
    precision, whose FSDP keeps float32 parameters; 2 where a framework gathers 16-bit copies)."""
    strategy = strategies.of(case)
    z = _sizes(case, strategy, params, param_bytes)
    c = Comm()
    if z.n > 1:
        strategy.volumes(c, case, z, params)
    else:
        c.formula = "one device: none"
    c.links = {"gpu": gpu_link.name}
    flat = z.m > 1 and not strategy.hierarchical(case)  # a flat ring crosses the network: at its slowest hop
    if flat:
        c.bytes_node, c.bytes_gpu = c.bytes_gpu, 0.0
    if host_link is not None:
        c.bytes_host = strategy.host_bytes(case, z)
    seconds = c.bytes_gpu / gpu_link.bytes_per_s
    if c.bytes_node:
        if node_link is None:
            raise InputError("a run on several nodes needs the network between them; fix: give --internode LINK")
        c.links["node"] = node_link.name
        # a flat ring crosses each node's network once: the node's NICs carry one device's volume (NCCL spreads
        # its channels over them); HYBRID_SHARD runs g rings across the nodes, one per local rank, sharing them.
        # Every hop of a ring carries the same volume: a flat ring also runs no faster than its hops inside a node
        # (PCIe without peer-to-peer can be slower than the network)
        rate = node_link.bytes_per_s / strategy.node_rings(case, z)
        seconds += c.bytes_node / (min(rate, gpu_link.bytes_per_s) if flat else rate)
    if c.bytes_host:
        c.links["host"] = host_link.name
        c.host_s = c.bytes_host / host_link.bytes_per_s
        seconds += c.host_s
    c.latency_s = calls_latency(c.calls, gpu_link, node_link)
    c.seconds = seconds + c.latency_s
    if z.n > 1:
        c.forward_bytes, calls = strategy.forward_gathers(case, z, params)
        rate = gpu_link.bytes_per_s  # as the step's: a flat ring at its slowest hop
        if flat and node_link is not None:
            rate = min(rate, node_link.bytes_per_s)
        c.forward_s = c.forward_bytes / rate + calls_latency(calls, gpu_link, node_link)
    if not c.pipelined:  # every call pipelines unless the strategy said otherwise (ZeRO-3: its gathers)
        c.pipelined = sum(k for _, k, _, _ in c.calls)
    if strategy.unhideable(case):
        c.hideable_under = "none"  # one unit: gathered, then reduced; ZeRO-1/2: reductions on the compute stream
    return c


def _sizes(case: PlanInput, strategy: Strategy, params, param_bytes) -> Sizes:
    """:class:`Sizes` of ``case`` under ``strategy`` (``params``, ``param_bytes``: as :func:`per_step`)."""
    if params is None:
        total, _ = count_params(case.config)
        trainable = lora_param_count(case.config, case.lora_r, case.lora_targets) if case.lora else total
    else:
        total, trainable = params
    s_p = param_bytes or strategy.param_bytes(case) * strategy.gathered_scale(
        case
    )  # litgpt's FSDP1: bf16 under bf16-mixed
    if params is not None or not strategy.root_kept(case):
        root = 0.0  # FSDP2 resharding its root regathers it for backward; blocks unknown: every parameter twice
    elif strategy.one_unit(case):
        root = total * s_p  # the whole model one unit: the root
    else:
        root = count_params(dataclasses.replace(case.config, n_layer=0))[0] * s_p
    reduced = trainable
    if params is None and strategy.frozen_weights_grad(case):  # FSDP1's flat parameters' whole gradients
        reduced = flat_parameter_frozen_grad_elements(case, total) + trainable
    return Sizes(
        n=case.world,
        g=max(case.devices, 1),
        m=max(case.num_nodes, 1),
        a=max(case.accumulation, 1),
        s_p=s_p,
        P=total * s_p,
        G=reduced * s_p,
        R=root,
        trainable=trainable,
        units=1 if strategy.one_unit(case) or params is not None else case.config.n_layer + 1,
    )
