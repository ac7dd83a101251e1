"""The loss's backward on the last stage under torch's ``loss_parallel`` (TP > 1, torch stacks):
four fp32 logits-sized tensors at its peak, one more than torch's plain ``cross_entropy``."""

from __future__ import annotations

import pytest
from screen_support import sampled_peaks_match

from meshplan.accuracy.validate import runs_of
from meshplan.catalog import load_gpu, load_model
from meshplan.cost.activations import head_activation_bytes, loss_grad_bytes
from meshplan.estimate import estimate
from meshplan.search.engine import Engine
from meshplan.search.run import plan_of
from meshplan.search.space import SearchLimits, enumerate_plans
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.units import GiB

LLAMA3_VOCAB = 128_256


def test_loss_parallel_buffers_of_the_70b_2d_row():
    # torchtitan's Llama 3.1 70B 2D run: TP 8, local batch 16 of 8,192 tokens, one micro-batch
    m = load_model("llama3-70b")
    shard = 4 * 16 * 8192 * (LLAMA3_VOCAB // 8)  # one fp32 logits shard: 8,405,385,216 bytes
    assert shard == 8_405_385_216
    assert loss_grad_bytes(m, 16, 8192, 8, 1, "compiled") == 3 * shard
    assert loss_grad_bytes(m, 16, 8192, 8, 1, "eager") == 3 * shard
    assert loss_grad_bytes(m, 16, 8192, 1, 1, "eager") == 2 * 4 * 16 * 8192 * LLAMA3_VOCAB
    # a compiled loss without TP holds only the bf16 gradient (tests/test_compiled_loss.py)
    assert loss_grad_bytes(m, 16, 8192, 1, 1, "compiled", 2) == 2 * 16 * 8192 * LLAMA3_VOCAB
    assert loss_grad_bytes(m, 16, 8192, 8, 1, "fused") == shard  # Megatron's in-place gradient
    # the saved log-softmax shard is the head's activation, beside the two 16-bit inputs (÷ t with SP)
    assert head_activation_bytes(m, 16, 8192, 8, 1, True, 2) == shard + 2 * 16 * 8192 * 8192 * 2 // 8


def test_70b_2d_row_peaks_at_the_loss_backward():
    run = next(r for r in runs_of() if r.id == "torchtitan_70b_256gpu_2d")
    est = estimate(run.model, run.cluster, run.plan)
    (stage,) = est.stages
    assert stage.other_items["logits_grad"] == 3 * 8_405_385_216
    assert stage.total == est.peak_bytes
    # at the loss's backward no layer has rebuilt its working set (full recompute) yet
    # (nor its MLP's backward gradients)
    backward = stage.activation_items["backward_working_set"] + stage.activation_items["backward_gradients"]
    assert stage.activation_items["working_set_not_yet_built"] == -backward < 0
    # torchtitan's 2024 FSDP2 root unit: the final norm + LM head (131,342,336 parameters per TP rank),
    # the embedding (131,334,144) and the last block (106,971,136) gathered in bf16 at the loss's backward
    assert run.plan.stack.fsdp_head_in_root
    assert stage.other_items["gathered_weights"] == 2 * (131_342_336 + 131_334_144 + 106_971_136) == 739_295_232
    # against the head unit alone, and a bf16 weight shard beside the fp32 master (2 bytes for each of
    # the 8,820,367,360 parameters of a TP rank over 32 shards), which FSDP2 does not keep; and,
    # reserved beside loss_parallel's fp32 shards, the freed bf16 logits' shard (tests/test_allocator.py)
    assert stage.other_items["freed_logits_block"] == 8_405_385_216 // 2
    # FSDP2's all-gather pool: the root's bf16 buffer (embedding and head) beside a block's
    pool = 2 * (131_342_336 + 131_334_144) + 2 * 106_971_136
    assert stage.other_items["all_gather_pool"] == pool
    assert est.peak_bytes == (69_715_825_152 - 2 * 8_820_367_360 // 32 + 2 * (131_334_144 + 106_971_136)
                              + 8_405_385_216 // 2 + pool)
    assert est.peak_bytes / GiB == pytest.approx(69.461, abs=5e-4)


def test_search_memory_equals_estimate_on_the_torch_stack_with_tp():
    # torchtitan-like space: compiled kernels, ZeRO-3 or not, TP 1-8, so the loss buffers differ by TP
    model, cluster = load_model("llama3-70b"), ClusterSpec.of(load_gpu("h100-sxm-80gb"), 64)
    base = TrainingPlan.of(global_batch=64, seq_len=8192, kernels="compiled")
    table = enumerate_plans(model, 64, cluster.gpus_per_node, 8192, (64,), SearchLimits(max_micro_batch=2, max_vpp=2))
    seen_tp = {plan.tp for plan in sampled_peaks_match(model, cluster, base, table, 40, seed=5)}
    assert 1 in seen_tp and len(seen_tp) > 2


def test_loss_parallel_backward_measured_by_torch():
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    import torch.nn.functional as F
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import loss_parallel

    if dist.is_initialized():
        pytest.skip("a default process group is already initialized")
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        mesh = init_device_mesh("cpu", (1,))
        n, v = 1024, 2048  # per-token index and mask tensors (int64) stay under 1 % of an fp32 shard
        fp32 = 4 * n * v

        def peak(parallel: bool) -> int:
            # torchtitan: the LM head's bf16 logits (a vocabulary-sharded DTensor with TP), upcast
            logits = torch.randn(n, v, dtype=torch.bfloat16, requires_grad=True)
            target = torch.randint(0, v, (n,))
            tracker = MemTracker()
            tracker.track_external(logits)
            with tracker:
                if parallel:
                    with loss_parallel():
                        F.cross_entropy(DTensor.from_local(logits, mesh, [Shard(1)]).float(), target).backward()
                else:
                    F.cross_entropy(logits.float(), target).backward()
            snap = tracker.get_tracker_snapshot("peak")
            return sum(d["Total"] for d in snap.values())

        plain, parallel = peak(False), peak(True)
    finally:
        dist.destroy_process_group()
    m = load_model("llama3-8b")
    # meshplan per token and vocabulary entry (torch's eager loss, as measured here): the saved
    # log-softmax + the loss's gradient buffers;
    # measured: the same fp32 tensors beside the bf16 logits (2 bytes per entry)
    per_entry = {t: (4 + loss_grad_bytes(m, 1, 1, t, 1, "eager") / (LLAMA3_VOCAB // t)) for t in (1, 8)}
    assert per_entry == {1: 12.0, 8: 16.0}
    assert (plain - fp32 // 2) / fp32 == pytest.approx(per_entry[1] / 4, abs=0.01)
    assert (parallel - fp32 // 2) / fp32 == pytest.approx(per_entry[8] / 4, abs=0.01)


def test_search_memory_equals_estimate_with_torchtitans_2024_root_unit():
    # the root unit holds the embedding and head (fsdp_head_in_root) where a plan runs FSDP2 without a
    # pipeline; the other plans of the space (ZeRO 1/2, pp > 1) run without it
    model, cluster = load_model("llama3-8b"), ClusterSpec.of(load_gpu("h100-sxm-80gb"), 16)
    base = TrainingPlan.of(global_batch=64, seq_len=8192, kernels="eager", zero=3, fsdp_head_in_root=True)
    table = enumerate_plans(model, 16, cluster.gpus_per_node, 8192, (64,), SearchLimits(max_micro_batch=2, max_vpp=2))
    plans = sampled_peaks_match(model, cluster, base, table, 60, seed=7)
    assert any(p.stack.fsdp_head_in_root for p in plans) and any(not p.stack.fsdp_head_in_root and p.zero == 3 for p in plans)
    # the screen's step bound holds for them too (the root's embedding is not gathered again backward)
    screen = Engine(model, cluster, base).evaluate(table)
    for i in range(0, len(table), max(1, len(table) // 40)):
        step = estimate(model, cluster, plan_of(base, table, i)).time.step_s
        assert screen.step_lower_bound[i] <= step * (1 + 1e-12), table.row(i)
