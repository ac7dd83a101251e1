"""The Plan view's options for a plan a search found: opened from a row of the Search view, the
Plan view estimates that very plan (the same JSON as the row's, advice and run with failures
aside).

The link holds the search's own plan options (model, GPU, network, budget, the preset), the
plan's GPUs and layout, its stack with what was set over it, and then any other field in which
the Plan view's resolution of those options (:func:`meshplan.cli.options.resolve`) would still
differ from the plan: precision, attention, the layer split, the rank order.
"""

from __future__ import annotations

from typing import Any

from meshplan.catalog import stack_overrides
from meshplan.cli.options import resolve
from meshplan.specs.plan import TrainingPlan
from meshplan.web.plan_api import STACK_QUERY, plan_args

#: Plan options a search decides (its layout), given in the link from the plan itself.
LAYOUT = ("tp", "cp", "pp", "vpp", "schedule", "micro_batch", "global_batch", "recompute", "sequence_parallel", "zero")
#: The search's options the link leaves out: the layout the plan replaces, the batch in tokens
#: (the plan's global batch replaces it) and DP (the GPUs give it).
_LEFT_OUT = set(LAYOUT) | {"dp", "ep", "dp_shard", "global_batch_tokens", "layer_split", "set_fields"}


def _text(value: Any) -> Any:
    return ("true" if value else "false") if isinstance(value, bool) else value


def _other_options(plan: TrainingPlan, key: str) -> dict[str, Any]:
    """The options that give field ``key`` of ``plan`` (one not of :data:`LAYOUT`)."""
    r = plan.precision
    if key == "precision":
        return {"precision": r.precision, "grad_dtype": r.grad_dtype, "master_weights": r.master_weights, "grad_fp32_copy": r.grad_fp32_copy,
                "fp8_scaling": r.fp8_scaling}
    if key in ("layer_split", "rank_order"):
        value = getattr(plan, key)
        return {key: ",".join(str(x) for x in value)} if value is not None else {}
    if key in ("attention", "attention_flops"):
        return {key: getattr(plan, key)}
    return {}


def plan_link(values: dict[str, Any], plan: TrainingPlan, num_gpus: int) -> dict[str, Any]:
    """The Plan view's options (its URL's query) for ``plan`` on ``num_gpus`` GPUs, found by a
    search run with the plan options ``values`` (module docstring)."""
    q: dict[str, Any] = {k: v for k, v in values.items() if k not in _LEFT_OUT and v is not None}
    q["gpus"] = num_gpus
    q.update({k: getattr(plan, k) for k in LAYOUT})
    q["zero"] = str(plan.zero)
    if plan.ep > 1:
        q["ep"] = plan.ep
    if plan.dp_shard not in (None, plan.dp):
        q["dp_shard"] = plan.dp_shard
    q["stack"] = plan.stack.name
    for k, v in stack_overrides(plan.stack, plan).items():
        if k in STACK_QUERY or k == "tp_comm_overlap":
            q[k] = _text(v)
    got = resolve(plan_args(q)).plan
    for key in TrainingPlan.model_fields:
        if key not in LAYOUT and getattr(got, key) != getattr(plan, key):
            q.update(_other_options(plan, key))
    return {k: _text(v) for k, v in q.items()}
