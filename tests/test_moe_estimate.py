"""Mixture-of-experts and MLA in the estimate: FLOPs (active parameters, MLA attention), memory
(experts sharded by ep, their state by the expert data-parallel group), the expert-parallel
all-to-all and its placement, and the plan rules."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.catalog import load_model
from meshplan.catalog.hf_config import model_from_hf_config
from meshplan.cost import collectives as coll
from meshplan.cost.calibration import calibration_for
from meshplan.cost.flops import step_flops
from meshplan.cost.moe import alltoall_bytes, expert_placements, moe_layers_per_stage
from meshplan.cost.params import count_params, expert_params_per_rank, layer_params_per_rank, rank_params
from meshplan.errors import InputError
from meshplan.estimate import estimate
from meshplan.pipeline.stages import layer_split
from meshplan.catalog import load_gpu
from meshplan.specs import ClusterSpec
from meshplan.specs.plan import TrainingPlan


def _cluster(gpus: int) -> ClusterSpec:
    return ClusterSpec.of(load_gpu("h100-sxm-80gb"), gpus)


# ---- FLOPs ------------------------------------------------------------------------------------
def test_mixtral_dense_flops_count_the_two_active_experts():
    m = load_model("mixtral-8x7b")
    h, kv, f, L, V = 4096, 8 * 128, 14336, 32, 32000
    attention = 2 * h * h + 2 * h * kv  # q, o and k, v
    router = 8 * h
    active_experts = 2 * 3 * h * f  # top-2 of 8 SwiGLU experts
    n_active = L * (attention + router + active_experts) + V * h
    assert n_active == 12_748_587_008 == count_params(m).active_matmul
    tokens = 4096 * 1024
    assert step_flops(m, 4096, 1024).dense == 6 * n_active * tokens
    # all 8 experts would be 3.6x as many matmul FLOPs
    assert count_params(m).matmul == n_active + L * 6 * 3 * h * f


def test_deepseek_v3_mla_attention_flops():
    m = load_model("deepseek-v3-671b")
    s, B = 4096, 16
    a, d_qk, d_v, L = 128, 192, 128, 61
    # forward per layer and sequence, causal: QKᵀ s²·a·d_qk + A·V s²·a·d_v (half of 2·s²·a·(d_qk + d_v))
    fwd = s * s * a * (d_qk + d_v)
    assert step_flops(m, s, B).attention == 3 * fwd * L * B
    assert step_flops(m, s, B, attention_flops="full").attention == 2 * 3 * fwd * L * B
    # dense: 37.55B active parameters less the embedding (a lookup) and the norms
    assert count_params(m).active_matmul == 36_624_596_992


def test_full_recompute_repeats_the_active_layers_only():
    m = load_model("mixtral-8x7b")
    f = step_flops(m, 4096, 8, "full")
    pc = count_params(m)
    attn_fwd = f.attention // 3
    assert f.recompute == 2 * pc.layers_active_matmul * 4096 * 8 + attn_fwd


torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TINY = {
    "mixtral": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 101, "max_position_embeddings": 128,
                "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2_moe": {"hidden_size": 64, "intermediate_size": 80, "moe_intermediate_size": 24,
                  "shared_expert_intermediate_size": 40, "num_hidden_layers": 3, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "vocab_size": 99, "max_position_embeddings": 64, "num_experts": 6,
                  "num_experts_per_tok": 2, "mlp_only_layers": [1]},
    "deepseek_v3": {"hidden_size": 64, "intermediate_size": 112, "moe_intermediate_size": 16, "num_hidden_layers": 3,
                    "num_key_value_heads": 4,
                    "num_attention_heads": 4, "vocab_size": 97, "max_position_embeddings": 64, "n_routed_experts": 8,
                    "n_shared_experts": 2, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "n_group": 2,
                    "topk_group": 1, "q_lora_rank": 32, "kv_lora_rank": 24, "qk_rope_head_dim": 8,
                    "qk_nope_head_dim": 12, "v_head_dim": 20},
}


@pytest.mark.parametrize("kind", sorted(TINY))
def test_flops_equal_flop_counter_on_a_tiny_model(kind):
    """torch's FlopCounterMode over forward + backward of the transformers model on CPU, eager
    attention and eager experts (one mm per expert and routed token group; the grouped-GEMM
    kernels are not counted by FlopCounterMode): the matmul FLOPs equal 6·N_active·T exactly and
    the attention bmm FLOPs meshplan's full-s² attention exactly, whatever the routing."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = transformers.AutoConfig.for_model(kind, **TINY[kind])
    torch.manual_seed(0)
    try:  # transformers 5 fuses the experts into grouped kernels unless told otherwise; 4.x loops over them
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", experts_implementation="eager")
    except (TypeError, ValueError):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    b, s = 2, 16
    ids = torch.randint(0, cfg.vocab_size, (b, s))
    with FlopCounterMode(display=False) as fwd:
        loss = model(input_ids=ids, labels=ids).loss
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    counts = {}
    for mode in (fwd, bwd):
        for op, n in mode.get_flop_counts()["Global"].items():
            counts[str(op)] = counts.get(str(op), 0) + n
    predicted = step_flops(model_from_hf_config({"model_type": kind, **TINY[kind]}, kind), s, b, attention_flops="full")
    assert counts.pop("aten.mm") + counts.pop("aten.addmm", 0) == predicted.dense  # addmm: biased linears
    assert counts.pop("aten.bmm") == predicted.attention
    assert counts == {}


# ---- memory -----------------------------------------------------------------------------------
def _mixtral_plan(**kw):
    base = dict(tp=2, pp=4, dp=8, ep=8, micro_batch=1, global_batch=256, seq_len=4096, recompute="selective", zero=1)
    return TrainingPlan.of(**(base | kw))


def test_expert_weights_are_split_by_ep_and_state_by_expert_data_parallel():
    m = load_model("mixtral-8x7b")
    plan = _mixtral_plan()
    est = estimate(m, _cluster(64), plan)
    h, f, t, ep = 4096, 14336, 2, 8
    experts_per_gpu = 8 * 3 * h * f // (ep * t)  # one layer's experts: 8/ep on this GPU, each split by TP
    assert expert_params_per_rank(m, t, ep) == experts_per_gpu
    stage = est.stages[1]  # layers 8..15: no embedding, no head
    assert stage.layers == 8
    experts = 8 * experts_per_gpu
    dense = stage.params - experts
    assert stage.params == rank_params(m, t, 4, 8, False, False, 8, ep)
    assert dense == 8 * (layer_params_per_rank(m, t, moe=True, ep=ep) - experts_per_gpu)
    rec = plan.precision
    assert stage.weights == dense * 2 + experts * 2
    assert stage.gradients == dense * 4 + experts * 4
    # ZeRO-1: dense optimizer state over dp x cp = 8, the experts' over dp x cp / ep = 1
    assert stage.optimizer == dense * rec.optimizer_bytes / 8 + experts * rec.optimizer_bytes / 1
    # ep = 1: every GPU holds all 8 experts, sharded with the rest
    one = estimate(m, _cluster(64), _mixtral_plan(ep=1)).stages[1]
    assert one.params == dense + 8 * experts
    assert one.optimizer == one.params * rec.optimizer_bytes / 8


def test_moe_layer_activations_hold_the_routed_copies():
    from meshplan.cost.activations import layer_activations

    m = load_model("mixtral-8x7b")
    dense = layer_activations(m, 1, 4096, 2, 1, True, "none", "flash", 2, moe=False)
    moe = layer_activations(m, 1, 4096, 2, 1, True, "none", "flash", 2, moe=True)
    n, h, f, k, t, e = 4096, 4096, 14336, 2, 2, 2
    items = dict(moe.items)
    assert items["router_probs"] == 4 * n * 8
    assert items["expert_inputs"] == items["expert_outputs"] == n * k * h * e
    assert items["expert_hidden"] == 3 * n * k * f / t * e
    # the MoE layer replaces the dense MLP hidden (3·n·f/t·e) with the k routed copies and more
    assert moe.stored - dense.stored == pytest.approx(4 * n * 8 + 2 * n * k * h * e + 3 * n * (k - 1) * f / t * e)


def test_deepseek_dense_first_layers_per_stage():
    m = load_model("deepseek-v3-671b")
    split = layer_split(61, 8, 1)
    per = moe_layers_per_stage(m, split)
    assert sum(per) == 58
    assert per[0] == split[0] - 3 and per[1:] == list(split[1:])


# ---- communication ----------------------------------------------------------------------------
def test_alltoall_per_moe_layer_over_the_ep_group():
    m = load_model("mixtral-8x7b")
    cluster = _cluster(64)
    plan = _mixtral_plan(recompute="none")
    est = estimate(m, cluster, plan)
    ep_group, edp = expert_placements(cluster, plan)
    # ep sits on the dp axis, outside tp = 2: 8 consecutive dp ranks are 16 GPUs, two nodes of 8
    assert (ep_group.size, ep_group.per_node, ep_group.nodes) == (8, 4, 2)
    assert edp.size == 1  # dp / ep x cp
    n, k, h, e, t = 4096, 2, 4096, 2, 2
    S = n * k * h * e / t
    assert alltoall_bytes(m, n, t, True, e) == S
    one = coll.collective_time("all_to_all", S, ep_group, cluster, calibration_for(cluster.gpu))
    # 8 MoE layers per rank x (2 forward + 2 backward) all-to-alls x 32 micro-batches
    assert est.time.ep_comm_s == pytest.approx(32 * 8 * 4 * one, rel=1e-12)
    assert est.time.breakdown()["ep_comm"] == est.time.ep_comm_s
    full = estimate(m, cluster, _mixtral_plan(recompute="full"))
    assert full.time.ep_comm_s == pytest.approx(32 * 8 * 6 * one, rel=1e-12)
    # ep = 1: no all-to-all
    assert estimate(m, cluster, _mixtral_plan(ep=1)).time.ep_comm_s == 0.0


def test_dense_models_report_no_expert_parallel_part():
    est = estimate(load_model("llama3-8b"), _cluster(8), TrainingPlan(tp=8, global_batch=8, seq_len=4096))
    assert "ep_comm" not in est.time.breakdown()


def test_step_parts_add_up_for_moe():
    est = estimate(load_model("deepseek-v3-671b"), _cluster(1024),
                   TrainingPlan(tp=2, pp=16, dp=32, ep=32, vpp=1, global_batch=1024, seq_len=4096, recompute="full", zero=1))
    assert est.time.step_s == pytest.approx(sum(est.time.breakdown().values()), rel=1e-9)
    assert est.flops.model == step_flops(est.model, 4096, 1024).model


# ---- rules ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "model, kw, field",
    [
        ("mixtral-8x7b", dict(ep=16, dp=16, pp=2), "ep"),  # 16 does not divide 8 experts
        ("llama3-8b", dict(ep=2, dp=8, pp=4), "ep"),  # dense model
        ("mixtral-8x7b", dict(dp_shard=4), "dp_shard"),
        ("mixtral-8x7b", dict(sequence_parallel=False), "sequence_parallel"),
        ("mixtral-8x7b", dict(recompute="op"), "recompute"),
        ("deepseek-v3-671b", dict(ep=1, recompute="op"), "recompute"),
    ],
)
def test_plan_rules(model, kw, field):
    with pytest.raises(InputError) as exc:
        estimate(load_model(model), _cluster(64), _mixtral_plan(**kw))
    assert exc.value.field == field


# ---- the search (ep = 1) agrees with estimate ---------------------------------------------------
def _deepseek_lite():
    from meshplan.specs.model import ModelSpec

    # DeepSeek-V2-Lite's shape (deepseek-ai/DeepSeek-V2-Lite config.json), MLA without q_lora_rank
    return ModelSpec(
        name="deepseek-v2-lite", n_layers=27, hidden=2048, n_heads=16, n_kv_heads=16, head_dim=192, ffn_hidden=10944,
        vocab_size=102400, n_experts=64, experts_per_token=6, expert_ffn_hidden=1408, shared_expert_ffn_hidden=2816,
        dense_layers=(0,), kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128,
    )


@pytest.mark.parametrize("which, gpus", [("mixtral-8x7b", 32), ("lite", 16)])
def test_search_memory_is_estimates_to_the_bit_for_moe(which, gpus):
    import numpy as np

    from meshplan.search.engine import Engine
    from meshplan.search.space import SearchLimits, enumerate_plans
    from meshplan.specs.validate import check_plan

    model = _deepseek_lite() if which == "lite" else load_model(which)
    cluster = _cluster(gpus)
    base = TrainingPlan(global_batch=64, seq_len=4096)
    lim = SearchLimits(max_micro_batch=2, max_vpp=3, hsdp=True)
    table = enumerate_plans(model, gpus, 8, 4096, (64,), lim)
    assert "op" not in {table.row(i)["recompute"] for i in range(len(table))}
    screen = Engine(model, cluster, base).evaluate(table)
    rng = np.random.default_rng(3)
    for i in rng.choice(len(table), 25, replace=False).tolist():
        plan = TrainingPlan.of(**{**base.model_dump(), **table.row(i)})
        check_plan(model, cluster, plan)
        est = estimate(model, cluster, plan)
        assert screen.peak_bytes[i] == est.peak_bytes, table.row(i)
        assert screen.step_lower_bound[i] <= est.time.step_s, table.row(i)


def test_search_takes_ep_from_its_plans_not_the_base_plan():
    from meshplan.search.engine import Engine
    from meshplan.search.space import SearchLimits, enumerate_plans

    m = load_model("mixtral-8x7b")
    table = enumerate_plans(m, 16, 8, 4096, (64,), SearchLimits(tp=1, cp=1, pp=1, micro_batch=1, recompute=("full",), zero=(1,)))
    assert table.ep.tolist() == [1, 2, 4, 8]
    one = Engine(m, _cluster(16), TrainingPlan(dp=16, global_batch=64, seq_len=4096)).evaluate(table)
    eight = Engine(m, _cluster(16), TrainingPlan(dp=16, ep=8, global_batch=64, seq_len=4096)).evaluate(table)
    assert one.peak_bytes.tolist() == eight.peak_bytes.tolist()
    assert np.all(np.diff(one.peak_bytes) < 0)  # more experts sharded, less memory per GPU


# ---- model rules and Gemma's extra norms ------------------------------------------------------
@pytest.mark.parametrize(
    "fields, rule",
    [
        (dict(n_experts=8, experts_per_token=9, expert_ffn_hidden=64), "experts_per_token (9) must be between 1 and n_experts (8)"),
        (dict(n_experts=8, experts_per_token=2), "expert_ffn_hidden must be positive"),
        (dict(experts_per_token=2), "need n_experts > 0"),
        (dict(n_experts=8, experts_per_token=2, expert_ffn_hidden=64, dense_layers=(4,)), "dense_layers must be distinct layer indices in 0 .. 3"),
        (dict(n_experts=8, experts_per_token=2, expert_ffn_hidden=64, shared_expert_gate=True), "shared_expert_gate needs a shared expert"),
        (dict(kv_lora_rank=16, qk_rope_head_dim=32), "qk_rope_head_dim (32) must be between 1 and head_dim - 1 (31)"),
        (dict(kv_lora_rank=16, n_kv_heads=2, qk_rope_head_dim=8), "n_kv_heads must equal n_heads"),
        (dict(v_head_dim=16), "need kv_lora_rank > 0"),
    ],
)
def test_model_rules(fields, rule):
    from meshplan.specs.model import ModelSpec

    base = dict(name="m", n_layers=4, hidden=128, n_heads=4, n_kv_heads=4, head_dim=32, ffn_hidden=256, vocab_size=100)
    with pytest.raises(InputError) as exc:
        ModelSpec.build(**(base | fields))
    assert rule in str(exc.value)


def test_gemma_four_norms_in_activations_and_time():
    from meshplan.cost.activations import layer_activations
    from meshplan.cost.compute import elementwise_bytes, layer_op_times
    from meshplan.cost.kernel_time import memory_time

    g4 = load_model("gemma2-9b")
    g2 = g4.model_copy(update={"norms_per_layer": 2})
    n, h, e, t = 4096, 3584, 2, 2
    a4 = layer_activations(g4, 1, 4096, t, 1, True, "none", "flash", e)
    a2 = layer_activations(g2, 1, 4096, t, 1, True, "none", "flash", e)
    assert dict(a4.items)["post_norm_inputs"] == 2 * n * h * e / t
    assert a4.stored - a2.stored == 2 * n * h * e / t
    gpu = load_gpu("h100-sxm-80gb")
    cal = calibration_for(gpu)
    o4 = layer_op_times(g4, 1, 4096, t, 1, True, "flash", "causal", gpu, cal, "bf16", e)
    o2 = layer_op_times(g2, 1, 4096, t, 1, True, "flash", "causal", gpu, cal, "bf16", e)
    extra = 2 * (n * h / t) * elementwise_bytes(e)["norm"]
    assert o4.fwd_memory - o2.fwd_memory == pytest.approx(memory_time(extra, gpu, cal) - cal.kernel_overhead, rel=1e-9)
    assert o4.fwd_gemm == o2.fwd_gemm


def test_expert_tp_exchange_replaces_the_moe_mlp_pair():
    """With tp > 1 Megatron-Core's all-to-all dispatcher all-gathers the dispatched tokens over the
    TP group and reduce-scatters the experts' output (n·k·h·e each), outside the TP overlap, where
    a dense MLP's sequence parallelism moves n·h·e: a top-1 MoE layer's TP time equals its dense
    twin's, a top-2 layer's exceeds it by the larger exchange, forward and backward."""
    from meshplan.cost.comm import plan_placements, tp_collective_time
    from meshplan.cost.moe import expert_tp_time

    cluster = _cluster(16)
    cal = calibration_for(cluster.gpu)
    mix = load_model("mixtral-8x7b")
    top1 = mix.model_copy(update={"experts_per_token": 1})
    dense = mix.model_copy(update={"n_experts": 0, "experts_per_token": 0, "expert_ffn_hidden": 0})
    # every TP collective exposed (not the backward's own overlap, which the exchange does not have)
    kw = dict(tp=2, dp=8, pp=1, micro_batch=1, global_batch=64, seq_len=4096, recompute="none", zero=1, tp_backward_overlap=False)
    plan = TrainingPlan.of(ep=8, **kw)
    pl = plan_placements(cluster, plan)
    n, h, e = 4096, 4096, 2
    tp_one = tp_collective_time(n * h * e, True, pl.tp, cluster, cal)
    x2 = expert_tp_time(mix, n, pl.tp, e, cluster, cal)
    assert x2 == tp_collective_time(2 * n * h * e, True, pl.tp, cluster, cal) > tp_one
    assert expert_tp_time(top1, n, pl.tp, e, cluster, cal) == tp_one
    assert expert_tp_time(mix, n, plan_placements(cluster, TrainingPlan.of(ep=8, **(kw | {"tp": 1, "dp": 16}))).tp, e, cluster, cal) == 0.0
    tp_s = {name: estimate(m, cluster, plan if m.is_moe else TrainingPlan.of(**kw)).time.tp_comm_s
            for name, m in (("top2", mix), ("top1", top1), ("dense", dense))}
    assert tp_s["top1"] == pytest.approx(tp_s["dense"], rel=1e-12)
    # 8 micro-batches x 32 layers x (forward + backward) x (n·k·h exchange − n·h pair)
    assert tp_s["top2"] - tp_s["top1"] == pytest.approx(8 * 32 * 2 * (x2 - tp_one), rel=1e-9)
    # the TP overlap hides the dense MLP's pair, not the expert exchange
    overlapped = {name: estimate(m, cluster, TrainingPlan.of(tp_comm_overlap=True, **(kw | ({"ep": 8} if m.is_moe else {})))).time.tp_comm_s
                  for name, m in (("top1", top1), ("dense", dense))}
    assert overlapped["top1"] >= 8 * 32 * 2 * tp_one > overlapped["dense"]
