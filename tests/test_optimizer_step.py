"""The optimizer step's HBM bytes per parameter on each software stack
(meshplan.cost.optimizer_step.optimizer_step_bytes): Megatron's fused step from the precision recipe, and
torch's foreach AdamW/SGD with clip_grad_norm_ counted op by op in torch's own step on CPU."""

from __future__ import annotations

import pytest

from meshplan.accuracy import map_runs
from meshplan.cost.calibration import calibration_for
from meshplan.cost.optimizer_step import optimizer_step_bytes, optimizer_step_time
from meshplan.estimate import estimate
from meshplan.specs.plan import PrecisionRecipe

MEGATRON = PrecisionRecipe(precision="bf16", grad_dtype="fp32")  # bf16 weights, fp32 gradients and master, Adam
FP32 = PrecisionRecipe(precision="fp32", grad_dtype="fp32")


def test_step_bytes_per_stack():
    assert optimizer_step_bytes(MEGATRON) == MEGATRON.optimizer_step_bytes == 30
    # torch's foreach AdamW over fp32 parameters (the master copy), moments and gradients:
    # 4p + 14s + 2γ, and clip_grad_norm_'s 3γ
    assert optimizer_step_bytes(MEGATRON, "compiled") == optimizer_step_bytes(FP32, "eager") == 16 + 56 + 8 + 12 == 92
    sgd = PrecisionRecipe(precision="fp32", grad_dtype="fp32", optimizer="sgd")
    assert optimizer_step_bytes(sgd, "eager") == 2 * 4 + 5 * 4 + 4 + 12 == 44
    assert optimizer_step_bytes(sgd) == sgd.optimizer_step_bytes == 4 + 4 + 4 + 4 + 4


def _counted_step_bytes(make_optimizer) -> tuple[int, int]:
    """(bytes per parameter moved by clip_grad_norm_ and one optimizer step, parameters), torch's
    own ops under a dispatch mode: each op reads its distinct tensor arguments and writes the
    arguments it mutates and the tensors it returns (the step counters, the per-tensor norms and
    their stack, a few elements each, left out)."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    params = [torch.nn.Parameter(torch.randn(n)) for n in (4096, 8192, 12288)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = make_optimizer(params)
    opt.step()  # the first step creates the state

    def tensors(x):
        if isinstance(x, torch.Tensor):
            return [x] if x.numel() >= 64 else []
        if isinstance(x, (list, tuple)):
            return [t for y in x for t in tensors(y)]
        return []

    class Bytes(TorchDispatchMode):
        moved = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            read = {id(t): t for a in list(args) + list(kwargs.values()) for t in tensors(a)}
            written = [t for arg, a in zip(func._schema.arguments, args) if arg.alias_info is not None and arg.alias_info.is_write
                       for t in tensors(a)]
            written += [t for t in tensors(out) if id(t) not in read]
            Bytes.moved += sum(t.numel() * t.element_size() for t in list(read.values()) + written)
            return out

    with Bytes():
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
    n = sum(p.numel() for p in params)
    assert Bytes.moved % n == 0
    return Bytes.moved // n, n


def test_torch_foreach_adamw_moves_the_counted_bytes():
    import torch

    per_param, _ = _counted_step_bytes(lambda ps: torch.optim.AdamW(ps, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1,
                                                                     foreach=True, fused=False))
    assert per_param == optimizer_step_bytes(FP32, "eager") == 92


def test_torch_foreach_sgd_moves_the_counted_bytes():
    import torch

    per_param, _ = _counted_step_bytes(lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9, foreach=True))
    assert per_param == optimizer_step_bytes(PrecisionRecipe(precision="fp32", grad_dtype="fp32", optimizer="sgd"), "eager") == 44


def test_torchtitan_8b_optimizer_step():
    run = {r.id: r for r in map_runs()}["torchtitan_8b_8gpu_fsdp_compile"]
    est = estimate(run.model, run.cluster, run.plan)
    local = est.stages[0].params / 8  # FSDP2 over the 8 GPUs
    gpu, cal = run.cluster.gpu, calibration_for(run.cluster.gpu)
    assert est.time.optimizer_s == optimizer_step_time(local, run.plan.precision, gpu, cal, "compiled")
    assert est.time.optimizer_s == pytest.approx(local * 92 / (2.4e12 * 0.8), rel=1e-3)  # ~48 ms for 1.0e9 parameters
    fused = estimate(run.model, run.cluster, run.plan.replace(**{"kernels": "fused"}))
    assert est.time.optimizer_s / fused.time.optimizer_s == pytest.approx(92 / 30, rel=1e-12)
