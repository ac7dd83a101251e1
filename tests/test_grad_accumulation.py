"""How each micro-batch's weight gradients join the step's (``grad_accumulation``) and Megatron-LM's
and DeepSpeed's pipeline messages split over TP (``pp_scatter_gather``): the bytes, the shares,
the rules, and what they add to a step, checked against the terms they are made of."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.catalog import load_gpu, load_model, load_stack
from meshplan.cost import collectives as coll
from meshplan.cost.grad_accumulation import accumulation_kind, grad_accumulation_bytes, grad_accumulation_share
from meshplan.cost.kernel_time import memory_time
from meshplan.cost.params import embedding_params_per_rank, head_params_per_rank, layer_params_per_rank
from meshplan.cost.terms import Terms, grad_accumulate_per_micro_batch
from meshplan.estimate import estimate
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.plan import PrecisionRecipe, TrainingPlan
from meshplan.specs.stack import ignored

A100 = load_gpu("a100-sxm-80gb")


def test_bytes_per_parameter_of_one_pass():
    # Megatron-LM v2.6's hook: read the fresh 16-bit gradient, read and write main_grad
    assert grad_accumulation_bytes("buffer", 2, 2) == 6  # fp16 main_grad
    assert grad_accumulation_bytes("buffer", 2, 4) == 10  # fp32 main_grad (bf16's accumulate_allreduce_grads_in_fp32)
    # autograd's in-place add: read both 16-bit gradients, write one; fp32 parameters: 12
    assert grad_accumulation_bytes("autograd", 2, 4) == 6
    assert grad_accumulation_bytes("autograd", 4, 4) == 12
    assert grad_accumulation_bytes("fused", 2, 4) == 0
    with pytest.raises(ValueError, match="grad_accumulation must be one of fused, buffer, autograd"):
        grad_accumulation_bytes("hooked", 2, 4)


def test_share_of_the_micro_batches_that_run_a_pass():
    assert grad_accumulation_share("buffer", 1, 2, 4) == 1 and grad_accumulation_share("buffer", 8, 2, 4) == 1
    # the first micro-batch's gradient becomes .grad: nothing to add at m = 1
    assert grad_accumulation_share("autograd", 1, 2, 4) == 0 and grad_accumulation_share("autograd", 8, 2, 4) == 7 / 8
    assert grad_accumulation_share("fused", 8, 2, 4) == 0
    m = np.array([1, 2, 240])
    assert np.array_equal(grad_accumulation_share("autograd", m, 2, 4), np.array([0.0, 0.5, 239 / 240]))
    assert np.array_equal(grad_accumulation_share("buffer", m, 2, 4), np.ones(3))
    with pytest.raises(ValueError, match="no accumulation kind 'hooked'"):
        grad_accumulation_share("hooked", 8, 2, 4)


def test_fsdp2_accumulates_unsharded_into_its_reduce_dtype():
    """torch's FSDP2 under torch's pipeline schedules (``fsdp_accumulate_unsharded``): each later
    micro-batch reads the bf16 gradient and the fp32 accumulator and writes it back, 2 + 2·4 = 10
    bytes; the first copies the gradient up, 2 + 4 = 6, a 0.6 share of a pass. With the
    parameters' own reduce dtype FSDP2 leaves it to autograd."""
    assert grad_accumulation_bytes("fsdp2", 2, 4) == 10
    assert grad_accumulation_share("fsdp2", 1, 2, 4) == 0.6 and grad_accumulation_share("fsdp2", 8, 2, 4) == (7 + 0.6) / 8
    stack = load_stack("torchtitan")
    plan = TrainingPlan.of(pp=4, dp=2, zero=3, global_batch=16, seq_len=4096, stack=stack, fsdp_accumulate_unsharded=True,
                           pp_buffers="per-micro-batch", overlap_grad_reduce=False)
    assert plan.stack.grad_accumulation == "fused"  # the field's rule: sharded gradients; FSDP2's own pass instead
    assert accumulation_kind(plan.stack, 2, 4) == "fsdp2" and accumulation_kind(plan.stack, 2, 2) == "autograd"
    model, cluster = load_model("llama3-8b"), ClusterSpec.of(load_gpu("h100-sxm-80gb"), 8)
    terms = Terms(model, cluster, plan, plan.stack)
    layer, _, emb, head = terms.grad_accumulation_passes(1, 4, 1)
    assert layer == memory_time(10 * layer_params_per_rank(model, 1), terms.cluster.gpu, terms.cal)
    kept = plan.replace(fsdp_accumulate_unsharded=False)  # per-micro-batch reduce-scatters: a shard, not charged
    assert accumulation_kind(kept.stack, 2, 4) == "fused"
    # Megatron-Core's own FSDP is not torch's FSDP2: its stack's kind stands
    megatron = TrainingPlan.of(pp=4, dp=2, zero=3, global_batch=16, seq_len=4096, stack=load_stack("megatron-core"),
                               fsdp_accumulate_unsharded=True)
    assert megatron.stack.fsdp_accumulate_unsharded and accumulation_kind(megatron.stack, 2, 4) == megatron.stack.grad_accumulation
    m = plan.num_microbatches
    assert m == 8
    assert grad_accumulate_per_micro_batch(terms, 1, 4, 1, m) == pytest.approx(tuple(x * 7.6 / 8 for x in (layer, 0.0, emb, head)))


def _plan(stack: str, fp16: bool = False, **fields) -> TrainingPlan:
    """Narayanan et al.'s kind of plan: TP 8 without sequence parallelism, full recompute, 2,048
    tokens; ``fp16``: fp16 weights and gradients (Megatron-LM v2.6's fp16 without fp32 accumulation)."""
    base = dict(tp=8, pp=1, dp=4, micro_batch=1, global_batch=32, seq_len=2048, recompute="full", sequence_parallel=False,
                attention="materialized", zero=0, stack=load_stack(stack))
    if fp16:
        base["precision"] = PrecisionRecipe(precision="fp16", grad_dtype="fp16")
    return TrainingPlan.of(**(base | fields))


def test_a_pass_is_the_rank_s_parameters_at_the_memory_rate():
    model, cluster = load_model("gpt3-175b"), ClusterSpec.of(A100, 32)
    plan = _plan("megatron-lm-2021", fp16=True, pp=2, dp=2)
    terms = Terms(model, cluster, plan, plan.stack)
    layer, moe, emb, head = terms.grad_accumulation_passes(8, 2, 1)
    # 6 bytes a parameter (fp16 gradient and main_grad) over each part's parameters on a rank
    assert layer == memory_time(6 * layer_params_per_rank(model, 8), A100, terms.cal)
    assert emb == memory_time(6 * embedding_params_per_rank(model, 8), A100, terms.cal)
    assert head == memory_time(6 * head_params_per_rank(model, 8, 2), A100, terms.cal)
    assert moe == 0.0
    # a 175B layer on one of 8 TP ranks: (4h² + 2hf)/8 weights, the column-parallel biases (3h + f)/8,
    # the row-parallel ones (2h) and the two LayerNorms (4h) whole: 226.6 M parameters, 1.36 GB a pass
    h, f = 12288, 49152
    assert layer_params_per_rank(model, 8) == (4 * h * h + 2 * h * f) // 8 + (3 * h + f) // 8 + 2 * h + 4 * h == 226_576_896


def test_the_step_grows_by_m_passes_of_every_layer_without_a_pipeline():
    """pp = 1: the micro-batches run one after another, so the buffer's pass adds m · (L · layer +
    embedding + head) to the step exactly; autograd's adds (m − 1) of them."""
    model, cluster = load_model("gpt3-175b"), ClusterSpec.of(A100, 32)
    fused = estimate(model, cluster, _plan("megatron-lm-2021", fp16=True, grad_accumulation="fused"))
    plan = _plan("megatron-lm-2021", fp16=True)
    assert plan.stack.grad_accumulation == "buffer"
    buffered = estimate(model, cluster, plan)
    layer, _, emb, head = Terms(model, cluster, plan, plan.stack).grad_accumulation_passes(8, 1, 1)
    m = plan.num_microbatches
    assert m == 8
    added = m * (model.n_layers * layer + emb + head)
    assert buffered.time.step_s - fused.time.step_s == pytest.approx(added, rel=1e-9)
    moved = 6 * (96 * layer_params_per_rank(model, 8) + embedding_params_per_rank(model, 8) + head_params_per_rank(model, 8, 1))
    assert added == pytest.approx(m * moved / (A100.hbm_bandwidth * 0.8), rel=0.01)  # 0.65 s of 8 passes of 10.4 GB
    deepspeed = _plan("megatron-deepspeed", fp16=True)
    assert deepspeed.stack.grad_accumulation == "autograd"
    plain = estimate(model, cluster, deepspeed.replace(grad_accumulation="fused"))
    layer, _, emb, head = Terms(model, cluster, deepspeed, deepspeed.stack).grad_accumulation_passes(8, 1, 1)
    gained = estimate(model, cluster, deepspeed).time.step_s - plain.time.step_s
    assert gained == pytest.approx((m - 1) * (model.n_layers * layer + emb + head), rel=1e-9)


def test_sharded_gradients_set_the_pass_aside():
    plan = _plan("megatron-deepspeed", zero=2)
    assert plan.stack.grad_accumulation == "fused"
    assert {"pp_scatter_gather", "grad_accumulation"} <= {f for f, _, _ in ignored(load_stack("megatron-deepspeed"), plan)}
    assert _plan("megatron-deepspeed", zero=1).stack.grad_accumulation == "autograd"


def test_scatter_gather_sends_a_tp_share_and_gathers_it_over_nvlink():
    model, cluster = load_model("gpt3-175b"), ClusterSpec.of(A100, 64)
    plan = _plan("megatron-lm-2021", pp=4, dp=2, fp16=True)
    assert plan.stack.pp_scatter_gather
    terms = Terms(model, cluster, plan, plan.stack)
    pl = terms.place(8, 1, 4, 2, 2)
    message = 2048 * model.hidden * 2  # n·h·e, 50.3 MB
    cm = terms.comm(8, 1, 4, 2, 1, False)
    assert cm.p2p_bytes == message  # the buffer a stage receives into is the whole message
    send = coll.collective_time("send_recv", message / 8, pl.pp, cluster, terms.cal)
    gather = coll.collective_time("all_gather", message, pl.tp, cluster, terms.cal)
    assert cm.p2p == send + gather
    whole = coll.collective_time("send_recv", message, pl.pp, cluster, terms.cal)
    assert whole > 3 * cm.p2p  # one NIC's 25 GB/s for all of it, against 1/8 of it and NVLink
    # with sequence parallelism the message is already 1/t: the field is set aside, the time the same
    sp = plan.replace(sequence_parallel=True)
    assert not sp.stack.pp_scatter_gather
    sp_terms = Terms(model, cluster, sp, load_stack("megatron-lm-2021"))
    assert sp_terms.comm(8, 1, 4, 2, 1, True).p2p == coll.collective_time("send_recv", message / 8, pl.pp, cluster, terms.cal)


def test_scatter_gather_shortens_a_communication_heavy_interleaved_pipeline():
    """Narayanan et al. 2021 (Sec. 5) measure the optimization on GPT-3 175B with interleaving: up
    to 11 % more throughput where the pipeline communicates most. On 96 A100s (TP 8, PP 12, batch
    60, one sequence a micro-batch) the gain grows with the virtual stages, whose messages it
    multiplies."""
    model, cluster = load_model("gpt3-175b"), ClusterSpec.of(A100, 96)
    gains = []
    for vpp in (2, 4, 8):
        plan = _plan("megatron-lm-2021", pp=12, dp=1, global_batch=60, schedule="interleaved", vpp=vpp, fp16=True)
        whole = estimate(model, cluster, plan.replace(pp_scatter_gather=False)).time.step_s
        gains.append(whole / estimate(model, cluster, plan).time.step_s - 1)
    assert 0 < gains[0] < gains[1] < gains[2] < 0.11
    assert gains[2] > 0.05


def test_explain_shows_the_pass_of_each_kind_of_layer():
    """``time.grad_accumulation``: a dense model's layer, a mixture of experts' MoE layer (its E/ep
    experts on the rank); none where the GEMMs fuse the accumulation."""
    cluster = ClusterSpec.of(load_gpu("h100-sxm-80gb"), 16)
    model = load_model("mixtral-8x7b")
    plan = TrainingPlan.of(tp=2, dp=8, ep=2, zero=0, global_batch=64, seq_len=4096, stack=load_stack("megatron-lm-2021"))
    (row,) = [d for d in estimate(model, cluster, plan).derivations if d.key == "time.grad_accumulation"]
    symbols = dict(row.symbols)
    assert "P_layer" not in symbols and symbols["P_moe"] == f"{layer_params_per_rank(model, 2, True, 2):,} parameters an MoE layer on a rank"
    assert symbols["bytes per parameter"].startswith("10: w + 2·g = 2 + 2·4") and "an MoE layer per micro-batch" in row.value
    fused = estimate(model, cluster, plan.replace(grad_accumulation="fused")).derivations
    assert not [d for d in fused if d.key == "time.grad_accumulation"]
