"""Mixture-of-experts plans in the engines' configs, ``export --from-search`` and the import notes
of ``estimate --plan FILE``."""

from __future__ import annotations

import json

import pytest
import yaml

from meshplan import interop
from meshplan.catalog import load_model
from meshplan.interop.common import arg_tokens
from meshplan.interop.megatron import parse_layer_freq
from meshplan.specs.plan import TrainingPlan

from test_bad_input import run_cli

# Megatron-LM megatron/training/arguments.py (NVIDIA/Megatron-LM main): _add_moe_args (--num-experts,
# --moe-router-topk, --moe-ffn-hidden-size, --moe-shared-expert-intermediate-size,
# --moe-shared-expert-gate, --moe-layer-freq, --expert-model-parallel-size), _add_mla_args
# (--multi-latent-attention, --q-lora-rank, --kv-lora-rank, --qk-head-dim, --qk-pos-emb-head-dim,
# --v-head-dim) and _add_network_size_args (--qk-layernorm); megatron/core/transformer/
# transformer_config.py MLATransformerConfig: "q_head_dim = qk_head_dim + qk_pos_emb_head_dim".
MEGATRON_MOE = {
    "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size",
    "--moe-shared-expert-gate", "--moe-layer-freq", "--expert-model-parallel-size", "--multi-latent-attention",
    "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim", "--qk-layernorm",
    "--moe-token-dispatcher-type", "--moe-grouped-gemm",  # TransformerConfig's moe_token_dispatcher_type, moe_grouped_gemm
}

PLANS = {
    "mixtral-8x7b": TrainingPlan(tp=2, pp=4, dp=8, ep=8, global_batch=256, seq_len=4096),
    "deepseek-v3-671b": TrainingPlan(tp=2, pp=16, dp=32, ep=32, global_batch=1024, seq_len=4096, recompute="full"),
    "qwen3-30b-a3b": TrainingPlan(dp=8, ep=8, global_batch=64, seq_len=4096),
}


def _flags(text: str) -> dict:
    tokens = arg_tokens(text)
    out, i = {}, 0
    while i < len(tokens):
        if str(tokens[i]).startswith("--"):
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            out[tokens[i]] = None if nxt is None or str(nxt).startswith("--") else nxt
        i += 1
    return out


@pytest.mark.parametrize("name", sorted(PLANS))
def test_megatron_round_trips_moe_and_mla_models(name):
    model, plan = load_model(name), PLANS[name]
    result = interop.export("megatron", model, plan)
    assert result.warnings == ()
    back = interop.parse_text(result.text)
    assert back.model == model.model_copy(update={"source": back.model.source})  # catalog name matched
    assert back.plan["ep"] == plan.ep
    flags = _flags(result.text)
    assert flags["--expert-model-parallel-size"] == str(plan.ep)
    assert flags["--num-experts"] == str(model.n_experts)
    assert flags["--moe-router-topk"] == str(model.experts_per_token)
    assert {f for f in flags if f.startswith(("--moe", "--num-experts", "--multi-latent", "--q", "--kv-lora", "--v-head"))} <= MEGATRON_MOE


def test_megatron_deepseek_arguments():
    flags = _flags(interop.export("megatron", load_model("deepseek-v3-671b"), PLANS["deepseek-v3-671b"]).text)
    assert flags["--moe-layer-freq"] == "[" + ",".join(["0"] * 3 + ["1"] * 58) + "]"
    assert (flags["--q-lora-rank"], flags["--kv-lora-rank"], flags["--qk-head-dim"], flags["--qk-pos-emb-head-dim"],
            flags["--v-head-dim"]) == ("1536", "512", "128", "64", "128")
    assert flags["--moe-shared-expert-intermediate-size"] == "2048"
    assert "--multi-latent-attention" in flags


@pytest.mark.parametrize(
    "text, dense",
    [("1", ()), ("2", (1, 3)), ("[0,1,1,1]", (0,)), ("'([0]*2+[1]*2)'", (0, 1)), ("[1]*4", ())],
)
def test_moe_layer_freq_forms(text, dense):
    assert parse_layer_freq(text, 4) == dense


@pytest.mark.parametrize("text", ["[0,2,1,1]", "[0]*3", "x", "0", "[0]*5", "[1]*99999999999999999"])
def test_moe_layer_freq_refusals(text):
    from meshplan.errors import InputError

    with pytest.raises(InputError) as exc:
        parse_layer_freq(text, 4)
    assert exc.value.field == "moe-layer-freq"


def test_ep_in_every_engine():
    model, plan = load_model("mixtral-8x7b"), PLANS["mixtral-8x7b"]
    # torchtitan torchtitan/config/job_config.py Parallelism.expert_parallel_degree ("dp2ep":
    # context_parallel_degree <= expert_parallel_degree <= data_parallel_shard_degree x cp)
    tt = interop.export("torchtitan@0.2", model, plan)
    assert "--parallelism.expert_parallel_degree 8" in tt.text and "--parallelism.expert_tensor_parallel_degree 2" in tt.text
    assert interop.parse_text(tt.text).plan["ep"] == 8
    assert not any(w.startswith("ep: ") for w in tt.warnings)
    assert interop.parse_text(tt.text.replace("expert_tensor_parallel_degree 2", "expert_tensor_parallel_degree 1")).notes[-1:] != ()
    tt3 = interop.export("torchtitan", model, plan)  # 0.3: experts never split over TP under EP
    assert interop.parse_text(tt3.text).plan["ep"] == 8 and any(w.startswith("ep: torchtitan 0.3") for w in tt3.warnings)
    # torchtitan 0.2 splits the experts over TP as meshplan does (expert_tensor_parallel_degree = tp); EP
    # then borrows only dp_shard x cp ranks. 0.3 has no expert TP: tp > 1 under EP is named
    odd = TrainingPlan(tp=2, cp=1, dp=8, dp_shard=2, ep=4, zero=3, global_batch=64, seq_len=4096)
    assert any(w.startswith("ep: torchtitan 0.2 needs expert_parallel_degree to divide dp_shard x cp (2)")
               for w in interop.export("torchtitan@0.2", model, odd).warnings)
    assert any(w.startswith("ep: torchtitan 0.3 never splits experts over TP") for w in interop.export("torchtitan", model, odd).warnings)
    # nanotron src/nanotron/config/parallelism_config.py ParallelismArgs.expert_parallel_size
    nt = interop.export("nanotron", model, plan)
    assert yaml.safe_load(nt.text)["parallelism"]["expert_parallel_size"] == 8
    assert any(w.startswith("model.n_experts: ") for w in nt.warnings)  # LlamaConfig has no experts: said
    # DeepSpeed sets expert parallelism in code: deepspeed.moe.layer.MoE(ep_size=...)
    ds = interop.export("deepspeed", model, plan)
    assert "ep: expert parallelism is deepspeed.moe.layer.MoE(ep_size=8) in code" in ds.warnings
    assert "expert" not in ds.text and "ep_size" not in ds.text  # the JSON has no expert key


# ---- CLI ----------------------------------------------------------------------------------------
SEARCH = ["--model", "llama3-8b", "--gpus", "8", "--seq-len", "4096", "--global-batch", "32", "--max-micro-batch", "2",
          "--schedules", "1f1b"]


def test_export_from_search_writes_the_best_plan():
    code, out, err = run_cli("export", "--to", "megatron", "--from-search", *SEARCH)
    assert code == 0, err
    note = [line for line in err.splitlines() if line.startswith("note: from-search: best of ")]
    assert len(note) == 1
    code2, js, err2 = run_cli("search", *SEARCH, "--top", "1", "--json")
    assert code2 == 0, err2
    best = json.loads(js)["top"][0]["plan"]
    flags = _flags(out)
    assert flags["--tensor-model-parallel-size"] == str(best["tp"])
    assert flags["--micro-batch-size"] == str(best["micro_batch"])
    assert f"TP{best['tp']} CP{best['cp']} PP{best['pp']} DP{best['dp']}" in note[0]


def test_export_from_search_chooses_ep_within_max_ep():
    moe = ["--model", "mixtral-8x7b", "--gpus", "64", "--seq-len", "4096", "--global-batch", "128", "--max-pp", "2",
           "--max-micro-batch", "1", "--schedules", "1f1b"]
    code, out, err = run_cli("export", "--to", "megatron", "--from-search", *moe, "--max-ep", "2")
    assert code == 0, err
    code2, js, err2 = run_cli("search", *moe, "--max-ep", "2", "--top", "1", "--json")
    assert code2 == 0, err2
    best = json.loads(js)["top"][0]["plan"]
    assert best["ep"] in (1, 2)
    assert _flags(out).get("--expert-model-parallel-size", "1") == str(best["ep"])
    note = next(line for line in err.splitlines() if line.startswith("note: from-search: "))
    assert (f" EP{best['ep']} " in note) == (best["ep"] > 1)


def test_search_options_need_from_search():
    code, out, err = run_cli("export", "--to", "megatron", "--model", "llama3-8b", "--max-tp", "4")
    assert code == 2 and out == "" and err.strip() == "error: max_tp: --max-tp is a search option: it needs --from-search"


def test_export_from_search_when_nothing_fits():
    code, out, err = run_cli("export", "--to", "megatron", "--from-search", "--model", "llama3-405b", "--gpus", "8",
                             "--seq-len", "4096", "--global-batch", "8")
    assert code == 1 and out == ""
    assert err.startswith("error: from-search: no plan fits") and len(err.splitlines()) == 1


def test_estimate_plan_prints_the_import_notes(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
                                "gradient_accumulation_steps": 8, "bf16": {"enabled": True},
                                "zero_optimization": {"stage": 1}}))
    code, out, err = run_cli("import", str(path))
    notes = [line for line in err.splitlines() if line.startswith("note: ")]
    assert code == 0 and notes
    code, out, err = run_cli("estimate", "--plan", str(path), "--model", "llama3-8b", "--seq-len", "4096")
    assert code == 0, err
    assert [line for line in err.splitlines() if line.startswith("note: ")] == notes
    code, out, err = run_cli("estimate", "--plan", str(path), "--model", "llama3-8b", "--seq-len", "4096", "--json")
    assert code == 0 and json.loads(out)["plan"]["zero"] == 1
    assert [line for line in err.splitlines() if line.startswith("note: ")] == notes


def test_estimate_moe_from_the_cli():
    code, out, err = run_cli("estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--tp", "2", "--pp", "4", "--ep", "8",
                             "--seq-len", "4096", "--global-batch", "256", "--json")
    assert code == 0, err
    est = json.loads(out)
    assert est["plan"]["ep"] == 8 and est["time"]["breakdown"]["ep_comm"] > 0
    code, out, err = run_cli("estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--tp", "2", "--pp", "2", "--ep", "16",
                             "--seq-len", "4096", "--global-batch", "256")
    assert code == 2 and err.strip() == "error: ep: ep (16) must divide the number of experts (8)"


def test_search_refuses_ep_on_a_dense_model_in_one_line():
    code, out, err = run_cli("search", "--model", "llama3-8b", "--gpus", "64", "--ep", "8", "--seq-len", "4096",
                             "--global-batch", "256")
    assert code == 2 and out == ""
    assert err.strip() == "error: ep: ep = 8 needs a mixture-of-experts model; llama3-8b is dense (use ep = 1)"
