"""torch's ring attention backward (context parallelism on the torch stacks): the buffers it holds
at its peak beyond a plain SDPA backward, and where they land in a layer's backward working set."""

from __future__ import annotations

import pytest
from screen_support import sampled_peaks_match

from meshplan.accuracy import map_runs
from meshplan.catalog import load_gpu, load_model
from meshplan.cost.activations import MLP_SIDE_ITEMS, layer_activation_items, layer_activations, mlp_backward_gradient_bytes
from meshplan.cost.cp_exchange import cp_exchange_bytes, ring_backward_buffer_bytes
from meshplan.estimate import estimate
from meshplan.search.space import SearchLimits, enumerate_plans
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.units import GiB


def test_ring_buffers_of_the_405b_rows():
    # torchtitan's Llama 3.1 405B with TP 8: 16 query heads per rank (K/V repeated to them), d = 128,
    # n = 32,768 local tokens, bf16: one rank's K|V is 268,435,456 bytes
    m = load_model("llama3-405b")
    kv, _ = cp_exchange_bytes(m, 32768, 8, 2, "compiled")
    assert kv == 32768 * 16 * 256 * 2 == 268_435_456
    n_q, n_kv = 32768 * 16 * 128, 32768 * 16 * 256
    for c in (2, 4, 8):
        ring = ring_backward_buffer_bytes(m, 32768, 8, 2, "compiled", c)
        assert ring == (c + 0.5) * 2 * n_kv + 4 * n_q + 16 * n_kv
        assert ring == (c + 9.5) * kv  # 16-bit activations, d_v = d
        assert ring_backward_buffer_bytes(m, 32768, 8, 2, "eager", c) == ring
    assert ring_backward_buffer_bytes(m, 32768, 8, 2, "compiled", 1) == 0.0
    assert ring_backward_buffer_bytes(m, 32768, 8, 2, "fused", 8) == 0.0  # Transformer Engine's ring: not modelled


@pytest.mark.parametrize("recompute", ["none", "selective", "op", "full"])
def test_ring_buffers_come_after_the_mlp_is_freed(recompute):
    m = load_model("llama3-405b")
    n = 32768
    args = (m, 1, 8 * n, 8, 8, True, recompute, "flash", 2)
    torch_stack = layer_activations(*args, kernels="compiled")
    items = layer_activation_items(m, 1, 8 * n, 8, 8, True, "flash", 2, kernels="compiled")
    mlp = sum(b for name, b, _ in items if name in MLP_SIDE_ITEMS)
    # norm 2's input (its SP shard), the MLP input as torch gathered it, gate|up and down input
    assert mlp == n * 16384 * 2 / 8 + n * 16384 * 2 + 3 * n * 53248 / 8 * 2
    full = sum(b for _, b, _ in items)
    layer_input = n * 16384 * 2 / 8
    rebuilt = {  # what recompute rebuilds in the layer's backward, W_r
        "none": 0.0,
        "selective": sum(b for _, b, cls in items if cls == "core"),
        "op": full - torch_stack.stored + layer_input,
        "full": full - layer_input,  # the checkpointed input is the rebuilt layer's own
    }[recompute]
    ring = ring_backward_buffer_bytes(m, n, 8, 2, "compiled", 8)
    # the MLP backward's gradients: the output's n·h/t, (2 + 1)·n·f/t, less the freed down-projection input n·f/t
    grads = n * 16384 * 2 / 8 + 2 * n * 53248 / 8 * 2
    assert mlp_backward_gradient_bytes(m, n, 8, True, 2) == grads
    assert torch_stack.working == max(rebuilt + grads, rebuilt + ring - mlp)
    assert torch_stack.working > rebuilt + grads  # 4.7 GB of ring buffers against 2.5 GB of MLP-side tensors
    assert torch_stack.gradients == 0.0  # the ring's moment wins: the MLP's gradients are gone by then


def test_405b_cp_rows_gain_the_ring_buffers():
    runs = {r.id: r for r in map_runs()}
    peaks, working = {}, {}
    for c, s in ((1, 32768), (2, 65536), (4, 131072), (8, 262144)):
        run = runs[f"torchtitan_405b_512gpu_4d_cp{c}_seq{s}"]
        est = estimate(run.model, run.cluster, run.plan)
        peaks[c] = est.peak_bytes / GiB
        items = est.stages[0].activation_items
        working[c] = items["backward_working_set"] + items["backward_gradients"]
        fused = estimate(run.model, run.cluster, run.plan.replace(**{"kernels": "fused"})).stages[0].activation_items
        assert working[c] >= fused["backward_working_set"] + fused["backward_gradients"]
    # the peak (first pipeline rank, in a layer's backward) grows with c at a fixed local length,
    # as published (75.3, 75.9, 77.1, 84.9 GiB), by the ring buffers the working set gained, once
    # they outgrow the MLP's gradients: at c = 2, (2 + 9.5)·K|V − M = 0.58 GB stays below G = 1.01 GB
    assert peaks[1] == peaks[2] < peaks[4] < peaks[8]
    m, n = runs["torchtitan_405b_512gpu_4d_cp8_seq262144"].model, 32768
    items = layer_activation_items(m, 1, 8 * n, 8, 8, True, "flash", 2, kernels="compiled")
    mlp = sum(b for name, b, _ in items if name in MLP_SIDE_ITEMS)
    # at c = 1 the MLP's gradients set the working set, at c = 8 the ring buffers (after the MLP is freed)
    grads = mlp_backward_gradient_bytes(m, n, 8, True, 2)
    assert working[8] - working[1] == ring_backward_buffer_bytes(m, n, 8, 2, "compiled", 8) - mlp - grads  # 1.30 GB
    assert peaks[8] - peaks[1] == pytest.approx((working[8] - working[1]) / GiB, rel=1e-9)


def test_search_memory_equals_estimate_with_torch_context_parallelism():
    # the table's rows carry every recompute mode, so the base plan's does not matter
    model, cluster = load_model("llama3-8b"), ClusterSpec.of(load_gpu("h100-sxm-80gb"), 16)
    base = TrainingPlan.of(global_batch=4, seq_len=65536, kernels="compiled")
    table = enumerate_plans(model, 16, cluster.gpus_per_node, 65536, (4,), SearchLimits(max_micro_batch=2, max_vpp=2))
    plans = sampled_peaks_match(model, cluster, base, table, 120, seed=11)
    assert len({p.cp for p in plans} - {1}) >= 2
    assert {p.recompute for p in plans if p.cp > 1} == {"none", "selective", "op", "full"}


@pytest.mark.parametrize("cp", [2, 4])
def test_ring_buffers_measured_by_torch(cp):
    pytest.importorskip("torch")
    from meshplan.verify.launch import launch

    # Llama 3.1 8B's attention shapes without TP (32 heads of 128, K/V repeated), 256 local tokens, bf16
    model = load_model("llama3-8b")
    plan = TrainingPlan.of(cp=cp, micro_batch=1, global_batch=1, seq_len=256 * cp, kernels="compiled", recompute="full")
    (ranks,) = launch([(model, plan)], task="ring-memory", retries=1)
    predicted = ring_backward_buffer_bytes(model, 256, 1, 2, "compiled", cp)
    kv, _ = cp_exchange_bytes(model, 256, 1, 2, "compiled")
    extra = [r["ring"] - r["plain"] for r in ranks]
    assert all(r["plain"] == 1.5 * kv for r in ranks)  # the plain backward's dQ, dK, dV
    # ranks 1 … c − 1 reach the model's figure exactly; rank 0 (no half-key step) a little less
    assert extra[1:] == [predicted] * (cp - 1)
    assert predicted - kv / 2 <= extra[0] <= predicted
