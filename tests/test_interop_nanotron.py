"""nanotron exports per release and imports of its own configs, against nanotron's source:

* the GPUs a config runs on: nanotron 0.2's ``ParallelContext`` (``src/nanotron/parallel/context.py``)
  takes dp x tp x pp x expert_parallel_size ranks and its dataloader (``src/nanotron/dataloader.py``)
  splits the batch over dp x expert_parallel_size of them; main's asserts tp x pp x cp x dp = world
  size, so an expert axis cannot start there;
* context parallelism: 0.2 has none, and main's Llama (``src/nanotron/models/llama.py``) has no
  ring attention (its Qwen model has);
* recompute: 0.2's ``recompute_granularity`` only feeds the FLOPs it logs (``get_flops`` in
  ``models/llama.py``), main's ``recompute_layer`` checkpoints each decoder layer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from meshplan import interop
from meshplan.catalog import load_model
from meshplan.errors import InputError
from meshplan.interop import nanotron
from meshplan.specs.plan import TrainingPlan
from test_bad_input import run_cli

LLAMOE = Path(__file__).parent / "data" / "engine_configs" / "nanotron_v0.2_config_llamoe.yaml"

MIXTRAL = TrainingPlan(tp=2, pp=4, dp=8, ep=8, global_batch=256, seq_len=4096)


def world(par: dict, release: str) -> int:
    """The ranks a ``parallelism`` section needs in ``release`` (ParallelContext of each)."""
    n = par["dp"] * par["tp"] * par["pp"] * par.get("context_parallel_size", 1)
    return n * par.get("expert_parallel_size", 1) if release == "0.2" else n


def sections(engine: str, model_name: str, plan: TrainingPlan):
    result = interop.export(engine, load_model(model_name), plan)
    return yaml.safe_load(result.text), result.warnings


def named(warnings, field: str) -> list[str]:
    return [w for w in warnings if w.startswith(f"{field}: ")]


# ---- EP: an axis of nanotron's world size ----------------------------------------------------


def test_mixtral_export_runs_on_the_plans_64_gpus():
    secs, warnings = sections("nanotron@0.2", "mixtral-8x7b", MIXTRAL)
    par, tok = secs["parallelism"], secs["tokens"]
    assert (par["dp"], par["tp"], par["pp"], par["expert_parallel_size"]) == (1, 2, 4, 8)
    assert world(par, "0.2") == MIXTRAL.num_gpus == 64
    # 0.2's dataloader splits the batch over dp x expert_parallel_size ranks, as meshplan's 8 DP ranks
    assert tok["micro_batch_size"] * tok["batch_accumulation_per_replica"] * par["dp"] * par["expert_parallel_size"] == 256
    # its gradients are averaged over dp_pg only: the weights outside the experts are not averaged across EP
    assert len(named(warnings, "ep")) == 1 and "dp_pg" in named(warnings, "ep")[0]


def test_main_cannot_start_an_expert_axis_and_keeps_the_gpu_count():
    secs, warnings = sections("nanotron@main", "mixtral-8x7b", MIXTRAL)
    par = secs["parallelism"]
    assert "expert_parallel_size" not in par and par["dp"] == 8
    assert world(par, "main") == 64
    assert len(named(warnings, "ep")) == 1


@pytest.mark.parametrize("engine", ["nanotron", "nanotron@0.2", "nanotron@main"])
@pytest.mark.parametrize("plan", [
    MIXTRAL,
    TrainingPlan(tp=2, cp=2, dp=4, ep=2, global_batch=64, seq_len=8192),
    TrainingPlan(tp=4, pp=2, cp=4, dp=2, micro_batch=2, global_batch=16, seq_len=16384),
], ids=["mixtral", "cp-ep", "cp-micro"])
def test_every_export_runs_on_the_plans_gpus_with_its_batch(engine, plan):
    secs, _ = sections(engine, "mixtral-8x7b", plan)
    par, tok = secs["parallelism"], secs["tokens"]
    release = "main" if engine.endswith("main") else "0.2"
    assert world(par, release) == plan.num_gpus
    replicas = par["dp"] * (par.get("expert_parallel_size", 1) if release == "0.2" else 1)
    assert tok["micro_batch_size"] * tok["batch_accumulation_per_replica"] * replicas == plan.global_batch


def test_llamoe_example_reads_as_four_gpus():
    parsed = interop.parse_text(LLAMOE.read_text())
    f = parsed.plan
    assert (f["dp"], f["ep"], f["tp"], f["pp"], f["cp"]) == (4, 4, 1, 1, 1)
    assert interop.options_of(parsed)["gpus"] == 4
    assert f["global_batch"] == 256 * 2 * 4 and f["micro_batch"] == 256 and f["seq_len"] == 256
    assert f["recompute"] == "none"
    assert any(n.startswith("parallelism.expert_parallel_size: ") for n in parsed.notes)
    m = parsed.model  # LlaMoEConfig (examples/moe/config_llamoe.py): 4 experts, top-1
    assert (m.n_experts, m.experts_per_token, m.expert_ffn_hidden, m.n_layers, m.hidden) == (4, 1, 2048, 6, 512)
    interop.to_plan(f)  # a plan meshplan estimates


def test_llamoe_example_on_the_command_line():
    code, out, err = run_cli("import", str(LLAMOE))
    assert code == 0, err
    assert "--gpus 4" in out and "--dp 4" in out and "--ep 4" in out


# ---- CP: no ring attention in the exported Llama --------------------------------------------


@pytest.mark.parametrize("engine", ["nanotron@0.2", "nanotron@main"])
def test_cp_is_never_written_for_the_llama(engine):
    plan = TrainingPlan(tp=8, cp=2, dp=2, global_batch=32, seq_len=8192)
    secs, warnings = sections(engine, "llama3-70b", plan)
    par, tok = secs["parallelism"], secs["tokens"]
    assert "context_parallel_size" not in par
    assert (par["dp"], tok["batch_accumulation_per_replica"], tok["micro_batch_size"]) == (4, 8, 1)
    assert len(named(warnings, "cp")) == 1
    if engine.endswith("main"):
        assert "ring attention" in named(warnings, "cp")[0]


def test_cp_that_cannot_become_data_parallel_is_refused():
    plan = TrainingPlan(tp=8, cp=2, dp=2, global_batch=2, seq_len=8192)
    with pytest.raises(InputError) as err:
        interop.export("nanotron@main", load_model("llama3-70b"), plan)
    assert err.value.field == "cp"


def test_imported_cp_with_the_llama_is_noted():
    text = interop.export("nanotron@main", load_model("llama3-8b"), TrainingPlan(tp=2, dp=2, global_batch=8, seq_len=4096)).text
    parsed = interop.parse_text(text.replace("parallelism:\n", "parallelism:\n  context_parallel_size: 2\n"))
    assert parsed.plan["cp"] == 2 and any(n.startswith("parallelism.context_parallel_size: ") for n in parsed.notes)


# ---- recompute per release ------------------------------------------------------------------


def test_full_recompute_per_release():
    plan = TrainingPlan(tp=2, dp=4, global_batch=32, seq_len=4096, recompute="full")
    old, old_warn = sections("nanotron@0.2", "llama3-8b", plan)
    assert not {"recompute_layer", "recompute_granularity"} & set(old["parallelism"])
    assert len(named(old_warn, "recompute")) == 1
    new, new_warn = sections("nanotron@main", "llama3-8b", plan)
    assert new["parallelism"]["recompute_layer"] is True and not named(new_warn, "recompute")


def test_default_target_is_the_release_that_imports():
    model = load_model("llama3-8b")
    for plan in (MIXTRAL, TrainingPlan(tp=2, dp=4, global_batch=32, seq_len=4096, recompute="full")):
        assert interop.export("nanotron", model, plan) == interop.export(f"nanotron@{nanotron.DEFAULT}", model, plan)
    assert nanotron.DEFAULT == "0.2"


def test_sgd_needs_main():
    from meshplan.specs.plan import PrecisionRecipe

    plan = TrainingPlan(dp=2, global_batch=8, seq_len=4096, precision=PrecisionRecipe(optimizer="sgd"))
    old, old_warn = sections("nanotron@0.2", "llama3-8b", plan)
    assert "optimizer_factory" not in old["optimizer"] and named(old_warn, "precision.optimizer")
    new, _ = sections("nanotron@main", "llama3-8b", plan)
    assert new["optimizer"]["optimizer_factory"] == {"name": "sgd"}


@pytest.mark.parametrize("value", ["FULL", "SELECTIVE", "full"])
def test_recompute_granularity_of_0_2_is_read_as_no_recompute(value):
    text = LLAMOE.read_text().replace("recompute_granularity: null", f"recompute_granularity: {value}")
    parsed = interop.parse_text(text)
    assert parsed.plan["recompute"] == "none"
    assert any(n.startswith("parallelism.recompute_granularity: ") and "FLOPs" in n for n in parsed.notes)


def test_recompute_layer_of_main_is_read_as_full():
    text = interop.export("nanotron@main", load_model("llama3-8b"),
                          TrainingPlan(dp=2, global_batch=8, seq_len=4096, recompute="full")).text
    assert interop.parse_text(text).plan["recompute"] == "full"
    both = text.replace("recompute_layer: true", "recompute_layer: true\n  recompute_granularity: FULL")
    with pytest.raises(InputError):
        interop.parse_text(both)
