"""torchtitan 0.3 (the current release): ``--module``/``--config`` and ``--section.key`` overrides.

torchtitan 0.3 dropped ``JobConfig`` and its TOML: a run starts from a Python ``config_registry``
function (``--module llama3 --config llama3_8b``), which the command line overrides through tyro
(``torchtitan/config/manager.py``). The plan's sections are :func:`torchtitan.sections`'s, rewritten
for what 0.3 reads:

* model → ``--module llama3 --config llama3_8b`` / ``llama3_70b`` / ``llama3_405b``, ``--module
  deepseek_v3 --config deepseek_v3_671b``, ``--module qwen3 --config qwen3_30b_a3b``
  (:data:`torchtitan.TT_MODELS`); ``--model.*`` is gone (the model spec is built in Python, not a flag).
* FP8: the Float8 linears are ``model_registry(converters=...)`` of the registry function, which no
  flag sets: torchtitan's ``llama3_405b`` carries them, ``llama3_8b`` and ``llama3_70b`` do not; a
  plan whose precision differs from its registry function's is warned (``precision.precision``).
  0.3's ``Float8LinearConverter`` scales row-wise (``recipe_name``: ``rowwise``, its default, or
  ``rowwise_with_gw_hp``), so ``llama3_405b`` reads as ``fp8_scaling rowwise`` and a plan with
  another recipe warns (``precision.fp8_scaling``). ``[quantize.linear.float8]`` and its FSDP FP8
  all-gather are gone: ``fsdp_fp8_all_gather`` warns.
* recompute → the ``activation-checkpoint:none|full|selective`` subcommand, always written (last on
  the line) so that the registry function's own choice (selective for 8B, full for 70B) never
  replaces the plan's; 0.3's selective is op-level SAC.
* async TP → ``--compile.enable_async_tensor_parallel``; ``compile.enable`` and the async TP switch
  are always written, on or off (``llama3_405b`` turns both on).
* pipeline and expert-parallel plans → ``--training.disable_cuda_graphs``: 0.3 captures the step in
  CUDA graphs by default and refuses them with pp > 1, and with ep > 1 on the all-to-all token
  dispatcher meshplan prices (which synchronises with the CPU; ``Trainer._validate_cuda_graphs``).
* EP: 0.3 has no ``expert_tensor_parallel_degree``: with EP on, experts are sharded over
  ``efsdp x ep`` = ``dp_shard x cp x tp`` ranks and never split over TP, so a plan with ep > 1 and
  tp > 1 (experts split over TP in meshplan's model) warns (``ep``; ``torchtitan._experts``).
"""

from __future__ import annotations

from meshplan.interop.common import ExportResult, Ledger, catalog_match
from meshplan.interop.torchtitan import AC_COMMAND, REGISTRY_FLOAT8, TT_MODELS, sections
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan

VERSION = "0.3"
SOURCE = "pytorch/torchtitan torchtitan/config/manager.py, ConfigManager of v0.3"
DROPPED = ("quantize.linear.float8", "activation_checkpoint", "model")  # sections 0.3 takes otherwise


def _registry(model: ModelSpec, plan: TrainingPlan, led: Ledger) -> list[str]:
    """``--module``/``--config`` for the model (none where torchtitan has no registry function for
    it: torchtitan then refuses to start, naming ``--module``), warning where the function's Float8
    linears differ from the plan's precision."""
    name = catalog_match(model)
    config = TT_MODELS[name][2] if name in TT_MODELS else None
    fp8 = plan.precision.precision == "fp8"
    if fp8 != (config in REGISTRY_FLOAT8):
        has = "builds Float8 linears" if config in REGISTRY_FLOAT8 else "builds no Float8 linears"
        led.lose("precision.precision", f"torchtitan 0.3's {config or 'registry'} config {has} and no flag changes it "
                                        f"(model_registry converters); export with --to torchtitan@0.2 or edit the registry function")
    if fp8 and config in REGISTRY_FLOAT8 and plan.precision.fp8_scaling != "rowwise":
        led.lose("precision.fp8_scaling", f"torchtitan 0.3's {config} config builds Float8LinearConverter.Config() "
                                          f"(recipe_name 'rowwise'), not {plan.precision.fp8_scaling}: edit the registry function")
    if fp8 and plan.stack.fsdp_fp8_all_gather:
        led.lose("fsdp_fp8_all_gather", "torchtitan 0.3 has no FSDP FP8 all-gather option (0.2's quantize.linear.float8.enable_fsdp_float8_all_gather)")
    if config is None:
        return []  # sections() has warned "model"
    return [f"--module {TT_MODELS[name][0]}", f"--config {config}"]


def flags(model: ModelSpec, plan: TrainingPlan) -> tuple[list[str], Ledger]:
    """The 0.3 command line (one flag and its value per item) and what could not be expressed."""
    secs, led = sections(model, plan, VERSION)
    out = _registry(model, plan, led)
    async_tp = secs["parallelism"].pop("enable_async_tensor_parallel", False)
    comp = secs.get("compile", {"enable": False})
    secs["compile"] = {**comp, "enable_async_tensor_parallel": async_tp}
    if plan.pp > 1 or plan.ep > 1:
        secs["training"]["disable_cuda_graphs"] = True
    for sec, body in secs.items():
        if sec in DROPPED:
            continue
        for key, v in body.items():
            if isinstance(v, bool):
                out.append(f"--{sec}.{key}" if v else f"--{sec}.no-{key}")
            elif isinstance(v, list):
                out.append(f"--{sec}.{key} " + ",".join(map(str, v)))
            else:
                out.append(f"--{sec}.{key} {v}")
    out.append(AC_COMMAND + secs["activation_checkpoint"]["mode"])
    return out, led


def export(model: ModelSpec, plan: TrainingPlan, gpus_per_node: int = 8) -> ExportResult:
    """torchtitan 0.3's command line for the plan (``torchrun ... -m torchtitan.train`` takes it)."""
    lines, led = flags(model, plan)
    head = f"# torchtitan {VERSION} command line ({SOURCE}), written by meshplan for {model.name} on {plan.num_gpus:,} GPUs (NGPU x nodes)."
    return led.result("\n".join([head] + [x + " \\" for x in lines[:-1]] + lines[-1:]) + "\n")
