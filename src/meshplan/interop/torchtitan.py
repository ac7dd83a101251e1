"""torchtitan: ``--section.option`` command-line overrides and the equivalent sectioned TOML.

Vocabulary: torchtitan's ``JobConfig`` (``torchtitan/config/job_config.py``, releases 0.1 – 0.2.2),
the last one read from TOML (``--job.config_file``); torchtitan 0.3 builds configs in Python but
keeps the ``--parallelism.*`` and ``--training.*`` overrides. Mapping (warnings for the rest):

* tp, cp, pp, ep → ``parallelism.tensor_parallel_degree``, ``context_parallel_degree``,
  ``pipeline_parallel_degree``, ``expert_parallel_degree``.
* dp and zero: ZeRO-3 is FSDP2 over ``data_parallel_shard_degree`` = dp_shard (or dp) with
  ``data_parallel_replicate_degree`` = dp / shard (HSDP when > 1); ZeRO-0 is DDP
  (``data_parallel_replicate_degree`` = dp, shard 1). ZeRO-1/2 do not exist: exported as FSDP.
* reshard_after_forward → ``parallelism.fsdp_reshard_after_forward`` ``always`` / ``never``;
  fsdp_accumulate_unsharded is what torch's pipeline schedules do with FSDP (pp > 1), not a switch.
* schedule → ``parallelism.pipeline_parallel_schedule``: 1F1B, GPipe, Interleaved1F1B,
  InterleavedZeroBubble, ZBVZeroBubble (zbh1 has no torch schedule: exported as 1F1B). vpp: single
  stage schedules run 1 stage per rank, multi-stage ones 2 by default, other counts through
  ``pipeline_parallel_layers_per_stage``; the split is torchtitan's (embedding and output count as
  ``pipeline_parallel_first/last_stage_less_layers`` layers), chosen to equal meshplan's.
* micro_batch → ``parallelism.pipeline_parallel_microbatch_size`` (pp > 1; the local batch is then
  global / dp) or ``training.local_batch_size`` (pp = 1); global_batch → ``training.global_batch_size``;
  seq_len → ``training.seq_len``.
* recompute and recompute_layers → ``[activation_checkpoint]`` (:mod:`meshplan.interop.torchtitan_ac`).
* precision: bf16 → ``training.mixed_precision_param = "bfloat16"`` with fp32 reduce
  (``mixed_precision_reduce``), fp32 → ``"float32"``, fp8 → bf16 plus ``model.converters =
  ["quantize.linear.float8"]``; fp16 cannot be expressed. fsdp_fp8_all_gather →
  ``quantize.linear.float8.enable_fsdp_float8_all_gather`` with
  ``precompute_float8_dynamic_scale_for_fsdp`` (read from that section or, before JobConfig v0.2,
  from ``[float8]``; it applies where FSDP runs, and without the precomputed scales the per-weight
  amax all-reduces are noted, not modelled). fp8_scaling → ``quantize.linear.float8.recipe_name``
  (``rowwise``, ``rowwise_with_gw_hp``; tensorwise leaves it out, which torchtitan needs for the FP8
  all-gather and which reads as tensorwise). Its FP8 linears are torchao's (``fp8_linears``
  transformer-engine warns).
* tp_comm_overlap → ``parallelism.enable_async_tensor_parallel``, which is torch's micro-pipelined TP
  (``tp_overlap_kind = "micro-pipeline"``; Megatron's userbuffers kind has no torchtitan
  equivalent and is exported as AsyncTP); sequence parallelism is always on
  with TP (turning it off cannot be expressed before torchtitan 0.3).
* kernels → ``[compile]`` (JobConfig v0.2; 0.1 had one switch, ``training.compile``, read too):
  compiled → ``compile.enable`` with ``compile.components`` ``["model", "loss"]`` when compile_loss
  is on, ``["model"]`` when the loss runs eager beside the compiled blocks (torchtitan's
  ``build_cross_entropy_loss`` compiles the loss when ``"loss"`` is among the components; under
  0.1's ``training.compile`` it compiles it whenever the blocks are, as it has since
  pytorch/torchtitan#1033, 2025-04); eager → compile off (nothing written: off is the default); fused
  (Megatron-Core/Transformer Engine kernels, fused vocab-parallel cross-entropy) has no
  torchtitan equivalent and is exported as compiled blocks and loss, the nearest stack. Import:
  "model" compiled → compiled (compile_loss from the components), else eager, with a note.
  torchtitan's async TP needs the blocks compiled (``maybe_enable_async_tp`` refuses eager ones):
  tp_comm_overlap with eager kernels warns.
* pipeline_runtime: torchtitan 0.1 on runs torch's multi-stage schedules on torch's
  ``_PipelineScheduleRuntime``, dependency-driven (read so, with a note); a lockstep plan (torch's
  ``PipelineScheduleMulti`` of 2024, meshplan.pipeline.lockstep) is exported with a warning.
* Model: ``model.name`` and ``model.flavor`` of torchtitan's model registries (0.2.2 and 0.3.0):
  llama3 8B / 70B / 405B (Llama 3.1), deepseek_v3 671B and qwen3 30B-A3B, each the catalog's model
  to the parameter (671,026,404,352 and 30,532,122,624 counted on torchtitan's own modules); other
  shapes cannot be named.
"""

from __future__ import annotations

import math
import tomllib
from typing import Any, Optional

from meshplan.bounded_parse import brief, load_toml
from meshplan.errors import InputError
from meshplan.interop.common import (
    DEFAULT_RANK_ORDER, Ledger, ParseResult, arg_pairs, arg_tokens, as_bool, as_int, catalog_match,
    attention_kernel, choice, dependency_pipeline, fp8_library, fsdp_root_unit, effective_split, grad_accumulation,
    pipeline_messages, stage_buffers, tp_backward,
)
from meshplan.interop.torchtitan_ac import activation_checkpoint_section, read_activation_checkpoint
from meshplan.pipeline.stages import default_layer_split
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import FP8_SCALINGS, TrainingPlan

SOURCE = "pytorch/torchtitan torchtitan/config/job_config.py, JobConfig of v0.2"
#: catalog model → torchtitan's (``model.name``, ``model.flavor``, 0.3 ``config_registry`` function)
TT_MODELS = {"llama3-8b": ("llama3", "8B", "llama3_8b"), "llama3-70b": ("llama3", "70B", "llama3_70b"),
             "llama3-405b": ("llama3", "405B", "llama3_405b"), "deepseek-v3-671b": ("deepseek_v3", "671B", "deepseek_v3_671b"),
             "qwen3-30b-a3b": ("qwen3", "30B-A3B", "qwen3_30b_a3b")}
#: torchtitan's (``model.name``, ``model.flavor``) → catalog model (``llama3_1``: JobConfig v0.1's name)
TT_NAMES = {(name, flavor): model for model, (name, flavor, _) in TT_MODELS.items()} | {
    ("llama3_1", flavor): model for model, (name, flavor, _) in TT_MODELS.items() if name == "llama3"}
SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B",
             "interleaved-zb": "InterleavedZeroBubble", "zbv": "ZBVZeroBubble"}
SINGLE_STAGE = ("1F1B", "GPipe")
FLOAT8 = ("quantize.linear.float8", "float8")
FP8_GATHER = ("enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp")
COMPONENTS = ("model", "loss")  # JobConfig v0.2 ``Compile.components``: what torch.compile compiles


def tt_split(n_stages: int, n_layers: int, first_less: int, last_less: int) -> Optional[tuple[int, ...]]:
    """torchtitan's ``generate_llm_fqn_per_model_part``: the embedding counts as ``first_less``
    layers and the output as ``last_less``; the remainder goes to the first stages. None where
    torchtitan refuses (fewer than one effective layer per stage, or an end weight above it); an
    end stage may be left with no layer (126 layers, 128 stages, weights 1 and 1: 0, 1 x 126, 0)."""
    if n_stages == 1:
        return (n_layers,)
    eff = n_layers + first_less + last_less
    base, extra = divmod(eff, n_stages)
    if base == 0 or first_less > base or last_less > base:
        return None
    counts = [base + (k < extra) for k in range(n_stages)]
    counts[0] -= first_less
    counts[-1] -= last_less
    return tuple(counts)  # the ends may be empty (only the embedding, only norm + output), as torchtitan allows


def _pipeline(model: ModelSpec, plan: TrainingPlan, led: Ledger, par: dict[str, Any]) -> None:
    schedule = plan.schedule
    if schedule == "zbh1":
        led.lose("schedule", "torch has no ZB-H1 schedule; exported as 1F1B")
        schedule = "1f1b"
    name = SCHEDULES[schedule]
    par["pipeline_parallel_schedule"] = name
    n_stages = plan.pp * plan.vpp
    target = effective_split(model, plan)
    L = model.n_layers
    default_vpp = 1 if name in SINGLE_STAGE else 2
    pairs = [(1, 1), (0, 0), (1, 0), (0, 1)] + [(i, j) for i in range(4) for j in range(4)]

    def stages_lps(first: int, last: int) -> Optional[int]:
        """``pipeline_parallel_layers_per_stage`` giving pp·vpp stages (None: none does)."""
        return next((x for x in range(1, L + 7) if math.ceil((L + first + last) / x) == n_stages), None)

    fits = [fl for fl in pairs if tt_split(n_stages, L, *fl) == target and (plan.vpp == default_vpp or stages_lps(*fl))]
    if fits:
        first, last = fits[0]
    else:
        first, last = 1, 1
        led.lose("layer_split", f"torchtitan's stage split (embedding and output weighted as layers) cannot give {','.join(map(str, target))}; exported with its default split")
    if (first, last) != (1, 1):
        par["pipeline_parallel_first_stage_less_layers"] = first
        par["pipeline_parallel_last_stage_less_layers"] = last
    if plan.vpp != default_vpp:
        lps = stages_lps(first, last)
        if lps is None:
            led.lose("vpp", f"no pipeline_parallel_layers_per_stage gives {n_stages} stages of {L} layers; exported with {default_vpp} per rank")
        else:
            par["pipeline_parallel_layers_per_stage"] = lps
    par["pipeline_parallel_microbatch_size"] = plan.micro_batch


def _compile(plan: TrainingPlan, led: Ledger) -> dict[str, Any]:
    """The ``[compile]`` section for the plan's software stack (empty: compile off)."""
    if plan.stack.kernels == "eager":
        if plan.tp > 1 and plan.stack.tp_comm_overlap:
            led.lose("tp_comm_overlap", "torchtitan's async TP needs the blocks compiled (compile.enable with \"model\" in compile.components) "
                                        "and refuses to start with eager ones; exported with it (give --set kernels=compiled)")
        return {}
    if plan.stack.kernels == "fused":
        led.lose("kernels", "torchtitan has no Megatron-Core/Transformer Engine fused kernels nor fused vocab-parallel cross-entropy; "
                            "exported as torch.compile of the blocks and the loss (kernels compiled), its nearest stack")
    loss = plan.stack.kernels == "fused" or plan.stack.compile_loss
    return {"enable": True, "components": list(COMPONENTS if loss else COMPONENTS[:1])}


def _experts(p: TrainingPlan, shard: int, par: dict[str, Any], led: Ledger, version: str) -> None:
    """EP (ep > 1) as torchtitan ``version`` lays it out. meshplan splits the experts over TP: 0.2
    says so with ``expert_tensor_parallel_degree`` = tp (1 or tp), and EP then borrows only the
    dp_shard x cp ranks; 0.3 has no expert TP (experts sharded over efsdp x ep = dp_shard x cp x tp
    ranks, never split over TP), so tp > 1 warns."""
    par["expert_parallel_degree"] = p.ep
    if version == "0.2":
        par["expert_tensor_parallel_degree"] = p.tp
        ranks, what = shard * p.cp, "dp_shard x cp"
    else:
        ranks, what = shard * p.cp * p.tp, "dp_shard x cp x tp"
        if p.tp > 1:
            led.lose("ep", f"torchtitan 0.3 never splits experts over TP under EP (efsdp x ep = dp_shard x cp x tp ranks); "
                           f"meshplan models them split over the {p.tp} TP ranks: export with --to torchtitan@0.2")
    if ranks % p.ep:
        led.lose("ep", f"torchtitan {version} needs expert_parallel_degree to divide {what} ({ranks}); ep = {p.ep} will be refused at start")


def sections(model: ModelSpec, plan: TrainingPlan, version: str = "0.2") -> tuple[dict[str, dict[str, Any]], Ledger]:
    """The sections for a plan as torchtitan ``version`` (0.2: JobConfig; 0.3: its overrides, see
    :mod:`meshplan.interop.torchtitan03`) reads them, and what could not be expressed."""
    led = Ledger()
    p = plan
    out: dict[str, dict[str, Any]] = {}
    name = catalog_match(model)
    if name in TT_MODELS:
        out["model"] = {"name": TT_MODELS[name][0], "flavor": TT_MODELS[name][1]}
    else:
        named = ", ".join(f"{n} {f}" for n, f, _ in TT_MODELS.values())
        led.lose("model", f"torchtitan names models by name and flavor ({named}); {model.name} is none: set model.name and model.flavor yourself")
    if p.precision.precision == "fp8":
        out.setdefault("model", {})["converters"] = [FLOAT8[0]]
        if p.stack.fsdp_fp8_all_gather:
            out[FLOAT8[0]] = dict.fromkeys(FP8_GATHER, True)
        if p.precision.fp8_scaling != "tensorwise":
            out[FLOAT8[0]] = {"recipe_name": p.precision.fp8_scaling}

    par: dict[str, Any] = {}
    if p.zero == 0 or p.dp * p.cp == 1:
        shard, rep = 1, p.dp
        if p.zero == 0 and p.cp > 1:
            led.lose("zero", "torchtitan shards weights over cp with FSDP whenever cp > 1; ZeRO-0 cannot be expressed")
        if p.zero == 0 and p.dp > 1 and p.tp * p.pp * p.cp > 1:
            led.lose("zero", "torchtitan's DDP (ZeRO-0) runs only without TP, PP and CP; use FSDP")
    else:
        if p.zero in (1, 2):
            led.lose("zero", f"torchtitan has no ZeRO-{p.zero}: FSDP2 (ZeRO-3) or DDP; exported as FSDP")
        shard = p.dp_shard or p.dp
        rep = p.dp // shard
        if shard == 1 and p.cp == 1:
            led.lose("zero", "dp_shard = 1 is DDP (ZeRO-0) in torchtitan; exported so")
        par["fsdp_reshard_after_forward"] = "always" if p.stack.reshard_after_forward else "never"
        if p.stack.fsdp_accumulate_unsharded != (p.pp > 1):
            led.lose("fsdp_accumulate_unsharded", "torchtitan keeps FSDP weights gathered across micro-batches exactly when pp > 1 (torch's pipeline schedules)")
    par["data_parallel_replicate_degree"] = rep
    par["data_parallel_shard_degree"] = shard
    par["tensor_parallel_degree"] = p.tp
    if p.tp > 1:
        if p.stack.tp_comm_overlap:
            par["enable_async_tensor_parallel"] = True
            if p.stack.tp_overlap_kind != "micro-pipeline":
                led.lose("tp_overlap_kind", "torchtitan's async TP is torch's micro-pipelined TP, not userbuffers; exported as it")
        if not p.sequence_parallel:
            led.lose("sequence_parallel", "torchtitan (to 0.2) always runs sequence parallelism with TP; exported with it")
    par["pipeline_parallel_degree"] = p.pp
    if p.pp > 1:
        _pipeline(model, p, led, par)
        dependency_pipeline(p, led, "torchtitan (0.1 on, torch's _PipelineScheduleRuntime; lockstep was its PipelineScheduleMulti of 2024)")
        stage_buffers(p, led, "torchtitan (torch.distributed.pipelining)", "per-micro-batch")
    fsdp_root_unit(p, led, "torchtitan (since pytorch/torchtitan#1094)")
    fp8_library(p, led, "torchtitan", "torchao")
    attention_kernel(p, led, "torchtitan")
    tp_backward(p, led, "torchtitan (torch's DTensor TP)", native=False)
    pipeline_messages(p, led, "torchtitan (torch.distributed.pipelining)", native=False)
    grad_accumulation(p, led, "torchtitan", native="autograd")
    par["context_parallel_degree"] = p.cp
    if p.ep > 1:
        _experts(p, shard, par, led, version)
    out["parallelism"] = par

    r = p.precision
    tr: dict[str, Any] = {
        "local_batch_size": p.global_batch // p.dp if p.pp > 1 else p.micro_batch,
        "global_batch_size": p.global_batch,
        "seq_len": p.seq_len,
        "mixed_precision_param": "float32" if r.precision == "fp32" else "bfloat16",
        "mixed_precision_reduce": "float32",
    }
    if r.precision == "fp16":
        led.lose("precision.precision", "torchtitan computes in bf16 or fp32, not fp16; exported as bf16")
    if r.grad_dtype != "fp32":
        led.lose("precision.grad_dtype", "torchtitan reduces and keeps gradients in fp32; exported so")
    if not r.master_weights and r.precision != "fp32":
        led.lose("precision.master_weights", "torchtitan keeps fp32 parameters (FSDP2 mixed precision); exported so")
    if r.grad_fp32_copy:
        led.lose("precision.grad_fp32_copy", "torchtitan keeps no separate fp32 gradient copy")
    if r.optimizer != "adam":
        led.lose("precision.optimizer", "torchtitan builds Adam or AdamW (optimizer.name); exported as AdamW")
    out["training"] = tr

    out["activation_checkpoint"] = activation_checkpoint_section(model, p, led, version)
    comp = _compile(p, led)
    if comp:
        out["compile"] = comp

    if p.dp * p.cp > 1 and p.stack.overlap_grad_reduce != (p.pp == 1):
        led.lose("overlap_grad_reduce", "torchtitan overlaps the gradient reduction with the backward exactly when pp = 1 "
                                        "(under pipelining, torch's stage.py issues FSDP's reduce-scatters after the stage's last backward)")
    if p.dp * p.cp > 1 and p.zero > 0 and not p.stack.overlap_param_gather:
        led.lose("overlap_param_gather", "torchtitan's FSDP2 always prefetches (overlaps) the weight all-gathers")
    if tuple(p.rank_order) != DEFAULT_RANK_ORDER:
        led.lose("rank_order", "torchtitan's mesh is pp, dp_replicate, dp_shard, cp, tp (outermost first): tp,cp,dp,pp innermost first")
    if p.attention != "flash":
        led.lose("attention", "torchtitan runs SDPA / flex attention (no materialized scores)")
    return out, led


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _header(model: ModelSpec, plan: TrainingPlan, what: str) -> list[str]:
    return [f"# torchtitan {what} ({SOURCE}), written by meshplan for {model.name} on {plan.num_gpus:,} GPUs (NGPU x nodes)."]


def export(model: ModelSpec, plan: TrainingPlan, gpus_per_node: int = 8) -> Any:
    secs, led = sections(model, plan)
    flags = []
    for sec, body in secs.items():
        for key, v in body.items():
            if v is True:
                flags.append(f"--{sec}.{key}")
            elif isinstance(v, list):
                flags.append(f"--{sec}.{key} " + ",".join(map(str, v)))
            else:
                flags.append(f"--{sec}.{key} {v}")
    lines = _header(model, plan, "command-line overrides") + [x + " \\" for x in flags[:-1]] + flags[-1:]
    return led.result("\n".join(lines) + "\n")


def export_toml(model: ModelSpec, plan: TrainingPlan, gpus_per_node: int = 8) -> Any:
    secs, led = sections(model, plan)
    lines = _header(model, plan, "job config, TOML (--job.config_file)")
    for sec, body in secs.items():
        lines += ["", f"[{sec}]"] + [f"{key} = {_value(v)}" for key, v in body.items()]
    return led.result("\n".join(lines) + "\n")


# ---- parse ------------------------------------------------------------------------------------------


#: torchtitan 0.3's config_registry functions (``--module MODULE --config NAME``) → meshplan's model
REGISTRY = {config: model for model, (_, _, config) in TT_MODELS.items()}
#: the registry functions whose model carries Float8 linears (``model_registry(converters=...)``)
REGISTRY_FLOAT8 = ("llama3_405b",)
AC_COMMAND = "activation-checkpoint:"  # torchtitan 0.3's recompute: a tyro subcommand, last on the line


def registry_sections(tokens: list[str]) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """torchtitan 0.3's words that are not ``--section.key`` overrides: ``--module``/``--config``
    (the model, and the Float8 linears its registry function builds) and the
    ``activation-checkpoint:MODE`` subcommand; the other tokens, and those as sections."""
    out: dict[str, dict[str, Any]] = {}
    rest: list[str] = []
    pairs = dict(p for p in arg_pairs(tokens) if p[0] in ("--module", "--config"))
    for tok in tokens:
        if tok.replace("_", "-").startswith(AC_COMMAND):
            mode = tok.split(":", 1)[1].replace("-", "_")  # 0.3's selective is op-level SAC (SelectiveAC)
            out["activation_checkpoint"] = {"mode": mode, **({"selective_ac_option": "op"} if mode == "selective" else {})}
        elif tok not in pairs and tok not in pairs.values() and tok.split("=")[0] not in ("--module", "--config"):
            rest.append(tok)
    config = pairs.get("--config")
    if config is not None:
        name = REGISTRY.get(config)
        out["model"] = {"name": str(pairs.get("--module", "llama3")), "flavor": TT_MODELS[name][1] if name else config}
        if config in REGISTRY_FLOAT8:  # Float8LinearConverter.Config(): recipe_name "rowwise", 0.3's default
            out["model"]["converters"] = [FLOAT8[0]]
            out["quantize"] = {"linear": {"float8": {"recipe_name": "rowwise"}}}
    return rest, out


def flag_sections(text: str) -> dict[str, dict[str, Any]]:
    """``--section.key value`` overrides as sections (``--section.no-key`` / ``no_key``: false),
    with torchtitan 0.3's ``--module``/``--config`` and recompute subcommand
    (:func:`registry_sections`)."""
    tokens, out = registry_sections(arg_tokens(text))
    for name, value in arg_pairs(tokens):
        body = name[2:]
        if "." not in body:
            continue
        sec, key = body.split(".", 1)
        sec, key = sec.replace("-", "_"), key.replace("-", "_")
        if value is None:
            value = True
            if key.startswith("no_"):
                key, value = key[3:], False
        d = out.setdefault(sec, {})
        if key in d and d[key] != value:
            raise InputError(f"{sec}.{key}", f"given twice with different values ({brief(d[key])}, {brief(value)}) in the torchtitan config")
        d[key] = value
    return out


def toml_sections(text: str) -> dict[str, dict[str, Any]]:
    try:
        data = load_toml(text, "plan")
    except tomllib.TOMLDecodeError as exc:
        raise InputError("plan", f"not valid TOML ({exc})") from None
    return {k: v for k, v in data.items() if isinstance(v, dict)}


def parse(text: str, toml: bool = False) -> ParseResult:
    s = toml_sections(text) if toml else flag_sections(text)
    fmt = "torchtitan-toml" if toml else "torchtitan"
    par, tr = s.get("parallelism", {}), s.get("training", {})
    ac, mdl = s.get("activation_checkpoint", {}), s.get("model", {})
    notes: list[str] = []

    def get(sec: dict, name: str, key: str, default: Any, lo: int = 1) -> int:
        return as_int(f"{name}.{key}", sec.get(key, default), lo)

    model = None
    if mdl.get("name") is not None:
        flavor = str(mdl.get("flavor", "debugmodel"))
        name = TT_NAMES.get((str(mdl["name"]), flavor))
        if name is None:
            notes.append(f"model: torchtitan model {mdl['name']} flavor {flavor} is not in meshplan's catalog (give --model)")
        else:
            from meshplan.catalog import load_model

            model = load_model(name)

    f: dict[str, Any] = {}
    tp = get(par, "parallelism", "tensor_parallel_degree", 1)
    pp = get(par, "parallelism", "pipeline_parallel_degree", 1)
    cp = get(par, "parallelism", "context_parallel_degree", 1)
    f.update(tp=tp, pp=pp, cp=cp, ep=get(par, "parallelism", "expert_parallel_degree", 1))
    etp = get(par, "parallelism", "expert_tensor_parallel_degree", 1)
    if f["ep"] > 1 and tp > 1 and etp != tp:
        notes.append(f"ep: expert_tensor_parallel_degree {etp} keeps whole experts on each TP rank; meshplan models them split "
                     f"over the {tp} TP ranks (torchtitan 0.2: set it to {tp}; 0.3 cannot split experts over TP under EP)")
    rep = get(par, "parallelism", "data_parallel_replicate_degree", 1)
    shard = as_int("parallelism.data_parallel_shard_degree", par.get("data_parallel_shard_degree", -1), lo=-1)
    if shard in (0,) or shard < -1:
        raise InputError("parallelism.data_parallel_shard_degree", f"must be -1 (the remaining ranks) or positive (got {shard})")
    if shard == -1:
        notes.append("dp: data_parallel_shard_degree = -1 takes the ranks left over, which the file does not say (give --gpus or --dp)")
    else:
        f["dp"] = rep * shard
    fsdp = shard != 1 or cp > 1
    f["zero"] = 3 if fsdp else 0
    if fsdp and shard != -1 and rep > 1:
        f["dp_shard"] = shard
    reshard = str(par.get("fsdp_reshard_after_forward", "default"))
    f["reshard_after_forward"] = choice("parallelism.fsdp_reshard_after_forward", reshard,
                                        {"default": pp == 1, "always": True, "never": False})
    f["fsdp_accumulate_unsharded"] = fsdp and pp > 1
    f["pp_buffers"] = "per-micro-batch" if pp > 1 else "in-flight"  # torch's PipelineStage buffers
    f["overlap_grad_reduce"] = pp == 1
    f["sequence_parallel"] = as_bool("parallelism.enable_sequence_parallel", par.get("enable_sequence_parallel", True)) or tp == 1
    async_tp = par.get("enable_async_tensor_parallel", s.get("compile", {}).get("enable_async_tensor_parallel", False))
    f["tp_comm_overlap"] = as_bool("parallelism.enable_async_tensor_parallel", async_tp) and tp > 1
    f["tp_backward_overlap"] = False  # torch's DTensor TP: each collective where autograd meets it
    f["pp_scatter_gather"] = False  # torch.distributed.pipelining sends whole tensors
    f["grad_accumulation"] = "autograd"  # torch's AccumulateGrad (DDP); FSDP2 plans set it aside
    if f["tp_comm_overlap"]:
        f["tp_overlap_kind"] = "micro-pipeline"

    if "local_batch_size" not in tr and "batch_size" in tr:  # torchtitan 0.1's name for it
        tr = {**tr, "local_batch_size": tr["batch_size"]}
    local = get(tr, "training", "local_batch_size", 8)
    gbs = as_int("training.global_batch_size", tr.get("global_batch_size", -1), lo=-1)
    if gbs == -1 and "dp" in f:
        gbs = local * f["dp"]
    if gbs > 0:
        f["global_batch"] = gbs
    options = {}
    if gbs == -1:  # torchtitan's global batch is then local x dp, with dp the ranks left over
        options["micro_batches"] = local // get(par, "parallelism", "pipeline_parallel_microbatch_size", 1) if pp > 1 else 1
        notes.append(f"global_batch: training.global_batch_size = -1 is local_batch_size ({local}) x the data-parallel ranks, "
                     f"which the file does not say: `meshplan estimate --plan FILE --gpus N` plans {local} x dp; "
                     f"with flags, give --global-batch {local} x dp")
    f["seq_len"] = get(tr, "training", "seq_len", 2048)

    f["schedule"], f["vpp"] = "1f1b", 1
    if pp > 1:
        sched = str(par.get("pipeline_parallel_schedule", "1F1B"))
        f["schedule"] = choice("parallelism.pipeline_parallel_schedule", sched, {v: k for k, v in SCHEDULES.items()})
        lps = par.get("pipeline_parallel_layers_per_stage")
        first = get(par, "parallelism", "pipeline_parallel_first_stage_less_layers", 1, lo=0)
        last = get(par, "parallelism", "pipeline_parallel_last_stage_less_layers", 1, lo=0)
        single = SCHEDULES[f["schedule"]] in SINGLE_STAGE
        if not single:
            notes.append(f"pipeline_runtime: {sched} read as dependency-driven, as torch runs it under torchtitan 0.1 on "
                         "(_PipelineScheduleRuntime); on the torch builds of 2024 (PipelineScheduleMulti) it ran in "
                         "lockstep: give --set pipeline_runtime=lockstep for those")
        if lps is None:
            f["vpp"] = 1 if single else 2
        elif model is None:
            f["vpp"] = 1 if single else 2
            notes.append("vpp: pipeline_parallel_layers_per_stage needs the model's layer count (no known model.flavor); read as the default stages per rank")
        else:
            n = math.ceil((model.n_layers + first + last) / as_int("parallelism.pipeline_parallel_layers_per_stage", lps))
            if n % pp:
                raise InputError("parallelism.pipeline_parallel_layers_per_stage", f"gives {n} stages, not a multiple of pipeline_parallel_degree ({pp})")
            f["vpp"] = n // pp
        if par.get("module_fqns_per_model_part") is not None:
            notes.append("layer_split: module_fqns_per_model_part is not read; meshplan's default split is used")
        elif model is not None:
            split = tt_split(pp * f["vpp"], model.n_layers, first, last)
            if split is None:
                raise InputError("parallelism.pipeline_parallel_first_stage_less_layers", "gives a split torchtitan refuses (fewer effective layers than stages, or an end weight above the layers per stage)")
            if split != default_layer_split(model.n_layers, pp * f["vpp"]):
                f["layer_split"] = split
        micro = get(par, "parallelism", "pipeline_parallel_microbatch_size", 1)
        if local % micro:
            raise InputError("parallelism.pipeline_parallel_microbatch_size", f"{micro} does not divide training.local_batch_size ({local})")
        f["micro_batch"] = micro
        if "dp" in f and gbs > 0 and gbs != local * f["dp"]:
            notes.append("global_batch: torchtitan runs global / (local x dp) pipeline passes per step; meshplan plans them as one pass of all micro-batches")
    else:
        f["micro_batch"] = local

    read_activation_checkpoint(ac, f, model, pp, notes)

    param = str(tr.get("mixed_precision_param", "bfloat16"))
    prec = choice("training.mixed_precision_param", param, {"bfloat16": "bf16", "float32": "fp32"})
    conv = mdl.get("converters", [])
    conv = [c.strip() for c in conv.split(",")] if isinstance(conv, str) else [str(c) for c in conv]
    f["precision"] = {"precision": prec, "grad_dtype": "fp32"}
    if any(c in FLOAT8 for c in conv):
        f["precision"].update(precision="fp8", fp8_scaling=_read_fp8_recipe(s))
        f.update(_read_fp8_gather(s, fsdp, notes))
    f.update(_read_kernels(s, notes))
    if f["kernels"] == "eager" and f["tp_comm_overlap"]:
        notes.append("tp_comm_overlap: torchtitan refuses async TP without the blocks compiled (compile.enable, \"model\" in compile.components)")
    f["rank_order"] = DEFAULT_RANK_ORDER
    if not (par or tr):
        raise InputError("plan", "no torchtitan parallelism or training settings in the file")
    return ParseResult(fmt, f, model, tuple(notes), options)


def _float8_section(s: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The Float8 linear options: ``[quantize.linear.float8]`` (JobConfig v0.2; a nested table in
    TOML, ``--quantize.linear.float8.KEY`` flags) over ``[float8]`` (before v0.2)."""
    out = dict(s.get("float8", {}))
    quant = s.get("quantize", {})
    nested = quant.get("linear", {}).get("float8", {}) if isinstance(quant.get("linear"), dict) else {}
    out.update(nested if isinstance(nested, dict) else {})
    out.update({k.removeprefix("linear.float8."): v for k, v in quant.items() if k.startswith("linear.float8.")})
    return out


#: torchtitan's ``recipe_name`` → meshplan's ``fp8_scaling`` (torchao ``Float8LinearRecipeName``);
#: absent, torchtitan 0.2 builds ``Float8LinearConfig()``, tensorwise
FP8_RECIPES = {name: name for name in FP8_SCALINGS}


def _read_fp8_recipe(s: dict[str, dict[str, Any]]) -> str:
    """``fp8_scaling`` from the Float8 options' ``recipe_name``; torchtitan refuses a recipe name
    together with the FSDP FP8 all-gather ("using `float8_config.enable_fsdp_float8_all_gather`
    together with `float8_config.recipe_name` is not supported"), and so does this."""
    opts = _float8_section(s)
    recipe = opts.get("recipe_name")
    where = "quantize.linear.float8" if "quantize" in s else "float8"
    if recipe is None:
        return "tensorwise"
    scaling = choice(f"{where}.recipe_name", recipe, FP8_RECIPES)
    if as_bool(f"{where}.{FP8_GATHER[0]}", opts.get(FP8_GATHER[0], False)):
        raise InputError(f"{where}.{FP8_GATHER[0]}", f"torchtitan refuses it together with recipe_name ({brief(recipe)}): "
                         "leave recipe_name out for tensorwise scaling with FP8 all-gathers")
    return scaling


def _read_fp8_gather(s: dict[str, dict[str, Any]], fsdp: bool, notes: list[str]) -> dict[str, Any]:
    """``fsdp_fp8_all_gather`` from the Float8 options, where FSDP runs (a note where it does not,
    and where the scales are not precomputed)."""
    opts = _float8_section(s)
    where = "quantize.linear.float8" if "quantize" in s else "float8"
    on = as_bool(f"{where}.{FP8_GATHER[0]}", opts.get(FP8_GATHER[0], False))
    if not on:
        return {}
    if not fsdp:
        notes.append(f"fsdp_fp8_all_gather: {where}.{FP8_GATHER[0]} applies to FSDP's all-gathers; without FSDP it changes nothing")
        return {}
    if not as_bool(f"{where}.{FP8_GATHER[1]}", opts.get(FP8_GATHER[1], False)):
        notes.append(f"fsdp_fp8_all_gather: without {where}.{FP8_GATHER[1]} torchao all-reduces each weight's amax before "
                     "its all-gather, small collectives meshplan does not model")
    return {"fsdp_fp8_all_gather": True}


def _read_kernels(s: dict[str, dict[str, Any]], notes: list[str]) -> dict[str, Any]:
    """``kernels`` (and ``compile_loss``) from ``[compile]`` (JobConfig v0.2) or, before it,
    ``training.compile``; one note says how it was read."""
    comp, tr = s.get("compile", {}), s.get("training", {})
    legacy = False
    if "enable" in comp or "components" in comp:
        on = as_bool("compile.enable", comp.get("enable", False))
        raw = comp.get("components", list(COMPONENTS))
        if not isinstance(raw, (str, list)):
            raise InputError("compile.components", f"must be a list of {' and '.join(COMPONENTS)} (got {brief(raw)})")
        parts = [c.strip() for c in raw.split(",") if c.strip()] if isinstance(raw, str) else [str(c) for c in raw]
        for c in parts:
            if c not in COMPONENTS:
                raise InputError("compile.components", f"unsupported value {brief(c)} (one of {', '.join(COMPONENTS)})")
        blocks, loss = on and "model" in parts, on and "loss" in parts
        said = f"compile.enable = {str(on).lower()}, components {','.join(parts) or 'none'}"
    elif "compile" in tr:
        blocks = loss = as_bool("training.compile", tr["compile"])
        legacy = True
        said = f"training.compile = {str(blocks).lower()} (JobConfig before v0.2, which compiles the loss with the blocks)"
    else:
        blocks = loss = False
        said = "no compile setting (torchtitan's default: off)"
    if blocks:
        how = "compiled with them" if loss else "eager beside them"
        notes.append(f"kernels: {said} read as compiled (torch.compile'd blocks), the loss {how}"
                     + ("; torchtitan before pytorch/torchtitan#1033 (2025-04) ran it eager: give --set compile_loss=false for those" if legacy else ""))
        return {"kernels": "compiled", "compile_loss": loss}
    extra = "; the loss alone compiled is not modelled (read as eager)" if loss else ""
    notes.append(f"kernels: {said} read as eager (PyTorch eager blocks, torch's cross-entropy){extra}")
    return {"kernels": "eager"}
