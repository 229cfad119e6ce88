"""What a compiled transformer block keeps for backward and launches: torch.compile's own partitioner, on fake tensors.

A strategy file's ``compile: blocks`` compiles each of litgpt's blocks; AOTAutograd's min-cut partitioner then saves
fewer tensors than eager autograd (pointwise results are recomputed in backward), so the eager derivation is an
upper bound. Here one block (litgpt's class, LoRA's for LoRA) is compiled with a backend that runs the same
partitioner on fake tensors and stops at the forward graph: what it returns beyond the block's output is what
backward keeps, each storage counted once (a kept view holds its whole base). Its forward and backward graphs are
also read as the kernels inductor would launch (:func:`block_kernels`, for the fast path's time). Nothing is
computed: a trace takes seconds, and is cached (:mod:`tunelab.plan.trace.trace_cache`)."""

from __future__ import annotations

import dataclasses
import json
import operator
import warnings
from functools import lru_cache

from tunelab.plan.model.tables import COMPILED_PRECISIONS, TRACE_TOKENS
from tunelab.plan.trace.measure import lora_config
from tunelab.plan.trace.trace_cache import cached_json, tuples

LORA_DROPOUT = 0.05
"""LoRA's dropout in the trace (the recipes' and litgpt's LoRA default; nonzero, as the eager plan assumes): the
partitioner decides whether its mask is kept or its random numbers drawn again."""


def saved_bytes_per_token(
    config, method: str, precision: str, lora_r: int = 0, targets: tuple = (), input_grad: bool = True
) -> float:
    """Bytes one compiled block keeps for backward per token (activations only: parameters and the RoPE tables
    left out). ``input_grad``: the block's input needs a gradient (every block but a LoRA model's first, whose
    input comes from a frozen embedding)."""
    key = json.dumps(dataclasses.asdict(config), sort_keys=True, default=str)
    args = (key, method, str(precision), lora_r, tuple(sorted(targets)), input_grad)
    return (_traced(*args, 2 * TRACE_TOKENS) - _traced(*args, TRACE_TOKENS)) / TRACE_TOKENS


TRACE_VERSION = 1
"""Bumped when what a block's trace yields changes: the cached ones are made again."""


@lru_cache(maxsize=64)
def _traced(config_json: str, method: str, precision: str, lora_r: int, targets: tuple, input_grad: bool, tokens: int):
    key = ["saved", TRACE_VERSION, config_json, method, precision, lora_r, list(targets), input_grad, tokens]
    return cached_json(
        "compiled-blocks",
        key,
        lambda: trace_block(json.loads(config_json), method, precision, lora_r, targets, input_grad, 1, tokens),
        "compiled block's trace",
    )


def _block_class(config: dict, method: str, lora_r: int, targets: tuple):
    """(litgpt's Block class for ``method``, the litgpt Config of ``config``, LoRA's settings applied)."""
    from litgpt import Config

    c = Config(**{k: v for k, v in config.items() if k in {f.name for f in dataclasses.fields(Config) if f.init}})
    if method != "lora":
        from litgpt.model import Block

        return Block, c
    from litgpt.lora import Block

    return Block, lora_config(c, lora_r, 2 * lora_r, LORA_DROPOUT, targets)


def _kept_bytes(gm, block_input_shape: tuple) -> int:
    """Bytes of the storages a compiled forward graph returns for its backward (its outputs after the block's own),
    each storage once: a kept view keeps its whole base alive (module docstring); a graph input counts only where
    it is the block's input (weights and the shared RoPE tables are kept as given, not activations)."""
    import torch

    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    storages = {}
    for node in out[1:]:
        val = node.meta.get("val") if hasattr(node, "meta") else None
        if not isinstance(val, torch.Tensor):
            continue  # a symbolic size or an RNG seed
        if node.op == "placeholder" and tuple(val.shape) != block_input_shape:
            continue
        storage = val.untyped_storage()
        storages[storage._cdata] = storage.nbytes()
    return sum(storages.values())


def trace_block(
    config: dict,
    method: str,
    precision: str,
    lora_r: int,
    targets: tuple,
    input_grad: bool,
    micro: int,
    tokens: int,
    with_kernels: bool = False,
):
    """Bytes one compiled block keeps for ``micro`` x ``tokens`` (see the module docstring); ``config``: a litgpt
    Config as a dict. ``with_kernels``: also run the backward and return ``{"bytes": ..., "kernels": {phase:
    [kernel, ...]}}`` (:func:`graph_kernels` of the forward and backward graphs)."""
    import torch
    import torch._dynamo
    from litgpt.model import build_rope_cache
    from torch._subclasses.fake_tensor import FakeTensorMode

    dtype = getattr(torch, COMPILED_PRECISIONS[precision])
    Block, c = _block_class(config, method, lora_r, targets)  # noqa: N806 - litgpt's class
    kept: dict = {}
    graphs: dict = {}
    backend = _recording_backend(kept, graphs, (micro, tokens, c.n_embd))

    default = torch.get_default_dtype()
    try:
        # AOTAutograd warns that these compilers take unboxed arguments: they only record, and a warning printed
        # into a plan is noise to its reader
        with FakeTensorMode(allow_non_fake_inputs=True), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.set_default_dtype(dtype)
            block = Block(c, 1)
            if method == "lora":
                from litgpt.lora import mark_only_lora_as_trainable

                mark_only_lora_as_trainable(block)
            cos, sin = (t.to(dtype).unsqueeze(0).expand(micro, -1, -1) for t in build_rope_cache(tokens, c.rope_n_elem))
            x = torch.randn(micro, tokens, c.n_embd, requires_grad=input_grad)
            torch._dynamo.reset()
            out = torch.compile(block, backend=backend, dynamic=False, fullgraph=True)(x, cos, sin)
            if with_kernels:
                out.sum().backward()
                kept["kernels"] = {phase: graph_kernels(gm) for phase, gm in graphs.items()}
    finally:
        torch.set_default_dtype(default)
        torch._dynamo.reset()
    return kept if with_kernels else kept["bytes"]


def _recording_backend(kept: dict, graphs: dict, shape: tuple):
    """A torch.compile backend that keeps AOTAutograd's forward and backward graphs in ``graphs`` and the bytes the
    forward keeps for the backward (at ``shape``) in ``kept``, and runs them as they are."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    def forward_graph(gm, example_inputs):
        graphs["forward"] = gm
        kept["bytes"] = _kept_bytes(gm, shape)
        return gm

    def backward_graph(gm, example_inputs):
        graphs["backward"] = gm
        return gm

    def backend(gm, example_inputs):
        return aot_module_simplified(
            gm,
            example_inputs,
            fw_compiler=forward_graph,
            bw_compiler=backward_graph,
            partition_fn=min_cut_rematerialization_partition,
        )

    return backend


VIEW_OPS = frozenset(
    "view _unsafe_view t transpose permute expand slice select unsqueeze squeeze alias detach split split_with_sizes "
    "as_strided reshape unbind getitem".split()
)
"""Ops that only re-describe a tensor: no kernel, no bytes (inductor folds them into the indexing of the kernels
around them)."""
LIBRARY_MATMULS = frozenset({"mm", "addmm", "bmm", "baddbmm"})
"""Matmuls inductor leaves to cuBLAS (its default, without max-autotune): one kernel each, not fused."""
REDUCTIONS = frozenset({"sum", "mean", "amax", "amin", "var_mean", "var", "prod"})
"""Ops that reduce: each is a kernel of its own within a fused region (with its fused prologue and epilogue)."""


def _name(node) -> str:
    if node.target is operator.getitem:
        return "getitem"
    text = str(node.target)
    return text.split(".")[1] if text.startswith("aten.") else text


def _nbytes(node) -> int:
    import torch

    val = node.meta.get("val") if hasattr(node, "meta") else None
    return val.numel() * val.element_size() if isinstance(val, torch.Tensor) else 0


def _shape(node) -> tuple:
    return tuple(node.meta["val"].shape)


def graph_kernels(gm) -> list[tuple]:
    """The kernels inductor makes of one of the partitioner's graphs, as plain tuples (see the module docstring):
    ``("matmul", dtype, a_shape, b_shape, op)``, ``("attention", dtype, q_shape, k_shape, op)``, ``("fused", dtype,
    bytes, kernels)``."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]

    def kind(n) -> str:
        name = _name(n)
        if name in LIBRARY_MATMULS:
            return "matmul"
        if "attention" in name:
            return "attention"
        return "view" if name in VIEW_OPS else "fused"

    kinds = {n: kind(n) for n in nodes}
    parent = {n: n for n in nodes if kinds[n] in ("view", "fused")}

    def root(n):
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n in parent:  # a fusible op joins the fusible ops it reads from
        for i in n.all_input_nodes:
            if i in parent:
                parent[root(i)] = root(n)
    regions: dict = {}
    for n in parent:
        regions.setdefault(root(n), []).append(n)
    out = []
    for members in regions.values():
        inside = set(members)
        compute = [n for n in members if kinds[n] == "fused"]
        if not compute:
            continue  # views alone launch nothing
        reads = {i for n in members for i in n.all_input_nodes if i not in inside}
        writes = {n for n in members if any(u not in inside for u in n.users)}
        moved = sum(_nbytes(i) for i in reads) + sum(_nbytes(w) for w in writes)
        reductions = sum(_name(n) in REDUCTIONS for n in compute)
        dtype = str(compute[-1].meta["val"].dtype).removeprefix("torch.") if _nbytes(compute[-1]) else "bfloat16"
        out.append(("fused", dtype, moved, max(1, reductions)))
    for n in nodes:
        if kinds[n] in ("matmul", "attention"):
            a, b = n.all_input_nodes[-2:] if _name(n) in ("addmm", "baddbmm") else n.all_input_nodes[:2]
            dtype = str(a.meta["val"].dtype).removeprefix("torch.")
            out.append((kinds[n], dtype, _shape(a), _shape(b), _name(n)))
    return out


def block_kernels(config, method: str, precision: str, lora_r: int = 0, targets: tuple = ()) -> dict:
    """The kernels of one compiled block's forward and backward, traced at one sample of :data:`TRACE_TOKENS` and
    twice as many tokens: ``{phase: [(kernel at the shorter trace, the same at the longer), ...]}`` (tuples of
    :func:`graph_kernels`), cached; :func:`tunelab.plan.model.fast_step.compiled_block_seconds` times them at any shape."""
    key = json.dumps(dataclasses.asdict(config), sort_keys=True, default=str)
    return _block_kernels(key, method, str(precision), lora_r, tuple(sorted(targets)))


@lru_cache(maxsize=32)
def _block_kernels(config_json: str, method: str, precision: str, lora_r: int, targets: tuple) -> dict:
    key = ["kernels", TRACE_VERSION, config_json, method, precision, lora_r, list(targets)]
    made = cached_json(
        "compiled-blocks",
        key,
        lambda: _trace_block_kernels(config_json, method, precision, lora_r, targets),
        "compiled block's kernels",
    )
    return {phase: list(tuples(pairs)) for phase, pairs in made.items()}


def _trace_block_kernels(config_json: str, method: str, precision: str, lora_r: int, targets: tuple) -> dict:
    """:func:`block_kernels` traced (not cached)."""
    config = json.loads(config_json)
    one, two = (
        trace_block(config, method, precision, lora_r, targets, True, 1, t, with_kernels=True)["kernels"]
        for t in (TRACE_TOKENS, 2 * TRACE_TOKENS)
    )
    out = {}
    for phase in one:
        a, b = one[phase], two[phase]
        if [k[0] for k in a] != [k[0] for k in b]:
            raise ValueError(f"a compiled block's {phase} graph makes other kernels at {2 * TRACE_TOKENS} tokens")
        out[phase] = list(zip(a, b))
    return out
