"""Round trips export → import for every engine.

* A grid of plans each engine can express: no warning, and the imported plan equals the exported
  one (after :func:`canonical`, which resets settings that change nothing, e.g. sequence
  parallelism without TP) and so does the model where the config carries it.
* Any plan (hypothesis): every field that does not come back is named by a warning (or follows
  from a warned one, e.g. ``vpp`` from ``schedule``) — a lossy export never drops a setting silently.
"""

from __future__ import annotations


import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshplan.catalog import load_model
from meshplan.errors import InputError
from meshplan.interop import ENGINES, canonical, export, parse_text, to_plan
from meshplan.interop.common import same_model
from meshplan.specs.stack import BEHAVIOUR_FIELDS
from meshplan.specs.plan import FP8_SCALINGS, PrecisionRecipe, TrainingPlan

MODELS = {name: load_model(name) for name in ("llama3-8b", "llama3-70b", "llama2-7b", "gpt3-175b", "nemotron4-15b")}
#: engines whose config carries the model shape (torchtitan: by Llama 3.1 flavor)
CARRIES_MODEL = {"megatron": set(MODELS), **dict.fromkeys(("nanotron", "nanotron@0.2", "nanotron@main"), {"llama3-8b", "llama3-70b", "llama2-7b"}),
                 **dict.fromkeys(("torchtitan", "torchtitan@0.3", "torchtitan@0.2", "torchtitan-toml"), {"llama3-8b", "llama3-70b"})}
#: a warned field and the fields that change with it
FOLLOWS = {
    # the stack rules follow it: the gradients' accumulation pass applies at zero 0 and 1 only
    "zero": {"reshard_after_forward", "fsdp_accumulate_unsharded", "dp_shard", "overlap_param_gather", "overlap_grad_reduce",
             "grad_accumulation"},
    "sequence_parallel": {"pp_scatter_gather"},  # split stage messages apply without sequence parallelism
    "schedule": {"vpp", "layer_split"},
    "fsdp_accumulate_unsharded": {"zero", "reshard_after_forward", "overlap_grad_reduce"},  # the stack rules follow it
    "model": {"vpp", "layer_split"},  # torchtitan: without a known flavor the stage count is unknown
    "kernels": {"compile_loss"},  # fused exported as compiled blocks and loss (torchtitan), or as eager (DeepSpeed)
    "precision": {"fp8_linears"},  # FP8 exported as BF16 (DeepSpeed, nanotron): no FP8 library either
    "cp": {"dp", "micro_batch"},  # nanotron: the CP ranks exported as data-parallel ones
}
#: fields an engine's export refuses to write as another job (one error naming the field)
REFUSED = {"nanotron": {"cp"}}


def diff(a: TrainingPlan, b: TrainingPlan) -> set[str]:
    """The plan and stack fields that differ (the stack's profile name is no setting of the engine)."""
    plan = {k for k in TrainingPlan.model_fields if k != "stack" and getattr(a, k) != getattr(b, k)}
    return plan | {k for k in BEHAVIOUR_FIELDS if getattr(a.stack, k) != getattr(b.stack, k)}


def roundtrip(engine: str, model, plan: TrainingPlan):
    result = export(engine, model, plan)
    parsed = parse_text(result.text)
    fields = dict(parsed.plan)
    if engine == "deepspeed":  # DeepSpeed's JSON carries neither the sequence length nor the model
        assert "seq_len" not in fields
        fields["seq_len"] = plan.seq_len
        if "micro_batches" in parsed.options:  # no train_batch_size (TP or CP): the GPU count gives dp
            assert "dp" not in fields and "global_batch" not in fields
            fields["dp"] = plan.dp
            fields["global_batch"] = fields["micro_batch"] * parsed.options["micro_batches"] * plan.dp
    back = to_plan(fields)
    return result, parsed, back


def plan(**kw) -> TrainingPlan:
    kw.setdefault("global_batch", kw.get("micro_batch", 1) * kw.get("dp", 1) * 4)
    kw.setdefault("seq_len", 4096)
    return TrainingPlan.of(**kw)


BF16 = PrecisionRecipe(precision="bf16", grad_dtype="fp32")
#: per engine: (model, plan) pairs it expresses exactly
GRID = {
    "megatron": [
        ("llama3-8b", plan(tp=2, pp=4, dp=2, zero=1, recompute="selective")),
        ("llama3-70b", plan(tp=8, pp=4, dp=4, vpp=5, schedule="interleaved", micro_batch=2, recompute="full", tp_comm_overlap=True)),
        ("llama3-70b", plan(tp=4, pp=3, dp=2, layer_split=(26, 28, 26))),  # uneven ends
        ("llama3-8b", plan(tp=2, pp=2, dp=2, vpp=3, schedule="interleaved", layer_split=(5, 6, 5, 6, 5, 5))),  # layout
        # one layer per chunk, the first chunk only the embedding and the last only the head (Llama 3's split)
        ("llama3-8b", plan(tp=2, pp=2, dp=2, vpp=17, schedule="interleaved")),
        ("llama3-8b", plan(tp=2, pp=2, dp=2, layer_split=(0, 32))),  # a layout "E|t*32L"
        ("gpt3-175b", plan(tp=8, pp=8, dp=2, zero=0, sequence_parallel=False, attention="materialized", seq_len=2048,
                            precision=PrecisionRecipe(precision="fp16", grad_dtype="fp16", grad_fp32_copy=True))),
        ("llama2-7b", plan(tp=1, cp=2, dp=8, zero=3, precision=PrecisionRecipe(precision="fp8"), rank_order=("tp", "cp", "pp", "dp"))),
        ("llama2-7b", plan(dp=8, zero=1, dp_shard=4, overlap_param_gather=False, seq_len=2048)),
        ("llama3-8b", plan(dp=4, zero=2, precision=PrecisionRecipe(precision="fp32", grad_dtype="fp32", optimizer="sgd"))),
        ("llama3-8b", plan(tp=2, dp=2, zero=1, precision=PrecisionRecipe(precision="fp16", grad_dtype="fp32"))),
        ("nemotron4-15b", plan(tp=4, dp=2, micro_batch=4, tp_comm_overlap=True)),  # --squared-relu
        ("llama3-70b", plan(tp=8, pp=4, dp=2, recompute="full", recompute_layers=10)),  # --recompute-method block
    ],
    # torchtitan has no fused (Megatron/Transformer Engine) stack: meshplan's default kernels warn
    # there, so its plans name the stacks it runs, compiled (blocks and loss, or blocks alone) or eager,
    # and with TP torch's backward, each collective where autograd meets it (tp_backward_overlap off).
    "torchtitan": [
        ("llama3-8b", plan(dp=8, zero=3, recompute="op", kernels="compiled")),
        ("llama3-8b", plan(tp=2, dp=4, zero=3, dp_shard=2, recompute="full", tp_comm_overlap=True, tp_overlap_kind="micro-pipeline", seq_len=8192, kernels="compiled")),
        ("llama3-70b", plan(tp_backward_overlap=False, tp=8, pp=4, dp=2, zero=3, reshard_after_forward=False, fsdp_accumulate_unsharded=True, pp_buffers="per-micro-batch", overlap_grad_reduce=False, kernels="compiled", compile_loss=False)),
        ("llama3-70b", plan(tp_backward_overlap=False, tp=4, pp=2, dp=2, vpp=2, schedule="interleaved", zero=3, fsdp_accumulate_unsharded=True, pp_buffers="per-micro-batch", overlap_grad_reduce=False, micro_batch=2, kernels="eager")),
        ("llama3-70b", plan(pp=4, dp=2, vpp=4, schedule="interleaved-zb", zero=3, fsdp_accumulate_unsharded=True, pp_buffers="per-micro-batch", overlap_grad_reduce=False, kernels="compiled")),
        ("llama3-8b", plan(pp=2, dp=2, vpp=17, schedule="interleaved", zero=3, fsdp_accumulate_unsharded=True, pp_buffers="per-micro-batch", overlap_grad_reduce=False, kernels="compiled")),  # 0, 1 x 32, 0
        ("llama3-8b", plan(pp=4, dp=2, vpp=2, schedule="zbv", zero=3, fsdp_accumulate_unsharded=True, pp_buffers="per-micro-batch", overlap_grad_reduce=False, kernels="eager")),
        ("llama3-8b", plan(pp=4, dp=2, schedule="gpipe", zero=3, fsdp_accumulate_unsharded=True, pp_buffers="per-micro-batch", overlap_grad_reduce=False, reshard_after_forward=True, kernels="compiled")),
        ("llama3-8b", plan(cp=2, dp=4, zero=3, precision=PrecisionRecipe(precision="fp8"), kernels="compiled", compile_loss=False)),
        # FSDP2's FP8 all-gather: [quantize.linear.float8] enable_fsdp_float8_all_gather
        ("llama3-8b", plan(dp=8, zero=3, recompute="op", precision=PrecisionRecipe(precision="fp8"), kernels="compiled", fsdp_fp8_all_gather=True)),
        ("llama3-70b", plan(tp_backward_overlap=False, tp=8, pp=4, dp=2, zero=3, reshard_after_forward=False, fsdp_accumulate_unsharded=True, pp_buffers="per-micro-batch",
                            overlap_grad_reduce=False, precision=PrecisionRecipe(precision="fp8"), kernels="eager", fsdp_fp8_all_gather=True)),
        ("llama3-8b", plan(dp=8, zero=0, kernels="eager", grad_accumulation="autograd")),
        ("llama3-8b", plan(dp=4, zero=3, precision=PrecisionRecipe(precision="fp32"), kernels="eager")),
        # row-wise FP8 scaling: [quantize.linear.float8] recipe_name
        ("llama3-8b", plan(dp=8, zero=3, recompute="op", precision=PrecisionRecipe(precision="fp8", fp8_scaling="rowwise"), kernels="compiled")),
        ("llama3-70b", plan(tp_backward_overlap=False, tp=8, dp=4, zero=3, recompute="full", kernels="compiled",
                            precision=PrecisionRecipe(precision="fp8", fp8_scaling="rowwise_with_gw_hp"))),
    ],
    # DeepSpeed runs the PyTorch module it is given, eager: fused and compiled kernels warn there.
    "deepspeed": [
        ("llama3-8b", plan(dp=8, zero=1, overlap_param_gather=False, kernels="eager", grad_accumulation="autograd")),
        ("llama3-8b", plan(dp=8, zero=3, overlap_grad_reduce=False, kernels="eager")),
        ("llama3-8b", plan(dp=8, zero=3, overlap_param_gather=False, precision=PrecisionRecipe(precision="fp16", grad_dtype="fp16"), kernels="eager")),
        ("llama3-8b", plan(tp=4, pp=2, dp=2, zero=1, sequence_parallel=False, overlap_param_gather=False, recompute="full", tp_comm_overlap=True, kernels="eager",
                            grad_accumulation="autograd", pp_scatter_gather=True)),
        ("llama3-8b", plan(cp=4, dp=2, zero=2, overlap_param_gather=False, precision=PrecisionRecipe(precision="bf16", grad_dtype="bf16"), kernels="eager")),
        ("llama3-8b", plan(dp=16, zero=0, micro_batch=4, precision=PrecisionRecipe(precision="fp32"), kernels="eager", grad_accumulation="autograd")),
    ],
    "nanotron": [
        ("llama3-8b", plan(tp_backward_overlap=False, tp=2, pp=2, dp=2, zero=1, overlap_param_gather=False, grad_accumulation="buffer")),
        ("llama3-8b", plan(tp=4, pp=4, dp=2, zero=0, schedule="gpipe", recompute="full", tp_comm_overlap=True, grad_accumulation="buffer")),
        ("llama3-70b", plan(tp_backward_overlap=False, tp=8, dp=4, zero=0, sequence_parallel=False, precision=PrecisionRecipe(precision="bf16", grad_dtype="bf16"),
                             grad_accumulation="autograd")),
        ("llama2-7b", plan(dp=4, zero=0, precision=PrecisionRecipe(precision="fp32"), micro_batch=3, grad_accumulation="buffer")),
    ],
}
# torchtitan 0.3 (the bare name) takes FP8 from the registry function (llama3_405b's only): the
# FP8 rows are the 0.2 line's
GRID["torchtitan@0.2"] = GRID["torchtitan"]
GRID["torchtitan"] = GRID["torchtitan@0.3"] = [(m, p) for m, p in GRID["torchtitan@0.2"] if p.precision.precision != "fp8"]
# nanotron 0.2 (the bare name) has no recompute: the full-recompute rows are main's
GRID["nanotron@main"] = GRID["nanotron"]
GRID["nanotron"] = GRID["nanotron@0.2"] = [(m, p) for m, p in GRID["nanotron@main"] if p.recompute == "none"]
GRID["torchtitan-toml"] = GRID["torchtitan@0.2"] + [
    ("llama3-8b", plan(pp=4, dp=2, zero=3, fsdp_accumulate_unsharded=True, pp_buffers="per-micro-batch", overlap_grad_reduce=False, reshard_after_forward=False, kernels="eager")),
]
assert set(GRID) == set(ENGINES)


@pytest.mark.parametrize(("engine", "model_name", "p"), [(e, m, p) for e, rows in GRID.items() for m, p in rows])
def test_expressible_plans_round_trip_exactly(engine, model_name, p):
    model = MODELS[model_name]
    result, parsed, back = roundtrip(engine, model, p)
    assert result.warnings == (), result.warnings
    assert canonical(back, model) == canonical(p, model), diff(canonical(back, model), canonical(p, model))
    if model_name in CARRIES_MODEL.get(engine, ()):
        assert parsed.model is not None and same_model(parsed.model, model)
    else:
        assert parsed.model is None


def test_grid_covers_every_schedule_and_recompute_somewhere():
    plans = [p for rows in GRID.values() for _, p in rows]
    assert {p.schedule for p in plans} == {"1f1b", "interleaved", "gpipe", "interleaved-zb", "zbv"}  # zbh1: no engine has it
    assert {p.recompute for p in plans} == {"none", "selective", "op", "full"}
    assert {p.zero for p in plans} == {0, 1, 2, 3}
    assert {p.precision.precision for p in plans} == {"fp32", "bf16", "fp16", "fp8"}
    assert {(p.stack.kernels, p.stack.compile_loss) for p in plans} == {("fused", True), ("compiled", True), ("compiled", False), ("eager", True)}


# ---- any plan: what does not come back is warned -----------------------------------------------


@st.composite
def plans(draw):
    name = draw(st.sampled_from(sorted(MODELS)))
    model = MODELS[name]
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    cp = draw(st.sampled_from([1, 2]))
    pp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2, 4, 8]))
    ep = draw(st.sampled_from([d for d in (1, 2) if dp % d == 0]))
    schedule = draw(st.sampled_from(["1f1b", "gpipe", "zbh1", "interleaved", "interleaved-zb", "zbv"] if pp > 1 else ["1f1b"]))
    vpp = {"interleaved": draw(st.sampled_from([2, 3, 4])), "interleaved-zb": draw(st.sampled_from([2, 4])), "zbv": 2}.get(schedule, 1)
    stages = pp * vpp
    split = None
    if draw(st.booleans()) and stages > 1:
        cuts = sorted(draw(st.lists(st.integers(1, model.n_layers - 1), min_size=stages - 1, max_size=stages - 1, unique=True)))
        split = tuple(b - a for a, b in zip([0] + cuts, cuts + [model.n_layers]))
    micro = draw(st.sampled_from([1, 2]))
    zero = draw(st.sampled_from([0, 1, 2, 3]))
    shard = draw(st.sampled_from([None] + [d for d in (1, 2, 4) if dp % d == 0 and d < dp]))
    prec = draw(st.sampled_from([
        PrecisionRecipe(), PrecisionRecipe(precision="fp8"), PrecisionRecipe(precision="fp32"),
        PrecisionRecipe(precision="fp16", grad_dtype="fp16", grad_fp32_copy=True), PrecisionRecipe(precision="fp16"),
        PrecisionRecipe(precision="bf16", grad_dtype="bf16"), PrecisionRecipe(master_weights=False, grad_dtype="bf16"),
        PrecisionRecipe(optimizer="sgd"),
    ]))
    kernels = draw(st.sampled_from(["fused", "compiled", "eager"]))
    fp8_linears = draw(st.sampled_from(["auto", "transformer-engine"] + (["torchao"] if kernels != "fused" else [])))
    torchao = fp8_linears == "torchao" or (fp8_linears == "auto" and kernels != "fused")
    if prec.precision == "fp8" and torchao:
        prec = prec.model_copy(update={"fp8_scaling": draw(st.sampled_from(FP8_SCALINGS))})
    return model, TrainingPlan.of(
        tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, vpp=vpp, schedule=schedule, layer_split=split, micro_batch=micro,
        global_batch=micro * dp * draw(st.integers(1, 8)), seq_len=draw(st.sampled_from([2048, 4096, 8192])),
        recompute=draw(st.sampled_from(["none", "selective", "op", "full"])), sequence_parallel=draw(st.booleans()),
        zero=zero, dp_shard=shard, precision=prec, attention=draw(st.sampled_from(["flash", "materialized"])),
        rank_order=draw(st.sampled_from([("tp", "cp", "dp", "pp"), ("tp", "cp", "pp", "dp"), ("cp", "tp", "dp", "pp")])),
        overlap_grad_reduce=draw(st.booleans()), overlap_param_gather=draw(st.booleans()),
        tp_comm_overlap=draw(st.booleans()), tp_overlap_kind=draw(st.sampled_from(["userbuffers", "micro-pipeline"])),
        reshard_after_forward=draw(st.booleans()),
        fsdp_accumulate_unsharded=zero == 3 and draw(st.booleans()),
        kernels=kernels, compile_loss=draw(st.booleans()),
        pp_buffers=draw(st.sampled_from(["in-flight", "per-micro-batch"])),
        fsdp_head_in_root=zero == 3 and pp == 1 and kernels != "fused" and draw(st.booleans()),
        fsdp_fp8_all_gather=zero == 3 and torchao and kernels != "fused" and prec.precision == "fp8" and draw(st.booleans()),
        fp8_linears=fp8_linears,
    )


def warned_fields(warnings) -> set[str]:
    out = {w.split(":")[0].split(".")[0] for w in warnings}
    for name in list(out):
        out |= FOLLOWS.get(name, set())
    return out


@pytest.mark.parametrize("engine", sorted(ENGINES))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=plans())
def test_every_lost_setting_is_warned(engine, drawn):
    model, p = drawn
    try:
        result, parsed, back = roundtrip(engine, model, p)
    except InputError as err:
        assert err.field in REFUSED.get(engine.split("@")[0], set()), err
        return
    lost = diff(canonical(back, model), canonical(p, model))
    assert lost <= warned_fields(result.warnings), (lost, result.warnings)
    for w in result.warnings:  # one line each, naming a field
        assert "\n" not in w and w.split(":")[0].split(".")[0] in set(TrainingPlan.model_fields) | set(BEHAVIOUR_FIELDS) | {"model"}, w
    if parsed.model is not None and not any(w.startswith("model") for w in result.warnings):
        assert same_model(parsed.model, model)


def test_llama3_405b_plan_each_engine():
    """The Llama 3 405B preset's plan (8K stage): what each engine keeps and what it warns about."""
    from meshplan.cli.options import PlanArgs, resolve

    setup = resolve(PlanArgs(preset="llama3-405b-8k"))
    model, p = setup.model, setup.plan
    lost = {}
    for engine in ENGINES:
        result, parsed, back = roundtrip(engine, model, p)
        lost[engine] = sorted(w.split(":")[0] for w in result.warnings)
        assert (back.tp, back.pp, back.dp, back.global_batch, back.micro_batch) == (8, 16, 64, 2048, 1)
    # ZeRO-2 as Megatron-FSDP optim_grads, tp,cp,pp,dp via --use-tp-pp-dp-mapping; Meta's TP backward (torch's,
    # each collective exposed) is not Megatron-Core's, which runs it behind the GEMMs
    assert lost["megatron"] == ["tp_backward_overlap"]
    # the preset runs Megatron's fused stack: torchtitan writes compiled blocks and loss instead, DeepSpeed eager
    assert lost["torchtitan@0.2"] == ["fsdp_accumulate_unsharded", "kernels", "overlap_grad_reduce", "pp_buffers", "rank_order", "zero"]
    # torchtitan 0.3's llama3_405b registry function builds Float8 linears, which no flag removes
    assert lost["torchtitan"] == sorted(lost["torchtitan@0.2"] + ["precision.precision"])
    assert "schedule" in lost["deepspeed"] and "schedule" in lost["nanotron"]
    assert "kernels" in lost["deepspeed"] and "kernels" not in lost["nanotron"]
