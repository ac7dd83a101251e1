"""The rules a plan must keep for its model: one list, used per plan (:func:`check_rules`, an
error naming the field and the rule) and by the search, which applies the same predicates to its
columns of plans (:mod:`meshplan.search.space`; :data:`REASONS` its rejection reasons).

Each predicate says where a plan *breaks* its rule, on Python numbers or on NumPy arrays over
plans alike (``%``, ``&``, ``|`` and comparisons, elementwise). Symbols as in docs/model.md: t,
c, p, v, D tensor, context, pipeline, virtual-stage and data-parallel degrees, ep the
expert-parallel size, s the sequence length, b the micro-batch, B the global batch (sequences),
m = B/(b·D) the micro-batches per step.

Rules that need only the plan's own fields (B divisible by b·D, D_s dividing D, ep dividing D)
are the plan's (:class:`meshplan.specs.plan.TrainingPlan`); those that need the cluster too
(t·c·p·D equal to the GPU count, the GPU's dtypes) are :func:`meshplan.specs.validate.check_plan`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from meshplan.errors import InputError
from meshplan.pipeline.stages import EMPTY_END_STAGES, STAGES_RULE, too_many_stages
from meshplan.specs.model import ModelSpec

#: Most micro-batch chunks (micro-batches per step x pp x vpp) the pipeline event simulation is
#: asked to run: 2**20, about 2 s (benchmarks/bench_pipeline.py runs half of it, p = 64,
#: m = 1,024, v = 8, in under a second). Beyond it a plan is refused, not left to hang.
MAX_PIPELINE_CHUNKS = 1_048_576

#: the schedules that run the micro-batches in rounds of p
INTERLEAVED = ("interleaved", "interleaved-zb")


# ---- the predicates: True where a plan breaks the rule -----------------------------------------
def tp_breaks(model: ModelSpec, t: Any) -> Any:
    """t must divide the attention heads a, divide or be a multiple of the KV heads g, and divide
    the MLP width f and the routed and shared experts' widths (Megatron's column/row split)."""
    g = model.n_kv_heads
    return ((model.n_heads % t != 0) | ((g % t != 0) & (t % g != 0)) | (model.ffn_hidden % t != 0)
            | (model.expert_ffn_hidden % t != 0) | (model.shared_expert_ffn_hidden % t != 0))


def stages_break(model: ModelSpec, p: Any, v: Any) -> Any:
    """p·v ≤ L + 2: only the first and last stages, with the embedding and the LM head, may hold
    no layer (:mod:`meshplan.pipeline.stages`)."""
    return p * v > model.n_layers + EMPTY_END_STAGES


def cp_breaks(s: Any, c: Any) -> Any:
    """Load-balanced causal context parallelism cuts the sequence into 2c chunks: 2c divides s."""
    return (c > 1) & (s % (2 * c) != 0)


def sp_breaks(s: Any, c: Any, t: Any, sp: Any) -> Any:
    """Sequence parallelism splits each CP rank's s/c tokens over t: t divides s/c."""
    return sp & (t > 1) & ((s // c) % t != 0)


def ep_sp_breaks(ep: Any, t: Any, sp: Any) -> Any:
    """Expert parallelism with t > 1 needs sequence parallelism (as Megatron-Core requires)."""
    return (ep > 1) & (t > 1) & (np.logical_not(sp) if isinstance(sp, np.ndarray) else not sp)


def ep_hsdp_breaks(ep: Any, hsdp: Any) -> Any:
    """HSDP shard groups (a shard group of fewer than D ranks) with ep > 1 are not modelled."""
    return (ep > 1) & hsdp


def op_recompute_breaks(model: ModelSpec, mode: str) -> bool:
    """Op-level selective recompute is modelled for dense layers of standard attention (not MoE
    layers, not MLA)."""
    return mode == "op" and (model.is_moe or model.is_mla)


def batch_breaks(B: Any, b: Any, D: Any) -> Any:
    """b·D divides the global batch B (m = B/(b·D) micro-batches per step)."""
    return B % (b * D) != 0


def rounds_break(interleaved: Any, m: Any, p: Any) -> Any:
    """The interleaved schedules run the m micro-batches in max(1, ⌊m/p⌋) equal rounds
    (:func:`meshplan.pipeline.schedules.rounds_of`)."""
    rounds = m // p
    rounds = rounds + (rounds < 1)  # max(1, ⌊m/p⌋), on numbers and arrays
    return interleaved & (m % rounds != 0)


def pipeline_size_breaks(m: Any, p: Any, v: Any) -> Any:
    """m·p·v ≤ :data:`MAX_PIPELINE_CHUNKS`, what the pipeline simulation runs."""
    return m * p * v > MAX_PIPELINE_CHUNKS


# ---- the rules, in the order a plan is checked ----------------------------------------------
@dataclass(frozen=True)
class PlanRule:
    """A rule of the list: its search rejection ``key``, the plan ``field`` an error names, the
    rule in words (``text``), where a plan breaks it (``broken``, on a plan) and the one line that
    says so for that plan (``message``)."""

    key: str
    field: str
    text: str
    broken: Callable[[ModelSpec, Any], Any]
    message: Callable[[ModelSpec, Any], str]


def _tp_message(model: ModelSpec, plan: Any) -> str:
    t, g = plan.tp, model.n_kv_heads
    if model.n_heads % t:
        return f"tp ({t}) must divide the number of attention heads ({model.n_heads})"
    if g % t and t % g:
        return f"tp ({t}) must divide, or be a multiple of, the number of KV heads ({g})"
    if model.ffn_hidden % t:
        return f"tp ({t}) must divide the MLP hidden size ({model.ffn_hidden})"
    if model.expert_ffn_hidden % t:
        return f"tp ({t}) must divide the expert MLP hidden size ({model.expert_ffn_hidden})"
    return f"tp ({t}) must divide the shared expert's MLP hidden size ({model.shared_expert_ffn_hidden})"


def _rounds_message(model: ModelSpec, plan: Any) -> str:
    m, n_rounds = plan.grad_accum, max(1, plan.grad_accum // plan.pp)
    return (f"interleaved schedules need the {m} micro-batches to split into {n_rounds} equal rounds "
            f"(a multiple of {n_rounds}; any multiple of pp = {plan.pp} works)")


def _hsdp(plan: Any) -> bool:
    return plan.dp_shard not in (None, plan.dp)  # a shard group of all dp is plain sharding


#: in the order the search applies them (by mesh, then by batch, then within a mesh), then those
#: its space never breaks (it proposes ep, recompute modes and the stack of the model's own)
PLAN_RULES: tuple[PlanRule, ...] = (
    PlanRule("tp_heads", "tp", "tp must divide the attention heads, the KV heads (or be a multiple of them) and the MLP width",
             lambda model, p: bool(tp_breaks(model, p.tp)), _tp_message),
    PlanRule("cp_seq", "seq_len", "seq_len must be divisible by 2 x cp (load-balanced causal context parallelism)",
             lambda model, p: bool(cp_breaks(p.seq_len, p.cp)),
             lambda model, p: f"seq_len ({p.seq_len}) must be divisible by 2 x cp ({2 * p.cp}) for load-balanced causal "
                              "context parallelism"),
    PlanRule("stages_layers", "pp", f"pp x vpp {STAGES_RULE}", lambda model, p: bool(stages_break(model, p.pp, p.vpp)),
             lambda model, p: too_many_stages(p.pp * p.vpp, model.n_layers).rule),
    PlanRule("interleaved_rounds", "global_batch", "interleaved schedules need the micro-batches in equal rounds of pp",
             lambda model, p: bool(rounds_break(p.schedule in INTERLEAVED, p.grad_accum, p.pp)), _rounds_message),
    PlanRule("pipeline_size", "global_batch", f"micro-batches x pp x vpp must not exceed {MAX_PIPELINE_CHUNKS:,} (simulation limit)",
             lambda model, p: bool(pipeline_size_breaks(p.grad_accum, p.pp, p.vpp)),
             lambda model, p: f"micro-batches per step x pp x vpp = {p.grad_accum:,} x {p.pp} x {p.vpp} = "
                              f"{p.grad_accum * p.pp * p.vpp:,} is more than the pipeline simulation runs "
                              f"({MAX_PIPELINE_CHUNKS:,}); use a larger micro-batch or a smaller global batch"),
    PlanRule("sp_seq", "seq_len", "sequence parallelism needs seq_len / cp divisible by tp",
             lambda model, p: bool(sp_breaks(p.seq_len, p.cp, p.tp, p.sequence_parallel)),
             lambda model, p: f"with sequence parallelism seq_len / cp must be divisible by tp ({p.tp})"),
    PlanRule("ep_sp", "sequence_parallel", "expert parallelism (ep > 1) with tp > 1 needs sequence parallelism",
             lambda model, p: bool(ep_sp_breaks(p.ep, p.tp, p.sequence_parallel)),
             lambda model, p: "expert parallelism with tp > 1 needs sequence parallelism (as in Megatron-Core)"),
    PlanRule("ep_hsdp", "dp_shard", "HSDP shard groups with expert parallelism (ep > 1) are not modelled",
             lambda model, p: bool(ep_hsdp_breaks(p.ep, _hsdp(p))),
             lambda model, p: "HSDP (dp_shard) with expert parallelism (ep > 1) is not modelled; use one or the other"),
    PlanRule("ep_dense", "ep", "expert parallelism needs a mixture-of-experts model",
             lambda model, p: p.ep > 1 and not model.is_moe,
             lambda model, p: f"ep = {p.ep} needs a mixture-of-experts model; {model.name} is dense (use ep = 1)"),
    PlanRule("ep_experts", "ep", "ep must divide the number of experts",
             lambda model, p: model.is_moe and model.n_experts % p.ep != 0,
             lambda model, p: f"ep ({p.ep}) must divide the number of experts ({model.n_experts})"),
    PlanRule("op_recompute", "recompute", "op-level selective recompute is modelled for dense layers of standard attention",
             lambda model, p: op_recompute_breaks(model, p.recompute),
             lambda model, p: "op-level selective recompute is modelled for "
                              + ("dense layers; use selective or full with a mixture-of-experts model" if model.is_moe
                                 else "standard attention; use selective or full with MLA")),
    PlanRule("fp8_gather_moe", "fsdp_fp8_all_gather", "FP8 all-gather is modelled for dense models",
             lambda model, p: model.is_moe and p.stack.fsdp_fp8_all_gather,
             lambda model, p: "FP8 all-gather is modelled for dense models (torchao's Float8Linear blocks); "
                              "turn it off for a mixture-of-experts model"),
    PlanRule("fp8_scaling_library", "fp8_scaling", "row-wise FP8 scaling is torchao's Float8 linears' (compiled or eager kernels)",
             lambda model, p: p.precision.fp8_scaling != "tensorwise" and p.stack.fp8_library != "torchao",
             lambda model, p: f"fp8_scaling {p.precision.fp8_scaling} is torchao's recipe; the plan's FP8 linears are "
                              f"{p.stack.fp8_library}'s, which scale per tensor: use fp8_scaling tensorwise, or "
                              "fp8_linears torchao on the compiled or eager kernels"),
    PlanRule("recompute_layers_moe", "recompute_layers", "recompute of some layers per stage is modelled for dense models",
             lambda model, p: model.is_moe and p.recompute_layers is not None,
             lambda model, p: f"recompute_layers ({p.recompute_layers}) is modelled for dense models; {model.name} is a mixture "
                              "of experts: recompute every layer (leave recompute_layers unset)"),
    PlanRule("learned_positions", "seq_len", "seq_len must not exceed the model's learned positions",
             lambda model, p: model.position == "learned" and p.seq_len > model.max_position,
             lambda model, p: f"seq_len ({p.seq_len}) exceeds {model.name}'s {model.max_position} learned positions"),
)

#: the plan's own batch rule (:class:`meshplan.specs.plan.TrainingPlan`), in words
BATCH_TEXT = "micro_batch x dp must divide the global batch"

#: the search's rejection reasons, in the order it applies them: its rules' (the plan's batch rule
#: among them), then memory
_SEARCH_ORDER = ("tp_heads", "cp_seq", "stages_layers", "batch_divisible", "interleaved_rounds", "pipeline_size", "sp_seq",
                 "ep_sp", "ep_hsdp")
_TEXTS = {rule.key: rule.text for rule in PLAN_RULES} | {"batch_divisible": BATCH_TEXT}
REASONS: dict[str, str] = {
    **{key: _TEXTS[key] for key in _SEARCH_ORDER},
    "memory": "peak memory per GPU above the usable HBM",
}


def check_rules(model: ModelSpec, plan: Any) -> None:
    """Raise on the first rule of :data:`PLAN_RULES` the plan breaks for ``model``: one
    :class:`~meshplan.errors.InputError` naming the field and the rule."""
    for rule in PLAN_RULES:
        if rule.broken(model, plan):
            raise InputError(rule.field, rule.message(model, plan))
