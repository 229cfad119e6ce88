"""The stand-in accelerator of the per-rank simulation (tunelab.plan.trace.fake_device): fake tensors on the device and
the host counted apart, FSDP1's host <-> device moves allowed, the CPU simulation's attention kernel, and torch
left as it was."""

from __future__ import annotations

import torch
import torch._functorch.config as functorch_config
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from tunelab.plan.trace.fake_device import ACCELERATOR, fake_accelerator


class _Ops(TorchDispatchMode):
    """The aten ops dispatched under it, by name."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "aten" and func.__name__ != "detach.default":
            self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_a_fake_tensor_moves_between_host_and_device_as_fsdp1_moves_its_flat_parameter():
    """``flat_param.data = flat_param.to(device)`` and back, as FSDP1's offload does: the tensor then says where it
    is, and pinning copies on the host."""
    with FakeTensorMode(allow_non_fake_inputs=True), fake_accelerator() as device:
        assert device.type == ACCELERATOR
        p = torch.nn.Parameter(torch.zeros(8, 4))
        host = p.data
        p.data = p.to(device)
        assert p.device.type == ACCELERATOR and isinstance(p, FakeTensor)
        p.data = host
        assert p.device.type == "cpu"
        pinned = host.pin_memory()
        assert pinned is not host and pinned.device.type == "cpu" and pinned.is_pinned() and not host.is_pinned()


def test_attention_on_the_device_runs_the_cpu_simulations_flash_kernel():
    """Without the stand-in's attention, torch takes its math path for a ``meta`` tensor and keeps the (T x T)
    scores for backward; the CPU simulation runs torch's CPU flash kernel, and so does the device."""
    with FakeTensorMode(allow_non_fake_inputs=True), fake_accelerator() as device:
        q = torch.zeros(2, 4, 64, 16, device=device, requires_grad=True)
        ops = _Ops()
        with ops:
            y = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        assert y.device.type == ACCELERATOR and y.shape == q.shape
        assert ops.names == ["_scaled_dot_product_flash_attention_for_cpu.default"]
        assert not any("softmax" in n for n in ops.names)


def test_torch_is_left_as_it_was():
    """Every patch is undone on exit: no ``torch.meta`` module, torch's own ``_make_subclass``, ``.data`` and
    attention, fake tensors on ``meta`` allowed as before."""
    real_sdpa, allow_meta = F.scaled_dot_product_attention, functorch_config.fake_tensor_allow_meta
    with FakeTensorMode(allow_non_fake_inputs=True), fake_accelerator():
        assert hasattr(torch, ACCELERATOR)
    assert not hasattr(torch, ACCELERATOR)
    assert "_make_subclass" not in torch.Tensor.__dict__
    assert "data" not in FakeTensor.__dict__
    assert F.scaled_dot_product_attention is real_sdpa
    assert functorch_config.fake_tensor_allow_meta == allow_meta
