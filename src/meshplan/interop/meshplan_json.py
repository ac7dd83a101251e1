"""meshplan's own JSON as a plan file: what ``meshplan estimate --json`` prints, given back to
``--plan``, is the same plan on the same cluster (``plan`` with its stack, ``cluster``, and the
model when it is a catalog one), so an estimate can be kept, shared and rerun.

The plan's stack is read as its profile and the fields that differ from it
(:func:`meshplan.interop.stack_values`); the cluster's node size, NIC bandwidth and pods, and the
run's tokens, price and PUE, as the options of the same names. A GPU outside the catalog (a
published run's power-capped part) cannot be named by an option and is refused by ``--gpu``."""

from __future__ import annotations

from typing import Any

from meshplan.bounded_parse import load_json
from meshplan.catalog import load_model, model_names
from meshplan.errors import InputError
from meshplan.interop.common import ParseResult
from meshplan.units import GBPS

#: the plan keys of ``estimate --json`` that are TrainingPlan fields as they are
PLAN_KEYS = ("tp", "cp", "pp", "dp", "ep", "vpp", "schedule", "micro_batch", "global_batch", "seq_len", "recompute",
             "sequence_parallel", "zero", "attention", "attention_flops")
RECIPE_KEYS = ("precision", "grad_dtype", "master_weights", "grad_fp32_copy", "optimizer")


def is_meshplan_json(data: Any) -> bool:
    """An ``estimate --json`` object: a schema version and a plan that names its stack."""
    return isinstance(data, dict) and "schema_version" in data and isinstance(data.get("plan"), dict) \
        and isinstance(data["plan"].get("stack"), dict)


def parse(text: str) -> ParseResult:
    data = load_json(text, "plan")
    plan, cluster = data["plan"], data.get("cluster") or {}
    try:
        fields: dict[str, Any] = {k: plan[k] for k in PLAN_KEYS}
        fields["recompute_layers"] = plan.get("recompute_layers")  # written since recompute of some layers
        fields["dp_shard"] = None if plan["dp_shard"] == plan["dp"] else plan["dp_shard"]
        fields["layer_split"] = tuple(plan["layer_split"])
        fields["rank_order"] = tuple(plan["rank_order"])
        fields["precision"] = {k: plan[k] for k in RECIPE_KEYS}
        fields["precision"]["fp8_scaling"] = plan.get("fp8_scaling", "tensorwise")  # written since row-wise FP8
        fields["stack"] = {k: v for k, v in plan["stack"].items() if k != "overrides"}
    except (KeyError, TypeError) as exc:
        raise InputError("plan", f"a meshplan estimate JSON without plan.{exc}: write it with `meshplan estimate --json`") from None
    name = (data.get("model") or {}).get("name")
    notes: list[str] = []
    model = None
    if name in model_names():
        model = load_model(name)
    else:
        notes.append(f"model: '{name}' is not a catalog model and the JSON does not carry its shape: give --model")
    options = {"gpu": cluster.get("gpu"), "gpus": cluster.get("num_gpus"), "gpus_per_node": cluster.get("gpus_per_node"),
               "pod_size": cluster.get("pod_size"), "oversubscription": cluster.get("oversubscription")}
    if cluster.get("scale_out_bandwidth") is not None:
        options["nic_gbps"] = cluster["scale_out_bandwidth"] / GBPS
    run = data.get("run") or {}  # the budget, where the estimate had tokens
    options.update(tokens=run.get("tokens"), price=run.get("price_per_gpu_hour"), pue=run.get("pue"))
    return ParseResult("meshplan", fields, model, tuple(notes), {k: v for k, v in options.items() if v is not None})
