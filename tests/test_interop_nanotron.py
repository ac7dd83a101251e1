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

import pytest
import yaml

from meshplan import interop
from meshplan.catalog import load_model
from meshplan.errors import InputError
from meshplan.interop import nanotron
from meshplan.specs.plan import TrainingPlan

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
