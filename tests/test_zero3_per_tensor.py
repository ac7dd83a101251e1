"""ZeRO-3 tensor by tensor, blocking (``zero3_comm = blocking-per-tensor``, the ``deepspeed-zero3-2021``
profile): DeepSpeed v0.3.13 gathers every parameter by its own all-gather after a device-wide
``torch.cuda.synchronize()`` and reduce-scatters every gradient by its own call
(``partition_parameters.py``: ``_allgather_param``, ``_reduce_scatter_gradient``)."""

from __future__ import annotations

import pytest

from meshplan.catalog import load_gpu, load_model, load_stack
from meshplan.cost import collectives as coll
from meshplan.cost.calibration import AMPERE
from meshplan.cost.collectives import GroupPlacement
from meshplan.cost.comm import fsdp_unit_times, per_tensor_time
from meshplan.cost.compose import layer_times
from meshplan.cost.params import (
    embedding_params_per_rank, expert_params_per_rank, head_params_per_rank, layer_params_per_rank, layer_tensors_per_rank,
    moe_layer_tensors_per_rank, unit_tensors_per_rank,
)
from meshplan.estimate import estimate
from meshplan.specs import ClusterSpec
from meshplan.specs.plan import PrecisionRecipe, TrainingPlan
from meshplan.specs.stack import applied

A100 = load_gpu("a100-sxm-80gb")
DENSE = ("llama3-8b", "llama3-405b", "llama2-7b", "gpt3-175b", "nemotron4-340b", "gemma2-9b", "gemma3-27b")
MOE = ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3-671b", "grok1-314b")


@pytest.mark.parametrize("name", DENSE + MOE)
@pytest.mark.parametrize("tp", [1, 2, 8])
def test_the_tensors_sum_to_each_unit_exactly(name, tp):
    model = load_model(name)
    for pp in (1, 4):
        layer, emb, head = unit_tensors_per_rank(model, tp, pp)
        assert sum(layer) == layer_params_per_rank(model, tp)
        assert sum(emb) == embedding_params_per_rank(model, tp) and sum(head) == head_params_per_rank(model, tp, pp)
    if model.is_moe:
        for ep in (1, 2, 8):
            dense, experts = moe_layer_tensors_per_rank(model, tp, ep)
            assert sum(experts) == expert_params_per_rank(model, tp, ep) and len(experts) == 2 * model.n_experts // ep
            assert sum(dense) + sum(experts) == layer_params_per_rank(model, tp, moe=True, ep=ep)


def test_gpt3_layer_is_megatron_s_twelve_tensors():
    """GPT-3 175B (h = 12,288, LayerNorm, biases): two norms' weight and bias, the fused QKV weight,
    the output projection, their biases, then h→4h and 4h→h and their biases."""
    h = 12288
    assert layer_tensors_per_rank(load_model("gpt3-175b"), 1) == (h, h, h, h, 3 * h * h, h * h, 3 * h, h, 4 * h * h, 4 * h * h, 4 * h, h)
    # Llama 3 8B (RMSNorm, GQA with 8 K/V heads of 128, SwiGLU 14,336, no biases) at TP 2
    assert layer_tensors_per_rank(load_model("llama3-8b"), 2) == (4096, 4096, (2048 + 2 * 512) * 4096, 2048 * 4096,
                                                                  2 * 7168 * 4096, 7168 * 4096)


def test_a_call_per_tensor_costs_a_ring_latency_each():
    """k tensors in k calls take (k − 1) ring latencies more than one call of their bytes: the
    latency does not depend on the size, the bandwidth term is linear in it."""
    cluster = ClusterSpec.of(A100, 1536)
    pl = GroupPlacement(1536, 8, 192, 1)
    tensors = layer_tensors_per_rank(load_model("gpt3-175b"), 1)
    latency = coll._latency_bandwidth("all_gather", 1.0, pl, cluster, AMPERE, "ring")[0]
    # NCCL's flat ring over 1,536 GPUs in 192 nodes: base + (n − g) NVLink steps + (g − 1) network steps
    assert latency == pytest.approx(AMPERE.collective_base_latency + 1344 * cluster.scale_up.latency + 191 * cluster.scale_out.latency)
    one = coll.collective_time("all_gather", sum(tensors) * 2, pl, cluster, AMPERE)
    assert per_tensor_time("all_gather", tensors, 2, pl, cluster, AMPERE) == pytest.approx(one + 11 * latency, rel=1e-12)
    fp16 = PrecisionRecipe(precision="fp16", grad_dtype="fp16")
    unit, per = (fsdp_unit_times(load_model("gpt3-175b"), 1, 1, fp16, pl, cluster, AMPERE, per_tensor=x) for x in (False, True))
    assert per[0] == pytest.approx(unit[0] + 11 * latency, rel=1e-12) and per[1] > unit[1]
    assert per[2] == pytest.approx(unit[2] + latency, rel=1e-12)  # the embedding: the table and the learned positions


def test_blocking_gathers_hide_nothing():
    args = dict(fwd=1.0, bwd=2.0, wgt=0.0, fwd_gemm=0.9, bwd_gemm=1.8, fwd_attention=0.1, bwd_attention=0.2, recompute=1.0,
                full_recompute=True, emb=(0.1, 0.1, 0.0), head=(0.2, 0.2, 0.0), tp_one=0.0, sp=False, tp_comm_overlap=False, cp=1,
                cp_comm=(0.0, 0.0), fsdp_per_layer=True, all_gather=0.5, reduce_scatter=0.7, reshard_after_forward=True,
                fsdp_units=(0.05, 0.06, 0.07, 0.08), embedding_kept=False)
    hidden, blocking = layer_times(**args), layer_times(**args, zero3_blocking=True)
    assert (hidden.fsdp_fwd, hidden.fsdp_bwd) == (0.0, 0.0)  # prefetched behind 1 s and 3 s of compute
    assert (blocking.fsdp_fwd, blocking.fsdp_bwd) == (0.5, 0.5 + 0.7)
    assert (blocking.fsdp_emb_fwd, blocking.fsdp_emb_bwd, blocking.fsdp_head_fwd, blocking.fsdp_head_bwd) == (0.05, 0.05 + 0.06, 0.07, 0.08)
    assert blocking.hidden_fsdp_fwd == blocking.hidden_fsdp_bwd == 0.0 and blocking.fwd == hidden.fwd - hidden.contention_fwd


def _zero3_step(stack: str, gpus: int) -> float:
    plan = TrainingPlan.of(dp=gpus, zero=3, micro_batch=1536 // gpus, global_batch=1536, seq_len=2048, recompute="full",
                           attention="materialized", precision=PrecisionRecipe(precision="fp16", grad_dtype="fp16"),
                           stack=load_stack(stack))
    return estimate(load_model("gpt3-175b"), ClusterSpec.of(A100, gpus), plan).time.step_s


def test_2021_zero3_stops_scaling_where_its_latencies_grow_with_the_gpus():
    """GPT-3 175B, ZeRO-3 without model parallelism, batch 1,536 (Narayanan et al. SC'21's
    comparison): gathered per tensor and blocking, the step stops shortening from 768 to 1,536
    GPUs, as that paper's ZeRO-3 rows did; prefetched per layer it keeps shrinking."""
    old = {n: _zero3_step("deepspeed-zero3-2021", n) for n in (384, 768, 1536)}
    new = {n: _zero3_step("deepspeed-zero3", n) for n in (384, 768, 1536)}
    assert old[1536] > 0.95 * old[768] and old[768] < 0.8 * old[384]
    assert new[1536] < 0.7 * new[768] < 0.7 * new[384]
    assert old[384] > 1.2 * new[384] and old[1536] > 2.5 * new[1536]  # the gap grows with the GPUs


def test_the_field_applies_to_zero3_sharded_per_layer_only():
    stack = load_stack("deepspeed-zero3-2021")
    for zero, dp, applies in ((3, 8, True), (2, 8, False), (3, 1, False)):
        plan = TrainingPlan.of(dp=dp, zero=zero, global_batch=8, seq_len=1024, stack=stack)
        assert (applied(stack, plan).zero3_comm == "blocking-per-tensor") == applies
