"""What every engine module shares: the result types, the lossy-export ledger, plan fields to and
from a :class:`~meshplan.specs.plan.TrainingPlan`, the canonical form that round trips compare,
and the small text helpers (arg lists, value checks) the parsers use.

Plan fields are the keyword arguments of ``TrainingPlan`` with ``precision`` as a plain dict of
:class:`~meshplan.specs.plan.PrecisionRecipe` fields; a parser leaves out what its file does not
say (``dp`` when only the launcher knows the world size), and meshplan's defaults apply.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from meshplan.bounded_parse import brief
from meshplan.errors import InputError
from meshplan.pipeline.lockstep import runs_lockstep
from meshplan.pipeline.stages import default_layer_split
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import AXES, PrecisionRecipe, TrainingPlan
from meshplan.specs.stack import field_applies

DEFAULT_RANK_ORDER = ("tp", "cp", "dp", "pp")


@dataclass(frozen=True)
class ExportResult:
    """An engine config as text, the plan fields it could not express (``field: what happens``,
    printed as warnings) and settings the engine takes outside the file (printed as notes)."""

    text: str
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ParseResult:
    """What an engine config says about the plan (fields), the model when the config carries its
    shape, and notes on settings meshplan read approximately or could not read."""

    format: str
    plan: dict[str, Any]
    model: Optional[ModelSpec] = None
    notes: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)  # option values beyond the plan (a meshplan JSON's cluster)


@dataclass
class Ledger:
    """Collects the lossy parts of an export: one warning per plan field."""

    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def lose(self, name: str, rule: str) -> None:
        self.warnings.append(f"{name}: {rule}")

    def note(self, text: str) -> None:
        self.notes.append(text)

    def result(self, text: str) -> ExportResult:
        return ExportResult(text, tuple(self.warnings), tuple(self.notes))


def dependency_pipeline(plan: TrainingPlan, led: Ledger, engine: str) -> None:
    """Warn when ``plan`` asks for the lockstep pipeline runtime (meshplan.pipeline.lockstep) and
    the engine runs its pipeline dependency-driven, each transfer waited for by the action that
    needs it."""
    if runs_lockstep(plan.schedule, plan.pp, plan.stack.pipeline_runtime):
        led.lose("pipeline_runtime", f"{engine} runs its pipeline dependency-driven, not slot by slot in lockstep; exported so")


def stage_buffers(plan: TrainingPlan, led: Ledger, engine: str, kind: str) -> None:
    """Note when ``plan``'s pipeline buffers (``pp_buffers``) are not the ``kind`` the engine's
    pipeline keeps (:func:`meshplan.cost.compose.pp_buffer_messages`)."""
    if plan.pp > 1 and plan.stack.pp_buffers != kind:
        led.lose("pp_buffers", f"{engine} keeps {kind} pipeline stage buffers; exported so")
    if plan.pp > 1 and plan.stack.pp_return_outputs:
        led.lose("pp_return_outputs", f"{engine} has no setting for it: whether the last stage keeps every micro-batch's "
                 "output to the step's end is its training loop's schedule.step(return_outputs=...) call (torch's "
                 "default keeps them); exported without")


# ---- plans ----------------------------------------------------------------------------------------


def fsdp_root_unit(plan: TrainingPlan, led: Ledger, engine: str) -> None:
    """Warn when ``plan`` leaves the embedding, final norm and LM head to FSDP2's root unit
    (``fsdp_head_in_root``: torchtitan's units until pytorch/torchtitan#1094), which no engine's
    current config can ask for."""
    if plan.stack.fsdp_head_in_root:
        led.lose("fsdp_head_in_root", f"{engine} gathers the embedding and the LM head as units of their own, not in "
                 "FSDP2's root unit (torchtitan's layout until pytorch/torchtitan#1094, 2025-07); exported so")


def fp8_library(plan: TrainingPlan, led: Ledger, engine: str, native: str) -> None:
    """Warn when ``plan``'s FP8 linears (``fp8_linears``, resolved) are not the library the
    ``engine`` runs (``native``). Engines whose configs have no FP8 warn on the precision."""
    if plan.precision.precision == "fp8" and plan.stack.fp8_library != native:
        led.lose("fp8_linears", f"{engine}'s FP8 linears are {native}'s, not {plan.stack.fp8_library}'s; exported so")
    if plan.precision.fp8_scaling != "tensorwise" and native != "torchao":
        led.lose("precision.fp8_scaling", f"{engine}'s FP8 linears scale per tensor, not {plan.precision.fp8_scaling}; exported so")


def tp_backward(plan: TrainingPlan, led: Ledger, engine: str, native: bool) -> None:
    """Warn when ``plan``'s TP backward (``tp_backward_overlap``: the column-parallel linears'
    collectives behind their own GEMMs, :mod:`meshplan.cost.tp_backward`) is not what the
    ``engine`` runs without TP overlap (``native``): no engine has a switch for it."""
    if plan.tp > 1 and not plan.stack.tp_comm_overlap and plan.stack.tp_backward_overlap != native:
        how = ("runs the column-parallel linears' backward collectives behind their GEMMs (no switch turns it off)" if native
               else "meets each TP collective where autograd does")
        led.lose("tp_backward_overlap", f"{engine} {how}; exported so")


def native_field(plan: TrainingPlan, led: Ledger, engine: str, field: str, native: Any, how: str) -> None:
    """Warn when ``plan``'s stack ``field``, where the plan uses it, is not ``native``, the value
    the ``engine`` runs (``how``: what the engine does)."""
    if field_applies(field, plan.stack, plan) and getattr(plan.stack, field) != native:
        led.lose(field, f"{engine} {how}; exported so")


def pipeline_messages(plan: TrainingPlan, led: Ledger, engine: str, native: bool) -> None:
    """Warn when ``plan``'s stage messages (``pp_scatter_gather``: 1/t of each sent, then
    all-gathered over TP) are not what the ``engine`` sends (``native``)."""
    native_field(plan, led, engine, "pp_scatter_gather", native,
                 "sends 1/t of each stage message and all-gathers it over TP" if native
                 else "sends each stage message whole from every TP rank")


#: what each kind of gradient accumulation does, as the warnings say it
ACCUMULATION_WORDS = {"fused": "accumulates the weight gradients in the GEMMs' epilogue",
                      "buffer": "adds each micro-batch's gradients into an fp32 buffer, a pass of its own",
                      "autograd": "accumulates the gradients in .grad by autograd"}


def grad_accumulation(plan: TrainingPlan, led: Ledger, engine: str, native: str) -> None:
    """Warn when ``plan``'s gradient accumulation (``grad_accumulation``) is not the ``engine``'s."""
    native_field(plan, led, engine, "grad_accumulation", native, ACCUMULATION_WORDS[native])


def attention_kernel(plan: TrainingPlan, led: Ledger, engine: str) -> None:
    """Warn when ``plan`` asks for cuDNN's fused attention (``attention_kernel cudnn``) from an
    engine whose attention is torch's SDPA or the flash-attn package: FlashAttention-2."""
    if plan.attention == "flash" and plan.stack.attention_kernel == "cudnn":
        led.lose("attention_kernel", f"{engine} runs FlashAttention-2 (torch's SDPA or flash-attn), not cuDNN's fused "
                 "attention; exported so")


def fp8_all_gather(plan: TrainingPlan, led: Ledger, engine: str) -> None:
    """Warn when ``plan`` all-gathers Float8Linear weights in FP8 (``fsdp_fp8_all_gather``:
    torchao's float8 with torch's FSDP2), which only torchtitan's config can ask for."""
    if plan.stack.fsdp_fp8_all_gather:
        led.lose("fsdp_fp8_all_gather", f"{engine} has no FSDP2 all-gather of torchao's Float8 weights; exported with "
                 "weights gathered in the compute dtype")


def effective_split(model: Optional[ModelSpec], plan: TrainingPlan) -> Optional[tuple[int, ...]]:
    """Layers per virtual stage that meshplan plans with (the plan's split or the default)."""
    if plan.layer_split is not None:
        return tuple(plan.layer_split)
    if model is None:
        return None
    return default_layer_split(model.n_layers, plan.pp * plan.vpp)


def canonical(plan: TrainingPlan, model: Optional[ModelSpec] = None) -> TrainingPlan:
    """The plan with settings that change nothing put back to meshplan's defaults, so that two
    plans that run the same compare equal. The stack's rules (:data:`meshplan.specs.stack.RULES`)
    have already set aside what a plan cannot use (TP overlap and its kind without TP, the lockstep
    runtime and the pipeline buffers and kept outputs where they change nothing, ...); on top of
    them: sequence parallelism without TP, compile_loss without compiled kernels (the loss then
    runs on the blocks' stack), the FP8 library as the stack resolves ``auto``, the attention
    kernel as a torch stack resolves ``auto``, the ZeRO-3 switches (FP8 all-gather among them)
    without sharding, overlap switches without data parallelism, an HSDP group as large as dp, a
    layer split equal to the default one, and the FLOP-counting convention (not a training
    setting)."""
    up: dict[str, Any] = {"attention_flops": "causal"}
    if plan.tp == 1:
        up.update(sequence_parallel=True)
    if plan.stack.kernels != "compiled":
        up.update(compile_loss=True)
    if plan.zero != 3 and plan.dp * plan.cp > 1:
        up.update(reshard_after_forward=True)
    if plan.zero == 0:
        up.update(overlap_param_gather=True)
    if plan.dp_shard is not None and (plan.dp_shard == plan.dp or plan.zero == 0):
        up.update(dp_shard=None)
    # the FP8 library as resolved (auto names one by the stack), none without FP8
    up.update(fp8_linears=plan.stack.fp8_library if plan.precision.precision == "fp8" else "auto")
    # the attention kernel: none without flash attention; auto is FlashAttention-2 off the fused stack
    if plan.attention != "flash" or (plan.stack.kernels != "fused" and plan.stack.attention_kernel == "flash2"):
        up.update(attention_kernel="auto")
    if plan.dp * plan.cp == 1:  # nothing to shard over or to reduce across
        up.update(overlap_grad_reduce=True, overlap_param_gather=True, zero=0, dp_shard=None,
                  reshard_after_forward=True, fsdp_accumulate_unsharded=False, fsdp_fp8_all_gather=False)
    if plan.layer_split is not None and model is not None:
        if tuple(plan.layer_split) == default_layer_split(model.n_layers, plan.pp * plan.vpp):
            up.update(layer_split=None)
    return plan.replace(**up)


def plan_fields(plan: TrainingPlan) -> dict[str, Any]:
    """A plan as fields (precision as a dict)."""
    out = plan.model_dump()
    out["precision"] = dict(out["precision"])
    return out


def to_plan(fields: dict[str, Any], where: str = "plan") -> TrainingPlan:
    """Build a plan from fields; a missing required field names the field."""
    f = dict(fields)
    for name in ("global_batch", "seq_len"):
        if f.get(name) is None:
            raise InputError(f"{where}.{name}", "the config does not give it")
    f["precision"] = PrecisionRecipe.build(where=f"{where}.precision", **dict(f.get("precision") or {}))
    return TrainingPlan.build(where=where, **f)


def same_model(a: ModelSpec, b: ModelSpec) -> bool:
    """Same shape (name, source and, for rotary models, the position table size aside)."""
    skip = {"name", "source"} | ({"max_position"} if a.position == "rope" == b.position else set())
    return all(getattr(a, k) == getattr(b, k) for k in ModelSpec.model_fields if k not in skip)


def catalog_match(model: ModelSpec) -> Optional[str]:
    """The catalog name of a model with this shape, if any."""
    from meshplan.catalog import load_model, model_names

    for name in model_names():
        if same_model(load_model(name), model):
            return name
    return None


# ---- text helpers --------------------------------------------------------------------------------


def arg_tokens(text: str) -> list[str]:
    """Shell words of an argument list: comments, line continuations and quoting handled."""
    try:
        return shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise InputError("plan", f"cannot read the argument list: {exc}") from None


def arg_pairs(tokens: Iterable[str]) -> list[tuple[str, Optional[str]]]:
    """``--name value`` / ``--name=value`` / ``--flag`` pairs, in order; other words are skipped
    (the launcher, the script name, shell variables)."""
    toks = list(tokens)
    out: list[tuple[str, Optional[str]]] = []
    i = 0
    while i < len(toks):
        tok = toks[i]
        if tok.startswith("--") and len(tok) > 2:
            if "=" in tok:
                name, value = tok.split("=", 1)
                out.append((name, value))
            elif i + 1 < len(toks) and not toks[i + 1].startswith("--"):
                out.append((tok, toks[i + 1]))
                i += 1
            else:
                out.append((tok, None))
        i += 1
    return out


def single_values(pairs: Iterable[tuple[str, Optional[str]]], fmt: str) -> dict[str, Optional[str]]:
    """Flags to values; the same flag twice with different values is a contradiction."""
    out: dict[str, Optional[str]] = {}
    for name, value in pairs:
        if name in out and out[name] != value:
            raise InputError(name.lstrip("-"), f"given twice with different values ({brief(out[name])}, {brief(value)}) in the {fmt} config")
        out[name] = value
    return out


def as_int(name: str, value: Any, lo: int = 1) -> int:
    """A whole number at least ``lo``; anything else names the engine's key."""
    if isinstance(value, bool):
        raise InputError(name, f"must be an integer (got {brief(value)})")
    try:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        n = int(value) if not isinstance(value, float) else None
    except (TypeError, ValueError):
        n = None
    if n is None:
        raise InputError(name, f"must be an integer (got {brief(value)})")
    if n < lo:
        raise InputError(name, f"must be at least {lo} (got {n})")
    return n


def as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise InputError(name, f"must be true or false (got {brief(value)})")


def choice(name: str, value: Any, table: dict[str, Any]) -> Any:
    """``table[value]`` (case-insensitive keys), or a one-line refusal listing the choices."""
    key = str(value).strip()
    for k, v in table.items():
        if k.lower() == key.lower():
            return v
    raise InputError(name, f"unsupported value {brief(value)} (one of {', '.join(table)})")


def divide(name: str, total: int, part: int, what: str) -> int:
    if part <= 0 or total % part:
        raise InputError(name, f"{total:,} is not a multiple of {what} ({part:,})")
    return total // part


def rank_order_text(order: Iterable[str]) -> str:
    return ",".join(order)


def check_rank_order(order: tuple[str, ...]) -> tuple[str, ...]:
    if sorted(order) != sorted(AXES):
        raise InputError("rank_order", f"must list {', '.join(AXES)} once each")
    return order


def warn_defaults(led: Ledger, plan: TrainingPlan, engine: str, checks: dict[str, tuple[Callable[[TrainingPlan], bool], str]]) -> None:
    """One warning per check that fails: ``checks[field] = (holds(plan), what the engine does)``."""
    for name, (holds, rule) in checks.items():
        if not holds(plan):
            led.lose(name, f"{engine} {rule}")
