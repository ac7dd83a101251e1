"""meshplan verify comm: every collective of one real step on gloo CPU processes against meshplan's
communication model (needs torch + transformers). Two launches of spawned workers (world 2 and
world 4) run all plans; each launch is bounded by a timeout so a hang cannot stall CI, and is
started once more if a worker is killed from outside (the machine's out-of-memory killer; a rank
failing on its own fails the test). The workers
take the device: cpu (gloo) here, and cuda (NCCL, one process per GPU) where 4 GPUs are visible,
the same tests with the same tolerances; the world-4 launch also runs verify memory's rank function
on real tensors (the path --device cuda takes)."""

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
from meshplan.cost.activations import logits_output_bytes  # noqa: E402
from meshplan.cost.calibration import calibration_for  # noqa: E402
from meshplan.cost.compose import pp_buffer_messages  # noqa: E402
from meshplan.cost.params import count_params, embedding_params_per_rank, head_params_per_rank, layer_params_per_rank  # noqa: E402
from meshplan.errors import InputError  # noqa: E402
from meshplan.estimate import estimate  # noqa: E402
from meshplan.specs.hardware import ClusterSpec  # noqa: E402
from meshplan.specs.plan import PrecisionRecipe, TrainingPlan  # noqa: E402
from meshplan.verify import comm, launch, memory, predict  # noqa: E402
from meshplan.verify.device import gpus_visible  # noqa: E402

CONFIG = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
          "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1024, "max_position_embeddings": 512}
MODEL = model_from_hf_config(CONFIG, "tiny-llama")
FP32 = PrecisionRecipe(precision="fp32", grad_dtype="fp32")


def P(**kw) -> TrainingPlan:
    return TrainingPlan.of(**({"seq_len": 64, "global_batch": 2, "precision": FP32} | kw))


WORLD2 = {
    "ddp": P(dp=2, zero=0, global_batch=4),
    "fsdp2": P(dp=2, zero=3, global_batch=4),
    "tp": P(tp=2, sequence_parallel=False),
    "tp+sp": P(tp=2, sequence_parallel=True),
    "pp-1f1b": P(pp=2, schedule="1f1b", global_batch=4),
    # returning outputs, as torch's schedule.step does by default: the last stage keeps its logits
    "pp-gpipe": P(pp=2, schedule="gpipe", global_batch=4, pp_buffers="per-micro-batch", pp_return_outputs=True),
    "pp-interleaved": P(pp=2, vpp=2, schedule="interleaved", global_batch=4),
    "pp-zbv": P(pp=2, vpp=2, schedule="zbv", global_batch=4),
    # 6 chunks of 4 layers: 0, 1, 1, 1, 1, 0, the first holding only the embedding, the last only the head
    "pp-empty-ends": P(pp=2, vpp=3, schedule="interleaved", global_batch=4),
    "zero1": P(dp=2, zero=1, global_batch=4),
    "zero2": P(dp=2, zero=2, global_batch=4),
    "cp": P(cp=2),
}
WORLD4 = {
    "fsdp2+tp+sp": P(dp=2, tp=2, zero=3, global_batch=4),
    "ddp+pp": P(dp=2, pp=2, zero=0, global_batch=8),
    "tp+sp+pp": P(tp=2, pp=2, schedule="gpipe", global_batch=4, pp_buffers="per-micro-batch", pp_return_outputs=True),
    "hsdp": P(dp=4, dp_shard=2, zero=3, global_batch=8),
    "cp4": P(cp=4),
}
ALL = list({**WORLD2, **WORLD4})
#: MLA (keys d = 48 wide, values d_v = 32): the ring passes K|V of n·g·(d + d_v), not 2·n·g·d
MLA_MODEL = model_from_hf_config({
    "model_type": "deepseek_v3", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
    "intermediate_size": 512, "vocab_size": 1024, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
    "kv_lora_rank": 64, "moe_intermediate_size": 128, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "first_k_dense_replace": 2, "max_position_embeddings": 512}, "tiny-mla")
MLA_PLAN = P(cp=2)
#: verify memory's FSDP2 (dp 2) over TP + SP (tp 2) on real tensors, in the world-4 launch
MEM_MODEL = model_from_hf_config({**CONFIG, "num_hidden_layers": 2, "max_position_embeddings": 1024}, "tiny-llama-2")
MEM_PLAN = TrainingPlan(tp=2, dp=2, zero=3, sequence_parallel=True, micro_batch=2, seq_len=256, global_batch=4, precision=FP32)


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.skipif(gpus_visible() < 4, reason="needs 4 CUDA GPUs"))])
def runs(request):
    device = request.param
    out = {}
    for jobs in (WORLD2, WORLD4):
        mla = [(MLA_MODEL, MLA_PLAN)] if jobs is WORLD2 else []
        extra = [(MEM_MODEL, MEM_PLAN)] if jobs is WORLD4 else []
        tasks = ["comm"] * (len(jobs) + len(mla)) + ["memory"] * len(extra)
        results = launch.launch([(MODEL, p) for p in jobs.values()] + mla + extra, timeout=240, device=device, task=tasks,
                                retries=1)
        out.update({name: predict.compare(MODEL, p, r) for (name, p), r in zip(jobs.items(), results)})
        out.setdefault("raw", {}).update(zip(jobs, results))
        if mla:
            out["cp-mla"] = predict.compare(MLA_MODEL, MLA_PLAN, results[len(jobs)])
    cluster = ClusterSpec.of(load_gpu("h100-sxm-80gb"), 4)
    out["device"], out["memory-ranks"] = device, results[-1]
    out["memory"] = memory.compare(MEM_MODEL, MEM_PLAN, cluster, device=device, measured=memory.gather(results[-1]))
    return out


@pytest.mark.parametrize("name", ALL)
def test_counts_exact_and_bytes_within_1_percent(runs, name):
    c = runs[name]
    assert c.ok, [r.to_dict() for r in c.failures]
    assert c.setup["device"] == runs["device"]
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
    # 6 chunks (layers 0, 1, 1, 1, 1, 0): 5 boundaries, each crossed by 4 micro-batches forward and
    # backward; each rank sends over 3 boundaries one way and 2 the other, the empty end chunks included
    ends = runs["pp-empty-ends"]
    for r in (0, 1):
        assert ends.row(f"rank {r} (pp {r}): pp send pipeline: count").measured == 4 * 5
        assert ends.row(f"rank {r} (pp {r}): pp recv pipeline: count").measured == 4 * 5


@pytest.mark.parametrize("name", ["pp-1f1b", "pp-gpipe", "pp-interleaved", "pp-zbv", "pp-empty-ends", "ddp+pp", "tp+sp+pp"])
def test_torch_stages_keep_a_receive_buffer_per_micro_batch(runs, name):
    """pp_buffers per-micro-batch is what torch's PipelineStage holds: m input buffers on every
    stage but the first and m output-gradient buffers on every stage but the last, each one stage
    boundary message (b·s·h elements, over t with sequence parallelism)."""
    plan = {**WORLD2, **WORLD4}[name]
    last = plan.pp * plan.vpp - 1
    message = plan.micro_batch * plan.seq_len * MODEL.hidden // (plan.tp if plan.tp > 1 and plan.sequence_parallel else 1)
    for res in runs["raw"][name]:
        mine = res["stages"]
        count = pp_buffer_messages("per-micro-batch", plan.grad_accum, sum(k != 0 for k in mine), sum(k != last for k in mine))
        assert res["pp_buffers"] == [message] * count, (res["rank"], mine)


@pytest.mark.parametrize("name", ["fsdp2", "fsdp2+tp+sp"])
def test_fsdp_within_tolerance(runs, name):
    c = runs[name]
    assert c.ok, [r.to_dict() for r in c.failures]


@pytest.mark.parametrize("name", ["fsdp2", "fsdp2+tp+sp"])
def test_fsdp_charges_the_embedding_and_head_units(runs, name):
    """Per micro-batch: every decoder layer, the embedding and the [norm, LM head] unit all-gather
    forward; layers and embedding gather again in backward (the head unit stays gathered); all
    reduce-scatter their gradients. Bytes: L·P_l + P_emb + P_head (fp32)."""
    plan = {**WORLD2, **WORLD4}[name]
    c = runs[name]
    m, t, w, L = plan.grad_accum, plan.tp, 4, MODEL.n_layers
    layer, emb, head = (x * w for x in (layer_params_per_rank(MODEL, t), embedding_params_per_rank(MODEL, t),
                                        head_params_per_rank(MODEL, t, 1)))
    where = "ranks 0,1" if plan.num_gpus == 2 else "ranks 0,1,2,3"
    expected = {
        "all_gather forward": (m * (L + 2), m * (L * layer + emb + head)),
        "all_gather backward": (m * (L + 1), m * (L * layer + emb)),
        "reduce_scatter backward": (m * (L + 2), m * (L * layer + emb + head)),
    }
    for key, (count, nbytes) in expected.items():
        assert c.row(f"{where}: dp {key}: count").measured == count == c.row(f"{where}: dp {key}: count").predicted
        assert math.isclose(c.row(f"{where}: dp {key}: bytes").predicted, nbytes, rel_tol=1e-12)
        assert math.isclose(c.row(f"{where}: dp {key}: bytes").measured, nbytes, rel_tol=1e-12)
    # FSDP2's copies (meshplan.cost.fsdp_copies), counted in torch's own ops: a copy-out with every
    # all-gather (2·P·w), a copy-in with every reduce-scatter (P·(w + γ)); in fp32 both 8 bytes per parameter
    copies = {"copy_out forward": "all_gather forward", "copy_out backward": "all_gather backward",
              "copy_in backward": "reduce_scatter backward"}
    for key, of in copies.items():
        count, nbytes = expected[of]
        for what, value in (("count", count), ("bytes", 2 * nbytes)):
            row = c.row(f"{where}: fsdp2 {key}: {what}")
            assert row.measured == value == row.predicted and row.tolerance == 0.0


@pytest.mark.parametrize("name", ["pp-1f1b", "pp-interleaved", "pp-gpipe", "tp+sp+pp"])
def test_last_stage_keeps_every_output_when_the_schedule_returns_them(runs, name):
    """pp_return_outputs is what torch's last stage holds after a step that returns outputs: its
    output_chunks, one logits tensor of O = e·n·V/t bytes per micro-batch (the vocabulary-sharded
    local logits under TP), which estimate counts (logits_output_bytes); nothing without it, and
    nothing on the other stages."""
    plan = {**WORLD2, **WORLD4}[name]
    last = plan.pp * plan.vpp - 1
    o = logits_output_bytes(MODEL, plan.micro_batch, plan.seq_len, plan.tp, plan.cp, 4)
    assert o == plan.micro_batch * plan.seq_len * MODEL.vocab_size // plan.tp * 4
    for res in runs["raw"][name]:
        for k, kept in zip(res["stages"], res["pp_outputs"]):
            assert kept == ([o] * plan.grad_accum if k == last and plan.stack.pp_return_outputs else []), (name, res["rank"], k)


def test_zero1_is_ddp_all_reduce_and_owner_broadcasts(runs):
    """torch's ZeRO-1: DDP's one all-reduce of P·γ, then one broadcast per rank of the parameters
    it updated (P·w in all), in place of meshplan's reduce-scatter and all-gather of the same bytes."""
    c = runs["zero1"]
    grads = 4 * count_params(MODEL).total
    ar, bc = c.row("ranks 0,1: dp all_reduce backward: bytes"), c.row("ranks 0,1: dp broadcast optimizer: bytes")
    assert ar.measured == grads and ar.known == grads and ar.predicted == 0
    assert bc.measured == grads and c.row("ranks 0,1: dp broadcast optimizer: count").measured == 2
    rs = c.row("ranks 0,1: dp reduce_scatter backward: count")
    assert rs.predicted == 1 and rs.known == -1 and rs.measured == 0


def test_zero2_gathers_once_per_micro_batch(runs):
    """FSDP2 with weights kept gathered: no all-gather in backward; every unit gathered forward and
    reduce-scattered backward once per micro-batch."""
    c = runs["zero2"]
    m, L = WORLD2["zero2"].grad_accum, MODEL.n_layers
    assert c.row("ranks 0,1: dp all_gather forward: count").measured == m * (L + 2)
    assert c.row("ranks 0,1: dp reduce_scatter backward: count").measured == m * (L + 2)
    assert not any("all_gather backward" in r.item for r in c.rows)


def test_hsdp_reduces_within_shards_and_all_reduces_across_replicas(runs):
    c = runs["hsdp"]
    m, L = WORLD4["hsdp"].grad_accum, MODEL.n_layers
    where = "ranks 0,1,2,3"
    assert c.row(f"{where}: dp_shard reduce_scatter backward: count").measured == m * (L + 2)
    ar = c.row(f"{where}: dp_rep all_reduce backward: bytes")
    assert ar.measured == ar.predicted == 4 * count_params(MODEL).total / 2  # the gradient shard, once per step
    assert c.row(f"{where}: dp_rep all_reduce backward: count").measured == L + 2  # one per FSDP unit


@pytest.mark.parametrize("name,c", [("cp", 2), ("cp4", 4)])
def test_ring_attention_kv_exchange(runs, name, c):
    """Context parallelism (a reference ring attention, torch's context_parallel having no CPU
    kernel rule): per layer and micro-batch c − 1 K/V messages forward, 2·(c − 1) backward (K/V and
    their gradients), each 2·n·g·d·e with n = s/c (d_v = d); and the ring equals full attention."""
    run = runs[name]
    m, L = 2, MODEL.n_layers
    where = "ranks " + ",".join(str(r) for r in range(c))
    kv = 2 * (64 // c) * MODEL.n_kv_heads * MODEL.head_dim * 4
    for kind in ("send", "recv"):
        assert run.row(f"{where}: cp {kind} forward: count").measured == m * L * (c - 1)
        assert run.row(f"{where}: cp {kind} forward: bytes").measured == m * L * (c - 1) * kv
        assert run.row(f"{where}: cp {kind} backward: bytes").measured == 2 * m * L * (c - 1) * kv
    assert run.row("ranks whose ring attention equals full attention (output, dQ, dK, dV)").measured == c


def test_ring_attention_mla_values_narrower_than_keys(runs):
    """MLA's values are d_v = 32 wide against keys of d = 48: each K|V message is
    n·g·(d + d_v)·e = 32·4·80·4 = 40,960 bytes (2·n·g·d·e would be 49,152), measured and predicted
    alike, and the ring still equals full attention."""
    run, L, m = runs["cp-mla"], MLA_MODEL.n_layers, 2
    assert (MLA_MODEL.head_dim, MLA_MODEL.value_head_dim, MLA_MODEL.n_kv_heads) == (48, 32, 4)
    kv = 32 * 4 * (48 + 32) * 4
    assert kv == 40_960
    for kind in ("send", "recv"):
        fwd = run.row(f"ranks 0,1: cp {kind} forward: bytes")
        assert fwd.measured == fwd.predicted == m * L * kv
        bwd = run.row(f"ranks 0,1: cp {kind} backward: bytes")
        assert bwd.measured == bwd.predicted == 2 * m * L * kv
    assert run.ok, [r.to_dict() for r in run.failures]
    assert run.row("ranks whose ring attention equals full attention (output, dQ, dK, dV)").measured == 2


def test_memory_rank_function_on_real_processes(runs):
    """verify memory's per-rank function on real tensors over a real process group (what --device
    cuda runs, here on gloo): every rank holds the same shard sizes, the persistent state equals the
    fake-group measurement byte for byte (on CUDA less Adam's step counters, 4 bytes for each of the
    21 tensors, which stay on the host), and the rows are within tolerance."""
    c, ranks = runs["memory"], runs["memory-ranks"]
    assert c.ok, [r.to_dict() for r in c.failures]
    assert c.setup["tensors"] == "real" and len(ranks) == 4 and [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert all(r["state"] == ranks[0]["state"] for r in ranks)
    fake = memory.measure(MEM_MODEL, MEM_PLAN)
    assert fake["tensors"] == "fake"
    host_counters = 4 * 21 if runs["device"] == "cuda" else 0
    for key, less in (("Sharded Param", 0), ("Sharded Grad", 0), ("OptState", host_counters)):
        assert ranks[0]["state"][key] == fake["state"][key] - less
    assert ranks[0]["state"]["Sharded Param"] == 1_706_496 == c.row("weights").predicted


def test_predicted_tp_collectives_time_to_estimates_tp_time():
    """The list of collectives is the one estimate() times: same count, bytes and group (torch's
    TP, as the verification runs it: every collective exposed, no backward re-gather)."""
    for sp in (False, True):
        plan = TrainingPlan.of(tp=4, seq_len=2048, global_batch=4, sequence_parallel=sp, tp_backward_overlap=False)
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
    with pytest.raises(InputError, match="^dp_shard:"):
        comm.check_plan(MODEL, P(dp=4, dp_shard=2, zero=1, global_batch=4))
    with pytest.raises(InputError, match="^cp:"):
        comm.check_plan(MODEL, P(cp=2, tp=2))
    with pytest.raises(InputError, match="^precision:"):
        comm.check_plan(MODEL, TrainingPlan(tp=2, seq_len=64, global_batch=1))
    with pytest.raises(InputError, match="^n_kv_heads:"):
        comm.check_plan(MODEL, P(tp=8))


def test_timeout_kills_the_workers():
    with pytest.raises(RuntimeError, match="did not finish within"):
        launch.launch([(MODEL, WORLD2["ddp"])], timeout=0.5)


def test_cli_comm(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(CONFIG))
    assert main(["verify", "comm", "--model", str(cfg), "--seq-len", "64", "--dp", "2", "--zero", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["setup"]["dp"] == 2
    assert [r["item"] for r in out["rows"]] == ["ranks 0,1: dp all_reduce backward: count", "ranks 0,1: dp all_reduce backward: bytes"]
