"""A stand-in accelerator for the per-rank simulation, so that FSDP1's ``cpu_offload`` runs on this CPU with its
device side and host side apart.

FSDP1 offloads only from an accelerator. A CPU-only torch has no CUDA device to fake, so the "device" is ``meta``:
fake tensors that say ``meta``, which ``MemTracker`` counts apart from the host's ``cpu``, while FSDP's calls that
ask for an accelerator (streams, events, ``current_device``, pinned memory) are answered for the duration of the
simulation and put back on exit (:func:`fake_accelerator`)."""

from __future__ import annotations

import contextlib
import weakref
from unittest import mock

ACCELERATOR = "meta"
"""The device type the simulation takes for the accelerator."""


class _Stream:
    """A stream that runs nothing out of order."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        return _Event()

    def synchronize(self) -> None:
        pass


class _Event:
    """An event that has always happened."""

    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _DeviceModule:
    """``torch.meta`` while the simulation runs: what FSDP1's device handle asks of ``torch.<device type>``."""

    Stream = _Stream
    Event = _Event

    def current_device(self):
        import torch

        return torch.device(ACCELERATOR)

    def current_stream(self, device=None) -> _Stream:
        return _Stream()

    def default_stream(self, device=None) -> _Stream:
        return _Stream()

    @contextlib.contextmanager
    def stream(self, stream):
        yield

    def set_device(self, device) -> None:
        pass

    def synchronize(self, device=None) -> None:
        pass

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1


def _pinning_mode():
    """A dispatch mode in which pinning a fake host tensor copies it on the host (as pinning does) and the copy is
    pinned."""

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    pinned: dict[int, weakref.ref] = {}  # by id: a WeakSet would compare tensors with ==

    class Pinning(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._pin_memory.default:
                out = args[0].clone()
                pinned[id(out)] = weakref.ref(out)
                return out
            if func is torch.ops.aten.is_pinned.default:
                ref = pinned.get(id(args[0]))
                return ref is not None and ref() is args[0]
            return func(*args, **(kwargs or {}))

    return Pinning()


def _attention(real):
    """``F.scaled_dot_product_attention`` that, for 4-D tensors on the accelerator without dropout, runs torch's
    CPU flash kernel (what the CPU composite picks for the same tensors on a CPU); anything else as ``real``."""
    import torch

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        flash = (
            query.device.type == ACCELERATOR
            and query.dim() == 4
            and dropout_p == 0.0
            and not enable_gqa
            and query.size(-1) == key.size(-1) == value.size(-1)
        )
        if flash:
            out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
            )
            return out[0]
        return real(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )

    return sdpa


@contextlib.contextmanager
def fake_accelerator():
    """Enter inside a ``FakeTensorMode``: yields the accelerator's ``torch.device`` (see the module docstring)."""

    import torch
    import torch._functorch.config as functorch_config
    from torch._subclasses.fake_tensor import FakeTensor

    def patched(obj, name: str, value):  # set until exit; deleted again where ``obj`` had no such attribute itself
        return mock.patch.object(obj, name, value, create=True)

    real_make_subclass = torch.Tensor._make_subclass
    real_data = torch._C.TensorBase.data

    def make_subclass(cls, data, requires_grad=False, **kwargs):  # torch's signature (dynamo checks it)
        if isinstance(cls, type) and issubclass(cls, FakeTensor):
            kwargs["device_for_backend_keys"] = torch.device("cpu")
        return real_make_subclass(cls, data, requires_grad, **kwargs)

    def set_data(self, new) -> None:
        real_data.__set__(self, new)
        if isinstance(new, FakeTensor):
            self.fake_device = new.fake_device

    with contextlib.ExitStack() as stack:
        stack.enter_context(functorch_config.patch(fake_tensor_allow_meta=True))
        stack.enter_context(patched(torch, ACCELERATOR, _DeviceModule()))
        stack.enter_context(patched(torch.Tensor, "_make_subclass", staticmethod(make_subclass)))
        stack.enter_context(patched(FakeTensor, "data", property(real_data.__get__, set_data)))
        functional = torch.nn.functional
        attention = _attention(functional.scaled_dot_product_attention)
        stack.enter_context(patched(functional, "scaled_dot_product_attention", attention))
        stack.enter_context(_pinning_mode())
        yield torch.device(ACCELERATOR)
