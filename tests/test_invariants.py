"""Invariants of the cost model as properties over random valid plans: catalog models
and GPUs, stack profiles, TP/CP/PP/DP degrees, schedules with their virtual stages, micro-batch
and accumulation, ZeRO stage, recompute, precision and attention. A draw that ``estimate``
refuses (an ``InputError``: TP not dividing the heads, too many stages, ...) is rejected at once.

* every memory column of every rank is ≥ 0 (items may be negative, the columns may not), and
  ``Estimate.to_dict()`` holds no NaN or infinity;
* ZeRO 0 → 1 never raises the peak; 1 → 2 raises a rank by at most its reduce-scatter buckets
  (the mechanism: ZeRO-2's gradients in flight at a layer's backward); 2 → 3 gathers at most the
  rank's own weights on dense models, and raises a rank by at most what ZeRO-3 adds beside its
  shards (its gathered units, FSDP2's all-gather pool and unsharded gradients) less what sharding
  the weights saves;
* at fixed batch and dp, doubling TP never raises the peak but by TP's two activation messages
  (t = 1 has none), doubling CP never raises it, and doubling PP never raises any rank's model state (its activations may
  rise: 1F1B's first rank holds p micro-batches of L/p layers, the same as one of L, beside the
  stage buffers);
* the pipeline simulation starts nothing before 0 and its makespan covers each rank's busy time;
* the search's top plans re-estimate to the same figures, and their JSON plan reads back.

HYPOTHESIS_PROFILE=ci (tests/conftest.py) derandomizes the draws."""

from __future__ import annotations

import json

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, reject, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from meshplan.catalog import load_gpu, load_model, load_stack  # noqa: E402
from meshplan.cost.activations import compiled_loss  # noqa: E402
from meshplan.errors import InputError  # noqa: E402
from meshplan.estimate import estimate  # noqa: E402
from meshplan.specs import ClusterSpec, PrecisionRecipe, TrainingPlan  # noqa: E402

MODELS = ("llama3-8b", "llama2-7b", "gemma2-9b", "nemotron4-15b", "llama3-70b", "mixtral-8x7b", "qwen3-30b-a3b")
GPUS = ("h100-sxm-80gb", "a100-sxm-80gb", "h200-sxm-141gb", "b200", "mi300x")
STACKS = ("megatron-core", "nemo", "megatron-deepspeed", "torchtitan", "torchtitan-2024", "fsdp2-eager", "deepspeed",
          "deepspeed-zero3", "nanotron", "composer")
SCHEDULES = (("1f1b", 1), ("gpipe", 1), ("interleaved", 2), ("zbh1", 1), ("zbv", 2))
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])


@st.composite
def plans(draw, zero=None):
    """(model, cluster, plan fields) of a plan; the fields go to ``TrainingPlan.of``."""
    model = draw(st.sampled_from(MODELS))
    tp, cp = draw(st.sampled_from((1, 2, 4, 8))), draw(st.sampled_from((1, 1, 2)))
    pp, dp = draw(st.sampled_from((1, 2, 4, 8, 16, 32))), draw(st.sampled_from((1, 2, 4, 8, 32)))
    schedule, vpp = draw(st.sampled_from(SCHEDULES))
    mb, accum = draw(st.sampled_from((1, 2, 4))), draw(st.sampled_from((1, 2, 4, 8)))
    fields = dict(
        tp=tp, cp=cp, pp=pp, dp=dp, vpp=vpp, schedule=schedule, micro_batch=mb, global_batch=mb * dp * accum * pp,
        seq_len=draw(st.sampled_from((1024, 4096, 8192))), recompute=draw(st.sampled_from(("none", "selective", "full"))),
        zero=draw(st.sampled_from((0, 1, 2, 3))) if zero is None else zero,
        precision=PrecisionRecipe(precision=draw(st.sampled_from(("bf16", "fp32", "fp8")))),
        attention=draw(st.sampled_from(("flash", "flash", "materialized"))), stack=load_stack(draw(st.sampled_from(STACKS))),
    )
    return load_model(model), load_gpu(draw(st.sampled_from(GPUS))), fields


def _estimate(model, gpu, fields, drawn: bool = True):
    """``estimate`` of the plan; where it is refused, the draw rejected (``drawn``) or None (a
    plan derived from the draw)."""
    try:
        plan = TrainingPlan.of(**fields)
        return estimate(model, ClusterSpec.of(gpu, plan.num_gpus), plan)
    except (InputError, ValueError):
        if drawn:
            reject()
        return None


@FAST
@given(plans())
def test_memory_columns_are_never_negative_and_the_json_is_finite(drawn):
    est = _estimate(*drawn)
    for s in est.stages:
        for col in ("weights", "gradients", "optimizer", "activations", "other"):
            assert getattr(s, col) >= 0, (col, s.rank, s.activation_items, s.other_items)
    json.dumps(est.to_dict(), allow_nan=False)  # ValueError on NaN or ±inf


@FAST
@given(plans(zero=0))
def test_peak_by_zero_stage(drawn):
    model, gpu, fields = drawn
    e0 = _estimate(model, gpu, fields)
    e1, e2, e3 = (_estimate(model, gpu, {**fields, "zero": z}) for z in (1, 2, 3))
    assert e1.peak_bytes <= e0.peak_bytes
    w = e3.plan.precision.weight_bytes
    shard = e3.plan.shard_degree
    for r1, r2, r3 in zip(e1.stages, e2.stages, e3.stages):
        # ZeRO-2's reduce-scatter buckets at a layer's backward may outweigh its sharded gradients
        assert r2.total <= r1.total + r2.other_items.get("grad_reduce_buckets", 0.0)
        items = r3.other_items
        gathered = items.get("gathered_weights", 0.0)
        if not model.is_moe:  # an MoE rank's buffers hold the model's largest layer (an upper bound)
            assert gathered <= r3.params * w, (r3.rank, items)
        # ZeRO-3 adds its gathered units (beside their shards), FSDP2's all-gather pool and the
        # gradients it keeps unsharded, and saves (1 − 1/N) of the weights (FSDP2's fp32 shards
        # standing for the master weights move gradients and optimizer state too)
        added = gathered + sum(items.get(k, 0.0) for k in ("all_gather_pool", "unsharded_gradients", "root_gradients_held"))
        state = (r3.gradients + r3.optimizer) - (r2.gradients + r2.optimizer)
        assert r3.total <= r2.total + added - r3.params * w * (1 - 1 / shard) + max(state, 0.0) + 1.0
        if shard > 1 and not items.get("all_gather_pool") and not model.is_moe and e3.plan.stack.reshard_after_forward \
                and not e3.plan.stack.fsdp_accumulate_unsharded:
            # the model says no more than the shard beside a whole stage gathered
            assert r3.total <= r2.total + r3.params * w / shard + max(state, 0.0) + 1.0


@FAST
@given(plans())
def test_peak_at_fixed_batch_by_tp_cp_and_model_state_by_pp(drawn):
    model, gpu, fields = drawn
    base = _estimate(model, gpu, fields)
    t, c, p = fields["tp"], fields["cp"], fields["pp"]
    wider = _estimate(model, gpu, {**fields, "tp": 2 * t}, drawn=False) if 2 * t <= 8 else None
    # a loss compiled without TP runs eager under torch's loss_parallel with TP (torchtitan), its
    # fp32 buffers 12·n·V/t instead of e·n·V (meshplan.cost.activations.loss_grad_bytes): a named rise
    loss = base.plan.stack.loss_kernels
    if wider is not None and compiled_loss(loss, t) == compiled_loss(loss, 2 * t):
        # TP's buffers (two activation messages) appear at t = 1 → 2
        buffers = max(s.other_items.get("tp_comm_buffers", 0.0) for s in wider.stages) if t == 1 else 0.0
        assert wider.peak_bytes <= base.peak_bytes + buffers
    longer = _estimate(model, gpu, {**fields, "cp": 2 * c}, drawn=False) if 2 * c <= 4 else None
    if longer is not None:  # half the tokens per GPU, the state sharded over twice the ranks
        assert longer.peak_bytes <= base.peak_bytes
    deeper = _estimate(model, gpu, {**fields, "pp": 2 * p, "global_batch": 2 * fields["global_batch"]}, drawn=False) \
        if 2 * p <= 32 and fields["schedule"] == "1f1b" else None
    if deeper is not None:  # (the same micro-batches per rank: m doubles with p)
        state = lambda e: max(s.weights + s.gradients + s.optimizer for s in e.stages)  # noqa: E731
        assert state(deeper) <= state(base) * (1 + 1e-12)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(("1f1b", "gpipe", "interleaved", "zbh1", "zbv")), st.sampled_from((1, 2, 4, 8)),
       st.integers(1, 4), st.floats(1e-3, 10.0), st.floats(1e-3, 10.0), st.floats(0.0, 1e3))
def test_pipeline_starts_at_zero_and_covers_every_rank(schedule, pp, rounds, fwd, bwd, transfer):
    from meshplan.pipeline.schedules import compile_schedule
    from meshplan.pipeline.simulate import simulate

    vpp = 2 if schedule in ("interleaved", "zbv") else 1
    try:
        sched = compile_schedule(schedule, pp, rounds * pp, vpp)
    except (InputError, ValueError):
        reject()
    n = pp * vpp
    res = simulate(sched, n, [fwd] * n, [bwd] * n, transfer=transfer, keep_timeline=True)
    assert min(start for lane in res.timeline for _, start, _ in lane) >= 0
    for r in range(pp):
        assert res.makespan >= res.busy[r] > 0


def test_search_top_plans_reestimate_and_read_back(tmp_path):
    """Two spaces (8 GPUs, every setting; 16 with ZeRO-3 only): each top plan's JSON row, read
    back through ``estimate --plan``, gives the same figures, and ``estimate`` of the row's plan
    the same JSON."""
    import contextlib
    import io

    from meshplan.cli.app import main

    def run(*args: str) -> dict:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(list(args)) == 0
        return json.loads(out.getvalue())

    common = ("--model", "llama3-8b", "--seq-len", "4096", "--global-batch", "64", "--max-micro-batch", "2", "--top", "3", "--json")
    for extra in (("--gpus", "8"), ("--gpus", "16", "--zero", "3")):
        for row in run("search", *common, *extra)["top"]:
            path = tmp_path / "plan.json"
            path.write_text(json.dumps(row))
            back = run("estimate", "--plan", str(path), "--json")
            for key in ("plan", "memory", "time", "throughput", "flops"):
                assert back[key] == row[key], key
