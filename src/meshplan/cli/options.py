"""The plan options shared by ``meshplan estimate`` and ``meshplan explain``, and how they become
(model, cluster, plan, budget).

The options are declared once, in :data:`PLAN_OPTIONS`; :func:`plan_options` adds them to a
command. Every option defaults to ``None`` so that three layers can be told apart: meshplan's
defaults, a ``--preset``'s values, and what the user typed (which wins).

Defaults worth knowing (also in ``--help``):

* GPUs and data parallelism: ``dp = gpus / (tp·cp·pp)``; with ``--dp`` and no ``--gpus``,
  ``gpus = tp·cp·pp·dp``; with neither, 8 GPUs (one HGX node).
* Global batch, when neither ``--global-batch`` nor ``--global-batch-tokens`` is given: about
  4M tokens per step (4,194,304 = 1,024 sequences of 4,096, the batch of Llama 2 and of Llama 3's
  first stage), i.e. ``m = round(4,194,304 / (seq_len·micro_batch·dp))`` micro-batches per DP rank,
  at least 1 and at most 1,024, rounded up to a multiple of pp for the interleaved schedules;
  global batch = micro_batch·m·dp sequences.
* ``--vpp`` > 1 without ``--schedule`` selects the interleaved schedule; ``--schedule
  interleaved``, ``interleaved-zb`` or ``zbv`` without ``--vpp`` uses 2 virtual stages per rank.
"""

from __future__ import annotations

import functools
import inspect
import math
import typing
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional

import typer
from pydantic import ValidationError

from meshplan.catalog import load_model, load_stack, resolve_gpu, stack_names
from meshplan.catalog.gpu_file import with_power_cap
from meshplan.errors import InputError
from meshplan.interop.common import as_bool
from meshplan.pipeline.schedules import check_vpp
from meshplan.pipeline.stages import split_problem
from meshplan.estimate import Budget
from meshplan.presets import Preset, get_preset, preset_names
from meshplan.specs.base import input_error_from
from meshplan.specs.hardware import ClusterSpec, GPUSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import AXES, FP8_SCALINGS, PrecisionRecipe, TrainingPlan, ep_span_note
from meshplan.specs.stack import BEHAVIOUR_FIELDS, DEFAULT_STACK, Stack
from meshplan.specs.validate import check_plan
from meshplan.units import GBPS, parse_count

if TYPE_CHECKING:
    from meshplan.calc.run_length import FailureModel

DEFAULT_GPUS = 8
DEFAULT_BATCH_TOKENS = 4 * 2**20
MAX_DEFAULT_MICROBATCHES = 1024
MAX_GPUS = 10_000_000

P_MODEL = "Model and hardware"
P_LAYOUT = "Layout (parallelism)"
P_BATCH = "Batch"
P_MEMORY = "Memory and precision"
P_NET = "Network"
P_RUN = "Run budget"
P_STACK = "Software stack"

#: ``--interval``: the level of the step time's prediction interval (meshplan.accuracy.interval)
IntervalOpt = Annotated[float, typer.Option("--interval", help="Level of the step's prediction interval.")]


def _opt(decl: str, help: str, panel: str, **kw: Any) -> typer.models.OptionInfo:
    return typer.Option(decl, help=help, rich_help_panel=panel, show_default=False, **kw)


#: name -> (type, option); the names are PlanArgs' fields and the keys of preset values.
PLAN_OPTIONS: dict[str, tuple[Any, Any]] = {
    "preset": (Optional[str], _opt("--preset", f"Start from a published run's plan: {', '.join(preset_names())}, or any run id that `meshplan validate --set all` lists (e.g. torchtitan_405b_512gpu_3d_1f1b), estimated exactly as validate predicts it, beside its published step time and memory; other options override it.", P_MODEL)),
    "plan_file": (Optional[str], _opt("--plan", "Start from an engine config: a torchtitan TOML or --section.key list, Megatron-LM arguments, a DeepSpeed JSON or a nanotron YAML (see `meshplan import`); other options override it.", P_MODEL)),
    "model": (Optional[str], _opt("--model", "Catalog model name (see `meshplan models`) or path to a Hugging Face config.json / meshplan model YAML. (default: llama3-8b)", P_MODEL)),
    "gpu": (Optional[str], _opt("--gpu", "Catalog GPU name (see `meshplan gpus`) or a GPU YAML file for a part outside the catalog (docs/hardware.md). (default: h100-sxm-80gb)", P_MODEL)),
    "gpu_power": (Optional[float], _opt("--gpu-power", "Board power cap, W: peaks scaled by the sustained clock (docs/hardware.md). (default: the TDP)", P_MODEL)),
    "stack": (Optional[str], _opt("--stack", f"The software that runs the plan: {', '.join(stack_names())} (see `meshplan stacks`). (default: {DEFAULT_STACK}, or the preset's or --plan file's)", P_STACK)),
    "set_fields": (Optional[list[str]], _opt("--set", "Override one field of the stack, FIELD=VALUE, e.g. --set kernels=eager --set pp_buffers=per-micro-batch (repeatable; fields: `meshplan stacks NAME`).", P_STACK)),
    "gpus": (Optional[int], _opt("--gpus", "Number of GPUs. (default: tp·cp·pp·dp when --dp is given, else 8)", P_LAYOUT)),
    "tp": (Optional[int], _opt("--tp", "Tensor-parallel size. (default: 1)", P_LAYOUT)),
    "pp": (Optional[int], _opt("--pp", "Pipeline-parallel size (pipeline ranks). (default: 1)", P_LAYOUT)),
    "cp": (Optional[int], _opt("--cp", "Context-parallel size. (default: 1)", P_LAYOUT)),
    "ep": (Optional[int], _opt("--ep", "Expert-parallel size (dense models: 1). (default: 1)", P_LAYOUT)),
    "dp": (Optional[int], _opt("--dp", "Data-parallel size. (default: gpus / (tp·cp·pp))", P_LAYOUT)),
    "vpp": (Optional[int], _opt("--vpp", "Virtual stages per pipeline rank; > 1 selects the interleaved schedule. (default: 1)", P_LAYOUT)),
    "schedule": (Optional[Literal["1f1b", "interleaved", "gpipe", "zbh1", "interleaved-zb", "zbv", "dualpipe", "dualpipev"]], _opt("--schedule", "Pipeline schedule (zbh1, interleaved-zb, zbv: zero bubble; dualpipe(v): not modelled). (default: 1f1b, or interleaved when --vpp > 1)", P_LAYOUT)),
    "layer_split": (Optional[str], _opt("--layer-split", "Layers per virtual stage in pipeline order, e.g. '7,8*14,7' (N*K repeats N K times); a preset's or --plan file's split is dropped when --pp, --vpp or --schedule is given. (default: even, remainder to the inner stages)", P_LAYOUT)),
    "rank_order": (Optional[str], _opt("--rank-order", "Mesh axes innermost first, e.g. tp,cp,pp,dp (Llama 3). (default: tp,cp,dp,pp)", P_LAYOUT)),
    "micro_batch": (Optional[int], _opt("--micro-batch", "Sequences per forward on one DP rank. (default: 1)", P_BATCH)),
    "global_batch": (Optional[int], _opt("--global-batch", "Sequences per optimizer step. (default: about 4M tokens: micro_batch·dp·m with m = round(4,194,304 / (seq_len·micro_batch·dp)) in 1..1024, a multiple of pp when interleaved)", P_BATCH)),
    "global_batch_tokens": (Optional[str], _opt("--global-batch-tokens", "Tokens per optimizer step, a multiple of --seq-len, instead of --global-batch. k, M, G are binary here, as batch sizes are quoted: 16M = 16,777,216 = 2,048 x 8,192.", P_BATCH)),
    "seq_len": (Optional[int], _opt("--seq-len", "Sequence length in tokens. (default: 4096)", P_BATCH)),
    "recompute": (Optional[Literal["none", "selective", "op", "full"]], _opt("--recompute", "Activation recomputation: none; selective (Megatron: the attention core); op (torchtitan's op-level selective AC: every second matmul and the element-wise ops); full. (default: none)", P_MEMORY)),
    "recompute_layers": (Optional[int], _opt("--recompute-layers", "With --recompute full: recompute only the first N layers of each virtual stage (Megatron's --recompute-method block; torchtitan's every-k-th layer is N = layers per stage / k). (default: every layer)", P_MEMORY)),
    "sequence_parallel": (Optional[bool], _opt("--sequence-parallel/--no-sequence-parallel", "Megatron sequence parallelism with TP. (default: on)", P_MEMORY)),
    "zero": (Optional[Literal["0", "1", "2", "3"]], _opt("--zero", "ZeRO stage: 1 shards optimizer state, 2 also gradients, 3 also weights (FSDP). (default: 1)", P_MEMORY)),
    "dp_shard": (Optional[int], _opt("--dp-shard", "HSDP: shard model state within groups of this many DP ranks. (default: dp)", P_MEMORY)),
    "precision": (Optional[Literal["fp32", "bf16", "fp16", "fp8"]], _opt("--precision", "Compute precision. (default: bf16)", P_MEMORY)),
    "grad_dtype": (Optional[Literal["fp32", "bf16", "fp16"]], _opt("--grad-dtype", "Gradient dtype. (default: fp32)", P_MEMORY)),
    "master_weights": (Optional[bool], _opt("--master-weights/--no-master-weights", "fp32 master copy of low-precision weights. (default: on)", P_MEMORY)),
    "grad_fp32_copy": (Optional[bool], _opt("--grad-fp32-copy/--no-grad-fp32-copy", "Optimizer keeps an fp32 copy of low-precision gradients. (default: off)", P_MEMORY)),
    "fp8_scaling": (Optional[Literal[FP8_SCALINGS]], _opt("--fp8-scaling", "FP8 scaling recipe with --precision fp8: one scale per tensor; rowwise, one per row of every GEMM operand (torchao's recipe, torchtitan 0.3's default); rowwise_with_gw_hp, the same with the weight-gradient GEMM in 16 bits. (default: tensorwise)", P_MEMORY)),
    "attention": (Optional[Literal["flash", "materialized"]], _opt("--attention", "Attention kernel: flash (no s² scores stored) or materialized. (default: flash)", P_MEMORY)),
    "attention_flops": (Optional[Literal["causal", "full"]], _opt("--attention-flops", "Count causal (half) or full s² attention FLOPs. (default: causal)", P_MEMORY)),
    "tp_comm_overlap": (Optional[bool], _opt("--tp-comm-overlap/--no-tp-comm-overlap", "Overlap TP communication with the GEMMs, as the stack does it (--set tp_comm_overlap). (default: the stack's)", P_STACK)),
    "gpus_per_node": (Optional[int], _opt("--gpus-per-node", "GPUs per scale-up (NVLink) domain. (default: the GPU's, e.g. 8)", P_NET)),
    "nic_gbps": (Optional[float], _opt("--nic-gbps", "Scale-out bandwidth per GPU per direction, GB/s. (default: the GPU's, e.g. 50)", P_NET)),
    "pod_size": (Optional[int], _opt("--pod-size", "GPUs per pod with full bisection. (default: the whole cluster)", P_NET)),
    "oversubscription": (Optional[float], _opt("--oversubscription", "Oversubscription above pods (7 means 1:7). (default: 1)", P_NET)),
    "tokens": (Optional[str], _opt("--tokens", "Tokens to train on, e.g. 15.6T: gives days, GPU-hours, energy.", P_RUN)),
    "price": (Optional[float], _opt("--price", "Price in $ per GPU-hour (with --tokens).", P_RUN)),
    "pue": (Optional[float], _opt("--pue", "Data-centre PUE applied to GPU board power. (default: 1.0)", P_RUN)),
}


@dataclass
class PlanArgs:
    preset: Optional[str] = None
    plan_file: Optional[str] = None
    model: Optional[str] = None
    gpu: Optional[str] = None
    gpu_power: Optional[float] = None
    stack: Optional[str] = None
    set_fields: Optional[list[str]] = None
    gpus: Optional[int] = None
    tp: Optional[int] = None
    pp: Optional[int] = None
    cp: Optional[int] = None
    ep: Optional[int] = None
    dp: Optional[int] = None
    vpp: Optional[int] = None
    schedule: Optional[str] = None
    layer_split: Optional[str] = None
    rank_order: Optional[str] = None
    micro_batch: Optional[int] = None
    global_batch: Optional[int] = None
    global_batch_tokens: Optional[str] = None
    seq_len: Optional[int] = None
    recompute: Optional[str] = None
    recompute_layers: Optional[int] = None
    sequence_parallel: Optional[bool] = None
    zero: Optional[str] = None
    dp_shard: Optional[int] = None
    precision: Optional[str] = None
    grad_dtype: Optional[str] = None
    master_weights: Optional[bool] = None
    grad_fp32_copy: Optional[bool] = None
    fp8_scaling: Optional[str] = None
    attention: Optional[str] = None
    attention_flops: Optional[str] = None
    tp_comm_overlap: Optional[bool] = None
    gpus_per_node: Optional[int] = None
    nic_gbps: Optional[float] = None
    pod_size: Optional[int] = None
    oversubscription: Optional[float] = None
    tokens: Optional[str] = None
    price: Optional[float] = None
    pue: Optional[float] = None


assert [f.name for f in fields(PlanArgs)] == list(PLAN_OPTIONS), "PlanArgs and PLAN_OPTIONS disagree"


def plan_options(fn):
    """Give command ``fn(plan: PlanArgs, **own)`` every plan option, declared once above."""
    hints = typing.get_type_hints(fn, include_extras=True)
    own = [
        p.replace(annotation=hints.get(p.name, p.annotation))
        for p in inspect.signature(fn).parameters.values()
        if p.name != "plan"
    ]
    shared = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[tp, opt])
        for name, (tp, opt) in PLAN_OPTIONS.items()
    ]
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]

    @functools.wraps(fn)
    def wrapper(**kw: Any):
        args = PlanArgs(**{name: kw.pop(name) for name in PLAN_OPTIONS})
        return fn(plan=args, **kw)

    params = shared + own
    wrapper.__signature__ = inspect.Signature(params)
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


# ---- from options to specs ----------------------------------------------------------------------


@dataclass
class Setup:
    model: ModelSpec
    cluster: ClusterSpec
    plan: TrainingPlan
    budget: Budget
    preset: Optional[Preset]
    stack: Stack  # as requested (profile and overrides); plan.stack is it as it applies to the plan


def _positive_int(field: str, value: Any, cap: int | None = None) -> int:
    if value is None:
        raise InputError(field, "is required")
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(field, f"must be an integer (got {value!r})")
    if value < 1:
        raise InputError(field, f"must be a positive integer (got {value})")
    if cap is not None and value > cap:
        raise InputError(field, f"must be at most {cap:,} (got {value:,})")
    return value


def _finite(field: str, value: Any, lo: float, hi: float, lo_open: bool = False) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InputError(field, f"must be a number (got {value!r})") from None
    if not math.isfinite(x):
        raise InputError(field, f"must be a finite number (got {value})")
    if x < lo or (lo_open and x == lo):
        raise InputError(field, f"must be {'greater than' if lo_open else 'at least'} {lo:g} (got {value})")
    if x > hi:
        raise InputError(field, f"must be at most {hi:g} (got {value})")
    return x


def _count(field: str, text: Any) -> float:
    """A count such as 16M (:func:`~meshplan.units.parse_count`), finite; else ``field``'s error."""
    try:
        n = parse_count(text)
    except (TypeError, ValueError, OverflowError):
        n = math.nan
    if not math.isfinite(n):
        raise InputError(field, f"must be a finite number such as 16M, 15.6T or 2e12 (got {text!r})")
    return n


_BINARY = {"k": 2**10, "m": 2**20, "g": 2**30}


def parse_batch_tokens(text: Any) -> float:
    """Tokens per step. Batch sizes are quoted in binary multiples ("16M tokens" = 2,048 x 8,192 =
    16,777,216), so k, M and G (or Ki, Mi, Gi) are 2^10, 2^20, 2^30 here; other numbers as
    :func:`~meshplan.units.parse_count`."""
    s = str(text).strip().replace("_", "").replace(",", "")
    low = s.lower()
    if low.endswith("i"):
        low = low[:-1]
    if low and low[-1] in _BINARY:
        try:
            n = float(low[:-1]) * _BINARY[low[-1]]
        except ValueError:
            n = math.nan
        if not math.isfinite(n):
            raise InputError("global_batch_tokens", f"must be a finite number of tokens such as 16M or 4194304 (got {text!r})")
        return n
    return _count("global_batch_tokens", s)


def parse_layer_split(text: str) -> tuple[int, ...]:
    """'7,8*14,7' -> (7, 8, ..., 8, 7): comma-separated layer counts, ``N*K`` = N repeated K times (0 only
    on the first and last stages: :func:`meshplan.pipeline.stages.split_problem`)."""
    out: list[int] = []
    rule = "must be comma-separated layer counts such as 7,8*14,7"
    for item in str(text).replace(" ", "").split(","):
        try:
            if "*" in item:
                n, k = item.split("*")
                n_i, k_i = int(n), int(k)
                if not 1 <= k_i <= 100_000:
                    raise ValueError
                out.extend([n_i] * k_i)
            else:
                out.append(int(item))
        except ValueError:
            raise InputError("layer_split", f"{rule} (got {text!r})") from None
        if len(out) > 100_000:
            raise InputError("layer_split", "has more than 100,000 entries")
    problem = split_problem(tuple(out))
    if problem:
        raise InputError("layer_split", f"{problem} (got {text!r})")
    return tuple(out)


def parse_rank_order(text: str) -> tuple[str, ...]:
    order = tuple(x.strip().lower() for x in str(text).split(",") if x.strip())
    if sorted(order) != sorted(AXES):
        raise InputError("rank_order", f"must list {', '.join(AXES)} once each, innermost first (got {text!r})")
    return order


def _spec(cls, root_field: str, **kw: Any):
    """Build a spec; a rule across fields (pydantic reports no field) is named ``root_field``."""
    try:
        return cls(**kw)
    except ValidationError as exc:
        err = input_error_from(exc)
        if err.field == "input":
            err = InputError(root_field, err.rule)
        raise err from None


def _probe_axes(model: ModelSpec, gpu, v: dict[str, Any], vpp: int, schedule: str) -> None:
    """Check tp, cp and pp against the model alone (one DP rank, nodes of one GPU), so that
    ``--tp 3`` on a 32-head model names the rule on heads, not only that 8 is not a multiple of 3."""
    tp, cp, pp, b = v["tp"], v["cp"], v["pp"], v["micro_batch"]
    try:
        plan = TrainingPlan(tp=tp, cp=cp, pp=pp, dp=1, vpp=vpp, schedule=schedule, micro_batch=b, global_batch=b * pp,
                            seq_len=v["seq_len"], sequence_parallel=v.get("sequence_parallel") is not False)
        cluster = ClusterSpec.of(gpu, tp * cp * pp, gpus_per_node=1)
    except (InputError, ValidationError):
        return
    check_plan(model, cluster, plan)


DEFAULTS: dict[str, Any] = {
    "model": "llama3-8b",
    "gpu": "h100-sxm-80gb",
    "tp": 1,
    "cp": 1,
    "pp": 1,
    "ep": 1,
    "micro_batch": 1,
    "seq_len": 4096,
}


def _layers(args: PlanArgs) -> tuple[dict[str, Any], Optional[Preset], dict[str, Any], Any, dict[str, Any]]:
    """(given, preset, base, imported, values): what the user gave, the preset, the preset's and
    ``--plan`` file's values, the imported file, and all of them over :data:`DEFAULTS`."""
    given = {k: v for k, v in asdict(args).items() if v is not None and k not in ("preset", "plan_file")}
    preset = get_preset(args.preset) if args.preset is not None else None
    base = dict(preset.values) if preset else {}
    imported = None
    if args.plan_file is not None:  # an engine config seeds the plan like a preset (after it)
        from meshplan.interop import load_plan_file

        imported = load_plan_file(args.plan_file)
        gap = imported.model_gap()
        if gap is not None and "model" not in given and "model" not in base:
            raise InputError("model", f"--plan {args.plan_file}: {gap}; give --model (a catalog name, a Hugging Face config.json "
                                      "or a model YAML)")
        base.update(imported.options)
    return given, preset, base, imported, {**DEFAULTS, **base, **given}


def _gpu_of(v: dict[str, Any]) -> GPUSpec:
    return v["gpu"] if isinstance(v["gpu"], GPUSpec) else resolve_gpu(v["gpu"])


def plan_gpu(args: PlanArgs) -> GPUSpec:
    """The GPU ``args`` name (the option, else the ``--plan`` file's, the preset's or the default),
    before any power cap (``--gpu-power``)."""
    return _gpu_of(_layers(args)[-1])


def resolve(args: PlanArgs) -> Setup:
    """Defaults, then the preset, then what the user gave; checked field by field."""
    given, preset, base, imported, v = _layers(args)

    for name in ("tp", "pp", "cp", "ep", "micro_batch", "seq_len"):
        _positive_int(name, v[name], cap=100_000_000)
    for name in ("gpus", "dp", "vpp", "global_batch", "dp_shard", "gpus_per_node", "pod_size"):
        if v.get(name) is not None:
            _positive_int(name, v[name], cap=MAX_GPUS if name in ("gpus", "dp", "pod_size") else 1_000_000_000)
    if "layer_split" not in given and any(k in given for k in ("pp", "vpp", "schedule")):
        v.pop("layer_split", None)  # a preset's split fits its own stages only
    model = v["model"] if isinstance(v["model"], ModelSpec) else load_model(v["model"])
    gpu = _gpu_of(v)
    if v.get("gpu_power") is not None:
        gpu = with_power_cap(gpu, v["gpu_power"], "gpu_power")

    # ---- schedule and virtual stages --------------------------------------------------------
    vpp = v.get("vpp")
    schedule = given.get("schedule")
    if schedule is None:
        if vpp is not None and vpp > 1 and ("vpp" in given or "schedule" not in base):
            schedule = "interleaved"
        else:
            schedule = base.get("schedule", "1f1b")
            if schedule == "interleaved" and "vpp" in given:
                schedule = "1f1b"
    if vpp is None or ("vpp" not in given and "schedule" in given):
        vpp = 2 if schedule in ("interleaved", "interleaved-zb", "zbv") else 1
    check_vpp(schedule, vpp)

    # ---- GPUs and data parallelism ----------------------------------------------------------
    tp, cp, pp = v["tp"], v["cp"], v["pp"]
    inner = tp * cp * pp
    if "gpus" in given or "dp" not in given:
        gpus = v.get("gpus") if ("gpus" in given or preset or "gpus" in base) else None
        defaulted = gpus is None
        gpus = DEFAULT_GPUS if gpus is None else gpus
        if "dp" in given:
            dp = given["dp"]
        else:
            if gpus % inner:
                _probe_axes(model, gpu, v, vpp, schedule)
                hint = " (the default; give --gpus or --dp)" if defaulted else ""
                raise InputError("gpus", f"{gpus:,} GPUs{hint} is not a multiple of tp x cp x pp = {tp} x {cp} x {pp} = {inner:,}")
            dp = gpus // inner
    else:
        dp = given["dp"]
        gpus = inner * dp
        if gpus > MAX_GPUS:
            raise InputError("dp", f"tp x cp x pp x dp = {gpus:,} GPUs is more than {MAX_GPUS:,}")
    _positive_int("dp", dp, cap=MAX_GPUS)
    if inner * dp != gpus:
        _probe_axes(model, gpu, v, vpp, schedule)
        raise InputError("dp", f"tp x cp x pp x dp = {tp} x {cp} x {pp} x {dp} = {inner * dp:,} must equal --gpus ({gpus:,})")

    # ---- batch ------------------------------------------------------------------------------
    b, s = v["micro_batch"], v["seq_len"]
    if "global_batch" in given and "global_batch_tokens" in given:
        raise InputError("global_batch_tokens", "give --global-batch or --global-batch-tokens, not both")
    if "global_batch" in given:
        v.pop("global_batch_tokens", None)
    elif "global_batch_tokens" in given:
        v.pop("global_batch", None)
    if v.get("global_batch_tokens") is not None:
        n = parse_batch_tokens(v["global_batch_tokens"])
        if not math.isfinite(n) or n < 1 or n != int(n) or n > 1e15:
            raise InputError("global_batch_tokens", f"must be a positive whole number of tokens (got {v['global_batch_tokens']})")
        if int(n) % s:
            raise InputError("global_batch_tokens", f"{int(n):,} tokens is not a multiple of seq_len ({s:,})")
        global_batch = int(n) // s
    elif v.get("global_batch") is not None:
        global_batch = v["global_batch"]
    elif v.get("micro_batches") is not None:  # a config's batch per DP rank (torchtitan's local batch)
        global_batch = b * dp * v["micro_batches"]
    else:
        m = round(DEFAULT_BATCH_TOKENS / (s * b * dp))
        m = min(max(m, 1), MAX_DEFAULT_MICROBATCHES)
        if schedule in ("interleaved", "interleaved-zb"):  # equal rounds of micro-batches
            m = -(-m // pp) * pp
        global_batch = b * dp * m
    _positive_int("global_batch", global_batch, cap=1_000_000_000)
    if global_batch % (b * dp):
        raise InputError("global_batch", f"{global_batch:,} sequences must be a multiple of micro_batch x dp = {b} x {dp} = {b * dp:,}")

    # ---- the rest of the plan ---------------------------------------------------------------
    if v.get("dp_shard") is not None and dp % v["dp_shard"]:
        raise InputError("dp_shard", f"dp_shard ({v['dp_shard']}) must divide dp ({dp})")
    if dp % v["ep"]:
        raise InputError("ep", f"ep ({v['ep']}) must divide dp ({dp}){ep_span_note(v['ep'], tp * cp * dp)}")
    recipe = {k: v[k] for k in ("precision", "grad_dtype", "master_weights", "grad_fp32_copy", "fp8_scaling")
              if v.get(k) is not None}
    plan_fields: dict[str, Any] = dict(
        tp=tp, cp=cp, pp=pp, dp=dp, ep=v["ep"], vpp=vpp, schedule=schedule, micro_batch=b,
        global_batch=global_batch, seq_len=s, precision=_spec(PrecisionRecipe, "precision", **recipe),
    )
    for k in ("recompute", "recompute_layers", "sequence_parallel", "dp_shard", "attention", "attention_flops"):
        if v.get(k) is not None:
            plan_fields[k] = v[k]
    if given.get("recompute") not in (None, "full") and given.get("recompute_layers") is None:
        plan_fields.pop("recompute_layers", None)  # another recompute mode asked for: the base's layer count goes
    if plan_fields.get("recompute_layers") is not None and plan_fields.get("recompute", "none") != "full":
        raise InputError("recompute_layers", f"recompute_layers ({plan_fields['recompute_layers']}) needs --recompute full "
                                             f"(got {plan_fields.get('recompute', 'none')})")
    stack = stack_of_options(given, base)
    plan_fields["stack"] = stack
    if v.get("zero") is not None:
        plan_fields["zero"] = int(v["zero"])
    if v.get("layer_split") is not None:
        plan_fields["layer_split"] = parse_layer_split(v["layer_split"])
    if v.get("rank_order") is not None:
        plan_fields["rank_order"] = parse_rank_order(v["rank_order"])
    if preset is not None and preset.extra:
        from meshplan.interop import apply_extra_fields

        plan_fields = apply_extra_fields(plan_fields, dict(preset.extra))
    if imported is not None:
        plan_fields = imported.apply_extra(plan_fields)
    plan = _spec(TrainingPlan, "plan", **plan_fields)

    # ---- cluster ----------------------------------------------------------------------------
    k = v.get("gpus_per_node") or gpu.scale_up_size
    if gpus > k and gpus % k:
        raise InputError("gpus", f"{gpus:,} GPUs is not a multiple of the {k} GPUs per node (scale-up domain)")
    if v.get("pod_size") is not None and v["pod_size"] % k:
        raise InputError("pod_size", f"pod_size ({v['pod_size']:,}) must be a multiple of the {k} GPUs per node")
    nic = None
    if v.get("nic_gbps") is not None:
        nic = _finite("nic_gbps", v["nic_gbps"], 1e-3, 1e6) * GBPS
    over = 1.0 if v.get("oversubscription") is None else _finite("oversubscription", v["oversubscription"], 1.0, 1000.0)
    try:
        cluster = ClusterSpec.of(
            gpu, gpus, gpus_per_node=v.get("gpus_per_node"), nic_bandwidth=nic,
            pod_size=v.get("pod_size"), oversubscription=over,
        )
    except InputError as err:
        raise (InputError("cluster", err.rule) if err.field == "input" else err) from None

    # ---- budget -----------------------------------------------------------------------------
    tokens = None
    if v.get("tokens") is not None:
        tokens = _finite("tokens", _count("tokens", v["tokens"]), 0.0, 1e18, lo_open=True)
    price = None if v.get("price") is None else _finite("price", v["price"], 0.0, 1e6)
    pue = 1.0 if v.get("pue") is None else _finite("pue", v["pue"], 1.0, 10.0)
    budget = Budget(tokens=tokens, price_per_gpu_hour=price, pue=pue)
    return Setup(model, cluster, plan, budget, preset, stack)


def parse_set(items: Optional[list[str]]) -> dict[str, Any]:
    """``--set FIELD=VALUE`` items as stack fields: FIELD one of :data:`BEHAVIOUR_FIELDS`, VALUE
    true/false (on/off, yes/no, 1/0) for a switch, the word itself otherwise."""
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = str(item).partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise InputError("set", f"must be FIELD=VALUE, e.g. kernels=eager (got {item!r})")
        if key not in BEHAVIOUR_FIELDS:
            raise InputError("set", f"unknown stack field '{key}' (fields: {', '.join(BEHAVIOUR_FIELDS)})")
        word = value.strip()
        out[key] = as_bool(f"set.{key}", word) if Stack.model_fields[key].annotation is bool else word
    return out


def stack_of_options(given: dict[str, Any], base: dict[str, Any]) -> Stack:
    """The stack the user asked for: ``--stack`` (or else the preset's or plan file's profile
    with the fields it sets, or else :data:`DEFAULT_STACK`), then the kept flags and ``--set``."""
    if given.get("stack") is not None:
        profile, fields = given["stack"], {}
    else:
        profile = base.get("stack") or DEFAULT_STACK
        fields = {k: base[k] for k in BEHAVIOUR_FIELDS if base.get(k) is not None}
    stack = profile if isinstance(profile, Stack) else load_stack(profile)
    fields.update({k: given[k] for k in BEHAVIOUR_FIELDS if given.get(k) is not None})
    fields.update(parse_set(given.get("set_fields")))
    if not fields:
        return stack
    try:
        return Stack(**{**stack.model_dump(), **fields})
    except ValidationError as exc:
        err = input_error_from(exc, "stack")
        raise (InputError("set", err.rule) if err.field == "stack" else err) from None


def failure_model(rate: Optional[float] = None, mtbf: Optional[str] = None, write_bw: Optional[float] = None,
                  fs_bw: Optional[float] = None, restart: Optional[str] = None, **kw: Any) -> "FailureModel":
    """The run's failure inputs from options (GB/s, durations), the stated defaults of
    :class:`~meshplan.calc.run_length.FailureModel` for those not given; ``fs_bw`` 0: no cap."""
    from meshplan.calc.inputs import parse_duration
    from meshplan.calc.run_length import FailureModel

    if rate is not None and mtbf is not None:
        raise InputError("mtbf", "give --mtbf or --failure-rate, not both")
    given: dict[str, Any] = dict(kw)
    if rate is not None:
        given["rate"] = _finite("failure_rate", rate, 0.0, 1.0, lo_open=True)
    if mtbf is not None:
        given["mtbf"] = parse_duration("mtbf", mtbf)
    if write_bw is not None:
        given["write_bw"] = _finite("ckpt_write_bw", write_bw, 0.0, 1e6, lo_open=True) * GBPS
    if fs_bw is not None:
        given["fs_bw"] = _finite("ckpt_fs_bw", fs_bw, 0.0, 1e9) * GBPS or None
    if restart is not None:
        given["restart"] = parse_duration("restart", restart)
    return FailureModel(**given)
