"""Liger-Kernel's fused kernels in litgpt's model (a strategy's ``liger`` switch, tunelab/run/fused.py).

Liger's kernels are Triton's. On this CPU they run under Triton's interpreter (``TRITON_INTERPRET=1``, set before
Triton is imported, hence a subprocess): the fused linear cross-entropy, litgpt's loss without the logits, is
compared with litgpt's own forward and ``chunked_cross_entropy`` (loss and every gradient). Liger's RMSNorm and
SwiGLU kernels take float arguments the interpreter cannot pass: their comparison needs a GPU (marked ``gpu``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

COMPARE = r"""
import copy, json, sys
import torch
from litgpt import Config
from litgpt.model import GPT
import litgpt.lora as lora
from litgpt.utils import chunked_cross_entropy
from torch.utils._python_dispatch import TorchDispatchMode
from tunelab.run import fused

READS = {"_local_scalar_dense", "equal", "is_nonzero", "item"}  # a tensor's value handed to Python: a GPU sync


class Reads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in READS:
            self.seen.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def one(case):
    device = case.get("device", "cpu")
    torch.manual_seed(0)
    kw = dict(n_layer=2, n_embd=64, n_head=4, n_query_groups=2, vocab_size=300, padded_vocab_size=320,
              block_size=64, mlp_class_name="LLaMAMLP", intermediate_size=128, norm_class_name="RMSNorm",
              bias=False, rotary_percentage=1.0, parallel_residual=False,
              final_logit_softcapping=case.get("softcap"), scale_embeddings=case.get("scale_embeddings", False),
              lm_head_bias=case.get("head_bias", False))
    dtype = getattr(torch, case["dtype"])
    if case["lora"]:
        c = lora.Config(**kw, lora_r=4, lora_alpha=8, lora_query=True, lora_value=True, lora_head=case["lora"] == "head",
                        lora_dropout=0.0)
        model = lora.GPT(c)
        lora.mark_only_lora_as_trainable(model)
        for name, p in model.named_parameters():
            if "lora_B" in name:  # litgpt starts B at zero; a non-zero B makes the adapter count in the logits
                torch.nn.init.normal_(p, std=0.2)
    else:
        model = GPT(Config(**kw))
    model = model.to(device=device, dtype=dtype)
    model.max_seq_length = 32
    idx = torch.randint(0, 300, (3, 32), device=device)
    targets = idx.clone()
    targets[0, :7] = -100  # a masked prompt
    targets[2, 20:] = -100  # padding
    other = copy.deepcopy(model)
    mixed = torch.autocast(device, dtype=torch.bfloat16, enabled=case.get("mixed", False))  # bf16-mixed's
    with mixed:
        logits = model(idx).float()
        reference = chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])
    (reference / 2).backward()  # the loop divides by the accumulation steps
    used = fused.apply(other, case.get("mode", "loss"))
    counted = int((targets[..., 1:] != -100).sum())
    with Reads() as reads:  # what the fused loss reads back from the device, forward and backward
        with mixed:
            loss = fused.loss(other, idx, targets, counted)
        (loss / 2).backward()
    worst = 0.0
    for (name, p), q in zip(model.named_parameters(), other.parameters()):
        if p.grad is not None:
            scale = p.grad.float().abs().max().item() or 1.0
            worst = max(worst, (p.grad.float() - q.grad.float()).abs().max().item() / scale)
        assert (p.grad is None) == (q.grad is None), name
    return {"reference": reference.item(), "fused": loss.item(), "worst_grad": worst, "used": used,
            "reads": reads.seen}


for case in json.loads(sys.argv[1]):  # one process for every case: torch, litgpt and Triton imported once
    print(json.dumps({**one(case), "case": case}), flush=True)
"""


def compare(cases: list[dict], interpret: bool = True) -> list[dict]:
    """COMPARE's figures for each of ``cases``, all in one child process."""
    env = {**os.environ, "TRITON_INTERPRET": "1"} if interpret else dict(os.environ)
    out = subprocess.run(
        [sys.executable, "-c", COMPARE, json.dumps(cases)], capture_output=True, text=True, cwd=ROOT, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.strip().splitlines()[-len(cases) :]]


CASES = {
    # id: (case, loss rel. tolerance, gradient tolerance)
    "full-fp32": ({"dtype": "float32", "lora": None}, 1e-6, 1e-5),
    "full-fp32-scaled-embeddings": ({"dtype": "float32", "lora": None, "scale_embeddings": True}, 1e-6, 1e-5),
    "full-fp32-head-bias": ({"dtype": "float32", "lora": None, "head_bias": True}, 1e-6, 1e-5),
    "lora-head-fp32": ({"dtype": "float32", "lora": "head"}, 1e-6, 1e-5),
    "lora-fp32": ({"dtype": "float32", "lora": "blocks"}, 1e-6, 1e-5),
    "lora-head-bf16": ({"dtype": "bfloat16", "lora": "head"}, 1e-4, 0.03),
    "full-bf16-mixed": ({"dtype": "float32", "lora": None, "mixed": True}, 1e-5, 0.03),
}


@pytest.fixture(scope="module")
def compared() -> dict:
    """Every case of CASES compared in one child (one import of torch, litgpt and Triton for them all)."""
    got = dict(zip(CASES, compare([case for case, _, _ in CASES.values()])))
    assert all(got[name]["case"] == CASES[name][0] for name in CASES), got  # each result names its case
    return got


@pytest.mark.parametrize("name", list(CASES))
def test_the_fused_loss_is_litgpts_loss_and_gradients(name, compared):
    """Liger's fused linear cross-entropy (Triton's interpreter) against litgpt's forward and chunked
    cross-entropy on a masked, padded batch: the same loss and the same gradient for every parameter (fp32:
    to rounding; bf16: within a few bf16 ulps of the largest gradient, the logits' gradient being rounded to bf16
    by both before the head's matmul; bf16-mixed, autocast over fp32 weights, alike), including scaled embeddings, a head
    with a bias (Phi-2's) and a LoRA head (its adapter appended as extra
    columns of the head); and no value read back from the device on the way (Liger's own wrapper reads two per
    micro batch). Final-logit softcapping passes a float to the kernel: compared on a GPU."""
    _, loss_rel, grad_rel = CASES[name]
    r = compared[name]
    assert r["fused"] == pytest.approx(r["reference"], rel=loss_rel)
    assert r["worst_grad"] <= grad_rel, r
    assert r["used"] == ["fused linear cross-entropy"]
    assert r["reads"] == [], r["reads"]  # the count comes from the host: nothing read back, forward nor backward


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("softcap", [None, 5.0])
def test_liger_norms_swiglu_and_softcapping_are_litgpts_on_a_gpu(dtype, softcap):
    """``liger: all`` (RMSNorm and SwiGLU too), with and without final-logit softcapping, against litgpt's modules
    on a CUDA GPU (pytest -m gpu)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: Liger's norm, SwiGLU and softcapping kernels cannot run in Triton's interpreter")
    (r,) = compare([{"dtype": dtype, "lora": None, "mode": "all", "device": "cuda", "softcap": softcap}], False)
    assert r["used"][0] == "fused linear cross-entropy" and any(u.startswith("RMSNorm") for u in r["used"])
    assert r["fused"] == pytest.approx(r["reference"], rel=1e-5 if dtype == "float32" else 1e-3)
    assert r["worst_grad"] <= (1e-4 if dtype == "float32" else 0.05), r
