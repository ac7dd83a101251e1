"""meshplan verify comm: every collective of one real step on gloo CPU processes against meshplan's
communication model (needs torch + transformers). Two launches of spawned workers (world 2 and
world 4) run all plans; each launch is bounded by a timeout so a hang cannot stall CI."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from meshplan.catalog import load_gpu  # noqa: E402
from meshplan.catalog.hf_config import model_from_hf_config  # noqa: E402
from meshplan.cli.app import main  # noqa: E402
from meshplan.cost import collectives as coll  # noqa: E402
from meshplan.cost.calibration import calibration_for  # noqa: E402
from meshplan.cost.params import embedding_params_per_rank, head_params_per_rank  # noqa: E402
from meshplan.errors import InputError  # noqa: E402
from meshplan.estimate import estimate  # noqa: E402
from meshplan.specs.hardware import ClusterSpec  # noqa: E402
from meshplan.specs.plan import PrecisionRecipe, TrainingPlan  # noqa: E402
from meshplan.verify import comm, predict  # noqa: E402

CONFIG = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
          "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1024, "max_position_embeddings": 512}
MODEL = model_from_hf_config(CONFIG, "tiny-llama")
FP32 = PrecisionRecipe(precision="fp32", grad_dtype="fp32")


def P(**kw) -> TrainingPlan:
    return TrainingPlan(**({"seq_len": 64, "global_batch": 2, "precision": FP32} | kw))


WORLD2 = {
    "ddp": P(dp=2, zero=0, global_batch=4),
    "fsdp2": P(dp=2, zero=3, global_batch=4),
    "tp": P(tp=2, sequence_parallel=False),
    "tp+sp": P(tp=2, sequence_parallel=True),
    "pp-1f1b": P(pp=2, schedule="1f1b", global_batch=4),
    "pp-gpipe": P(pp=2, schedule="gpipe", global_batch=4),
    "pp-interleaved": P(pp=2, vpp=2, schedule="interleaved", global_batch=4),
    "pp-zbv": P(pp=2, vpp=2, schedule="zbv", global_batch=4),
}
WORLD4 = {
    "fsdp2+tp+sp": P(dp=2, tp=2, zero=3, global_batch=4),
    "ddp+pp": P(dp=2, pp=2, zero=0, global_batch=8),
    "tp+sp+pp": P(tp=2, pp=2, schedule="gpipe", global_batch=4),
}
CLEAN = [k for k in {**WORLD2, **WORLD4} if "fsdp" not in k]


@pytest.fixture(scope="module")
def runs():
    out = {}
    for jobs in (WORLD2, WORLD4):
        results = comm.launch([(MODEL, p) for p in jobs.values()], timeout=240)
        out.update({name: predict.compare(MODEL, p, r) for (name, p), r in zip(jobs.items(), results)})
    return out


@pytest.mark.parametrize("name", CLEAN)
def test_counts_exact_and_bytes_within_1_percent(runs, name):
    c = runs[name]
    assert c.ok, [r.to_dict() for r in c.failures]
    assert any(r.measured > 0 for r in c.rows)


def test_plain_tp_issues_5_backward_all_reduces_per_llama_layer(runs):
    c = runs["tp"]
    m, layers = WORLD2["tp"].grad_accum, MODEL.n_layers
    back = c.row("ranks 0,1: tp all_reduce backward: count")
    assert back.predicted == m * (2 * layers + 1)  # Megatron: 2 per layer + the LM head input gradient
    assert back.measured == m * (5 * layers + 1)  # torch's unfused q, k, v, gate, up
    assert "unfused-column-parallel-inputs" in c.known


def test_sequence_parallel_matches_megatron_without_known_differences(runs):
    c = runs["tp+sp"]
    for kind in ("all_gather", "reduce_scatter"):
        for phase in ("forward", "backward"):
            r = c.row(f"ranks 0,1: tp {kind} {phase}: count")
            assert r.known == 0 and r.measured == r.predicted == 2 * (2 * MODEL.n_layers + 1)


def test_pipeline_sends_every_boundary(runs):
    inter = runs["pp-interleaved"]
    # 4 virtual stages on 2 ranks: rank 0 holds stages 0 and 2, every boundary crosses ranks
    assert inter.row("rank 0 (pp 0): pp send pipeline: count").measured == 4 * 3
    zbv = runs["pp-zbv"]
    # V shape: stages 1 and 2 share rank 1, so each rank sends over one boundary each way
    assert zbv.row("rank 1 (pp 1): pp send pipeline: count").measured == 4 * 2


@pytest.mark.parametrize("name", ["fsdp2", "fsdp2+tp+sp"])
@pytest.mark.xfail(strict=True, reason="meshplan gap fsdp-embedding-head-units: ZeRO-3 does not charge the embedding and LM-head units")
def test_fsdp_within_tolerance(runs, name):
    assert runs[name].ok


@pytest.mark.parametrize("name", ["fsdp2", "fsdp2+tp+sp"])
def test_fsdp_excess_is_exactly_the_embedding_and_head_units(runs, name):
    plan = {**WORLD2, **WORLD4}[name]
    c = runs[name]
    m, t, w = plan.grad_accum, plan.tp, 4
    emb, head = embedding_params_per_rank(MODEL, t) * w, head_params_per_rank(MODEL, t, 1) * w
    where = "ranks 0,1" if plan.num_gpus == 2 else "ranks 0,1,2,3"
    excess = {
        "all_gather forward": (2 * m, m * (emb + head)),
        "all_gather backward": (m, m * emb),  # the head unit stays gathered after forward
        "reduce_scatter backward": (2 * m, m * (emb + head)),
    }
    for key, (count, nbytes) in excess.items():
        assert c.row(f"{where}: dp {key}: count").difference == count
        assert math.isclose(c.row(f"{where}: dp {key}: bytes").difference, nbytes)
    assert all(r.ok for r in c.rows if ": dp " not in r.item)


def test_predicted_tp_collectives_time_to_estimates_tp_time():
    """The list of collectives is the one estimate() times: same count, bytes and group."""
    for sp in (False, True):
        plan = TrainingPlan(tp=4, seq_len=2048, global_batch=4, sequence_parallel=sp)
        cluster = ClusterSpec.of(load_gpu("h100-sxm-80gb"), 4)
        from meshplan.catalog import load_model

        model = load_model("llama3-8b")
        est = estimate(model, cluster, plan)
        pl = coll.placement(cluster, {"tp": 4, "cp": 1, "pp": 1, "dp": 1}, plan.rank_order, ("tp",))
        cal = calibration_for(cluster.gpu)
        total = sum(c.count * coll.collective_time(c.kind, c.bytes, pl, cluster, cal)
                    for c in predict.predicted(model, plan, 0) if c.axis == "tp")
        assert math.isclose(total, est.time.tp_comm_s, rel_tol=1e-12)


def test_check_plan_refusals():
    with pytest.raises(InputError, match="^zero:"):
        comm.check_plan(MODEL, P(dp=2, zero=1, global_batch=2))
    with pytest.raises(InputError, match="^precision:"):
        comm.check_plan(MODEL, TrainingPlan(tp=2, seq_len=64, global_batch=1))
    with pytest.raises(InputError, match="^n_kv_heads:"):
        comm.check_plan(MODEL, P(tp=8))


def test_timeout_kills_the_workers():
    with pytest.raises(RuntimeError, match="did not finish within"):
        comm.launch([(MODEL, WORLD2["ddp"])], timeout=0.5)


def test_cli_comm(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(CONFIG))
    assert main(["verify", "comm", "--model", str(cfg), "--seq-len", "64", "--dp", "2", "--zero", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["setup"]["dp"] == 2
    assert [r["item"] for r in out["rows"]] == ["ranks 0,1: dp all_reduce backward: count", "ranks 0,1: dp all_reduce backward: bytes"]
