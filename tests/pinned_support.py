"""What the pinned-numbers test compares: every published run's prediction (``meshplan validate
--set all``) and the search's top 10 on three spaces, as plain JSON.

``python tests/pinned_support.py`` rewrites ``tests/data/pinned/numbers.json`` from the current
code. Do that only in a change whose purpose is to move numbers, and say so in its message: a
restructuring must leave the file as it is.

Floats are stored with ``repr`` precision, so equality is bit for bit. A plan is recorded as its
flat fields (layout, batch, precision recipe and the stack's behaviour fields), so the record does
not depend on how a plan nests them.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

PINNED = Path(__file__).parent / "data" / "pinned" / "numbers.json"


def flat_plan(plan) -> dict[str, Any]:
    """A plan's fields, nested specs flattened (``precision.grad_dtype`` -> ``grad_dtype``)."""
    out: dict[str, Any] = {}
    for key, value in plan.model_dump(mode="json").items():
        if isinstance(value, dict):
            out.update({k: v for k, v in value.items() if k != "name"})
        else:
            out[key] = value
    return dict(sorted(out.items()))


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, dtype=np.float64).tobytes()).hexdigest()


def validate_numbers() -> dict[str, Any]:
    from meshplan.accuracy.validate import runs_of, predict

    out = {}
    for run in runs_of("all"):
        r = predict(run)
        if r.status != "ok":
            out[r.id] = {"status": r.status}
            continue
        out[r.id] = {
            "plan": flat_plan(run.plan), "step_s": r.predicted_step_s, "mem_gib": r.predicted_mem_gib,
            "mfu": r.predicted_mfu, "breakdown": r.breakdown,
        }
    return out


def search_spaces():
    """Three spaces: a dense 70B on 512 GPUs (default stack), an MoE on 64 GPUs, and an 8B on 64
    GPUs run with torch's stack (compiled blocks, per-micro-batch pipeline buffers, AsyncTP, and
    without it each TP collective where autograd meets it)."""
    from meshplan.catalog import load_gpu, load_model
    from meshplan.search.space import SearchLimits
    from meshplan.specs import ClusterSpec

    h100 = load_gpu("h100-sxm-80gb")
    return {
        "llama3-70b-512": (load_model("llama3-70b"), ClusterSpec.of(h100, 512), dict(global_batch=512, seq_len=8192),
                           SearchLimits(max_micro_batch=2, max_vpp=4, max_cp=2)),
        "mixtral-8x7b-64": (load_model("mixtral-8x7b"), ClusterSpec.of(h100, 64), dict(global_batch=256, seq_len=4096),
                            SearchLimits(max_micro_batch=2, max_vpp=2)),
        "llama3-8b-64-torch": (load_model("llama3-8b"), ClusterSpec.of(h100, 64),
                               dict(global_batch=128, seq_len=8192, stack=dict(
                                   kernels="compiled", pp_buffers="per-micro-batch", tp_overlap_kind="micro-pipeline",
                                   tp_backward_overlap=False)),
                               SearchLimits(max_micro_batch=2, max_vpp=2, tp_comm_overlap=(False, True))),
    }


def base_plan(fields: dict[str, Any]):
    """The search's base plan and stack from the space's fields (``stack`` holds the behaviour
    fields; the search applies them to each plan, not to the base)."""
    from meshplan.specs import TrainingPlan
    from meshplan.specs.stack import Stack

    fields = dict(fields)
    stack = Stack(**fields.pop("stack", {}))
    return TrainingPlan.of(**fields, stack=stack), stack


def search_numbers() -> dict[str, Any]:
    from meshplan.search.engine import Engine
    from meshplan.search.run import search
    from meshplan.search.space import enumerate_plans

    out = {}
    for name, (model, cluster, fields, limits) in search_spaces().items():
        base, stack = base_plan(fields)
        table = enumerate_plans(model, cluster.num_gpus, cluster.gpus_per_node, base.seq_len, (base.global_batch,), limits)
        screen = Engine(model, cluster, base, stack).evaluate(table)
        res = search(model, cluster, base, limits, top_k=10, stack=stack)
        out[name] = {
            "evaluated": res.evaluated, "feasible": res.feasible, "rejected": dict(sorted(res.rejected.items())),
            "screen_peak_bytes": _digest(screen.peak_bytes), "screen_step_lower_bound": _digest(screen.step_lower_bound),
            "top": [{"plan": flat_plan(r.estimate.plan), "step_s": r.estimate.time.step_s,
                     "peak_bytes": r.estimate.peak_bytes, "score": r.score} for r in res.top],
        }
    return out


def current() -> dict[str, Any]:
    return {"validate": validate_numbers(), "search": search_numbers()}


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parents[1] / "src"))
    PINNED.parent.mkdir(parents=True, exist_ok=True)
    PINNED.write_text(json.dumps(current(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {PINNED}")
