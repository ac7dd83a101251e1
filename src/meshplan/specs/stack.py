"""Stack: the software that runs a plan, as data.

A :class:`~meshplan.specs.plan.TrainingPlan` is a layout (axes, batch, precision, recompute,
schedule); the same layout costs different time and memory under Megatron-Core, torchtitan or
DeepSpeed, because their kernels, pipeline runtimes, FSDP units and overlaps differ. Everything
that differs lives here, in one frozen :class:`Stack`; named, sourced profiles are in
``catalog/data/stacks.yaml`` (:func:`meshplan.catalog.load_stack`).

A stack field that does not apply to a plan is ignored, by the rule :data:`RULES` states, never an
error: the torchtitan profile's FSDP2 root unit means nothing to a ZeRO-1 plan, and its pipeline
schedules' unsharded accumulation nothing to one without pipelining. :func:`applied` gives the
stack as it applies to a plan (what the cost model reads), and :func:`ignored` says which fields a
plan ignores and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

from pydantic import Field, model_validator

from meshplan.pipeline.lockstep import LOCKSTEP_SCHEDULES
from meshplan.specs.base import Spec

#: the profile a plan gets when none is named (``catalog/data/stacks.yaml``)
DEFAULT_STACK = "megatron-core"


class Stack(Spec):
    """The behaviour of the software running a plan. Field by field (each read by the module named):

    * ``kernels`` — the element-wise kernels and the loss (:mod:`meshplan.cost.compute`,
      :mod:`~meshplan.cost.activations`): ``fused`` (Megatron-Core/Transformer Engine, fused
      vocab-parallel cross-entropy), ``compiled`` (torch.compile'd blocks, torch's cross-entropy),
      ``eager`` (PyTorch eager, one kernel per op).
    * ``compile_loss`` — with compiled kernels, whether torch.compile also compiles the loss
      (torchtitan's ``build_cross_entropy_loss`` under ``--training.compile``, 2025 on); off: the
      cross-entropy runs eager beside compiled blocks (torchtitan's December 2024 ``train.py``).
    * ``fp8_linears`` — the FP8 linears' library (precision fp8; :mod:`meshplan.cost.float8`):
      ``transformer-engine`` (cast and transpose fused, the FP8 input saved for the backward) or
      ``torchao`` (Float8Linear); ``auto``: Transformer Engine on the fused kernels, torchao on the
      compiled and eager ones.
    * ``attention_kernel`` — FlashAttention-2 (``flash2``: torch's SDPA, the flash-attn package) or
      cuDNN's fused attention (``cudnn``, Transformer Engine's kernel on Hopper); ``auto``: cuDNN on
      the fused kernels where the GPU's calibration has it, FlashAttention-2 otherwise.
    * ``pipeline_runtime`` — how pipeline ranks advance: ``dependency`` (Megatron-LM, torch's
      single-stage schedules, torch's 2025+ runtime), ``lockstep`` (torch's ``PipelineScheduleMulti``
      of 2024: slot by slot over the schedule's grid, :mod:`meshplan.pipeline.lockstep`; changes only
      the multi-stage schedules), ``deepspeed`` (DeepSpeed's pipeline engine: 1F1B in steps that
      each begin with a blocking exchange with one neighbour, :mod:`meshplan.pipeline.deepspeed_steps`)
      or ``blocking`` (Megatron-LM's 1F1B and interleaved loops of 2021–22: after each action a
      blocking exchange with the neighbours, :mod:`meshplan.pipeline.blocking`).
    * ``pp_buffers`` — the stage-to-stage buffers (:func:`meshplan.cost.compose.pp_buffer_messages`):
      ``in-flight`` (Megatron-LM: the activation and gradient being received, each stage output freed
      once sent) or ``per-micro-batch`` (torch.distributed.pipelining: a receive buffer per
      micro-batch, each stage output kept until its backward).
    * ``pp_return_outputs`` — torch.distributed.pipelining's last stage keeps every micro-batch's
      output, the logits, through the step (``schedule.step(return_outputs=True)``, torch's default
      and every torch before pytorch/pytorch#165822, 2025-10).
    * ``tp_comm_overlap`` — TP communication hidden behind the GEMMs (Megatron ``--tp-comm-overlap``,
      torchtitan's ``enable_async_tensor_parallel``); ``tp_overlap_kind`` says how
      (:mod:`meshplan.cost.async_tp`): ``userbuffers`` (Transformer Engine: every TP collective) or
      ``micro-pipeline`` (torch's AsyncTP: the fused all-gather/reduce-scatter matmuls only).
    * ``tp_backward_overlap`` — without TP overlap, the column-parallel linears' backward runs its
      TP collectives behind its own GEMMs (:mod:`meshplan.cost.tp_backward`): the input gradient's
      all-reduce, with sequence parallelism its reduce-scatter, behind the weight-gradient GEMM, and
      with sequence parallelism the all-gather of the saved input shard behind the input-gradient
      GEMM (Megatron-LM's ``LinearWithGradAccumulationAndAsyncCommunication`` since 2021-09,
      always on in Megatron-Core; Transformer Engine's ``Linear`` and ``LayerNormLinear``); off:
      each TP collective is exposed where autograd meets it (Megatron-LM v2.6's mapping
      functions, torch's DTensor TP, nanotron without ``tp_linear_async_communication``).
    * ``pp_scatter_gather`` — with TP and without sequence parallelism, each TP rank sends only its
      1/t of a stage-to-stage message and the receiving stage all-gathers it over its TP group
      (:meth:`meshplan.cost.terms.Terms.p2p_time`): Megatron-LM's ``scatter_gather_tensors_in_pipeline``
      (2021-01 to the move of its pipeline into Megatron-Core, 2023), DeepSpeed's pipeline engine
      since 2021-09 (``pipe_partitioned``, ``grad_partitioned``); off: every TP rank sends the whole
      n·h·e message (Megatron-Core, torch.distributed.pipelining).
    * ``grad_accumulation`` — how each micro-batch's weight gradients join the step's
      (:mod:`meshplan.cost.grad_accumulation`): ``fused`` (the weight-gradient GEMMs
      accumulate into the fp32 buffer in their epilogue: Megatron-LM's
      ``gradient_accumulation_fusion`` since 2022-02, Megatron-Core, Transformer Engine), ``buffer``
      (Megatron-LM v2.x's local DDP adds each gradient into its contiguous ``main_grad`` after every
      micro-batch: a pass of its own) or ``autograd`` (torch's ``AccumulateGrad`` adds each later
      micro-batch's gradient into ``.grad`` in place: DeepSpeed's engine, torch's DDP and pipelines).
    * ``overlap_grad_reduce``, ``overlap_param_gather`` — the data-parallel gradient reduction and
      parameter all-gather run behind compute (Megatron ``--overlap-grad-reduce``,
      ``--overlap-param-gather``; DDP buckets; FSDP prefetch).
    * ``reshard_after_forward`` — ZeRO-3/FSDP frees the gathered weights after the forward.
    * ``fsdp_accumulate_unsharded`` — ZeRO-3 with pipelining: torch's pipeline schedules keep the
      weights gathered and the gradients unsharded across the step's micro-batches, one all-gather
      and one reduce-scatter a step.
    * ``fsdp_head_in_root`` — torch's FSDP2 units: the embedding, final norm and LM head left to the
      root unit, never resharded after forward, the last block kept gathered (torchtitan until
      pytorch/torchtitan#1094, 2025-07).
    * ``fsdp_fp8_all_gather`` — torch's FSDP2 with torchao's Float8 linears: the blocks' weights cast
      to FP8 on their shards and all-gathered as 1 byte each (torchtitan's
      ``float8.enable_fsdp_float8_all_gather``).
    * ``zero3_comm`` — how ZeRO-3 runs its per-layer collectives (:func:`meshplan.cost.comm.fsdp_unit_times`,
      :func:`meshplan.cost.compose.layer_times`): ``prefetched`` (one all-gather and one
      reduce-scatter per unit, a layer, prefetched behind compute: torch's FSDP1/2, Megatron-FSDP,
      DeepSpeed since its coalesced gathers) or ``blocking-per-tensor`` (DeepSpeed's ZeRO-3 of 2021,
      v0.3: one collective per parameter tensor, each all-gather after a device-wide
      ``torch.cuda.synchronize()``, so none runs beside compute).

    The defaults are the ``megatron-core`` profile's.
    """

    name: str = Field(default=DEFAULT_STACK, min_length=1, max_length=80)
    kernels: Literal["fused", "compiled", "eager"] = "fused"
    compile_loss: bool = True
    fp8_linears: Literal["auto", "torchao", "transformer-engine"] = "auto"
    attention_kernel: Literal["auto", "flash2", "cudnn"] = "auto"
    pipeline_runtime: Literal["dependency", "lockstep", "deepspeed", "blocking"] = "dependency"
    pp_buffers: Literal["in-flight", "per-micro-batch"] = "in-flight"
    pp_return_outputs: bool = False
    tp_comm_overlap: bool = False
    tp_overlap_kind: Literal["userbuffers", "micro-pipeline"] = "userbuffers"
    tp_backward_overlap: bool = True
    pp_scatter_gather: bool = False
    grad_accumulation: Literal["fused", "buffer", "autograd"] = "fused"
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    reshard_after_forward: bool = True
    fsdp_accumulate_unsharded: bool = False
    fsdp_head_in_root: bool = False
    fsdp_fp8_all_gather: bool = False
    zero3_comm: Literal["prefetched", "blocking-per-tensor"] = "prefetched"

    @model_validator(mode="after")
    def _check(self) -> "Stack":
        if self.fp8_linears == "torchao" and self.kernels == "fused":
            raise ValueError("fp8_linears torchao needs the compiled or eager kernels (the fused stack's FP8 is Transformer Engine's)")
        return self

    @property
    def fp8_library(self) -> str:
        """The FP8 linears' library: ``fp8_linears``, ``auto`` resolved by the kernels."""
        return fp8_library_of(self.kernels, self.fp8_linears)

    @property
    def zero3_blocking(self) -> bool:
        """ZeRO-3's collectives one per parameter tensor, none beside compute (``zero3_comm``
        blocking-per-tensor, DeepSpeed's ZeRO-3 of 2021)."""
        return self.zero3_comm == "blocking-per-tensor"

    @property
    def loss_kernels(self) -> str:
        """The kernels the cross-entropy runs on: the blocks' ``kernels``, except an eager loss
        beside compiled blocks when ``compile_loss`` is off."""
        return "eager" if self.kernels == "compiled" and not self.compile_loss else self.kernels

    def behaviour(self) -> dict[str, Any]:
        """The behaviour fields (all but the name)."""
        return {k: getattr(self, k) for k in BEHAVIOUR_FIELDS}


#: the fields that describe behaviour (every field but ``name``), in declaration order
BEHAVIOUR_FIELDS: tuple[str, ...] = tuple(k for k in Stack.model_fields if k != "name")


def field_text(value: Any) -> str:
    """A stack field's value as ``--set FIELD=VALUE`` takes it: switches as true or false."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def settings_text(fields: dict[str, Any]) -> str:
    """Fields as ``k=v, k=v`` (the fields set over a profile)."""
    return ", ".join(f"{k}={field_text(v)}" for k, v in fields.items())


def fp8_library_of(kernels: str, fp8_linears: str = "auto") -> str:
    """The library of the FP8 linears ``fp8_linears`` names, ``auto`` resolved by the stack:
    ``transformer-engine`` on the fused kernels, ``torchao`` on the compiled and eager ones."""
    if fp8_linears != "auto":
        return fp8_linears
    return "transformer-engine" if kernels == "fused" else "torchao"


@dataclass(frozen=True)
class Rule:
    """When a stack field applies to a plan; where it does not, it takes ``neutral``."""

    field: str
    applies: Callable[[Stack, Any], bool]  # (stack, plan) -> bool; the plan's layout fields are read
    neutral: Any
    text: str


#: the schedules each runtime other than torch's lockstep one applies to
_RUNTIME_SCHEDULES = {"deepspeed": ("1f1b",), "blocking": ("1f1b", "interleaved")}


def _torch_fsdp2(stack: Stack, plan: Any) -> bool:
    return plan.zero == 3 and stack.kernels != "fused"


#: every rule by which a plan ignores a stack field, in the order they are applied
RULES: tuple[Rule, ...] = (
    Rule("fp8_linears", lambda s, p: p.precision.precision == "fp8", "auto",
         "the FP8 linears' library applies to precision fp8"),
    Rule("tp_comm_overlap", lambda s, p: p.tp > 1, False, "TP communication overlap needs tp > 1"),
    Rule("tp_overlap_kind", lambda s, p: s.tp_comm_overlap, "userbuffers", "the kind of TP overlap needs TP overlap"),
    Rule("tp_backward_overlap", lambda s, p: p.tp > 1 and not s.tp_comm_overlap, False,
         "the backward's own TP overlap needs tp > 1 and no TP communication overlap, which hides every TP collective"),
    Rule("pp_buffers", lambda s, p: p.pp > 1, "in-flight", "stage-to-stage buffers need pp > 1"),
    Rule("pp_scatter_gather", lambda s, p: p.pp > 1 and p.tp > 1 and not p.sequence_parallel, False,
         "stage messages split over TP need pp > 1 and tp > 1 without sequence parallelism (with it a message is already "
         "split)"),
    Rule("grad_accumulation", lambda s, p: p.zero <= 1 or p.shard_degree == 1, "fused",
         "an accumulation pass over the whole gradients needs them held whole through the step (zero 0 or 1, or "
         "nothing to shard over); ZeRO-2/3 accumulate their 1/d shard, not charged"),
    Rule("fsdp_accumulate_unsharded", lambda s, p: p.zero == 3 and p.pp > 1, False,
         "the unsharded accumulation is what torch's pipeline schedules do with ZeRO-3/FSDP: zero 3 and pp > 1"),
    Rule("reshard_after_forward", lambda s, p: not s.fsdp_accumulate_unsharded, False,
         "weights kept gathered across the step's micro-batches are not resharded after each forward"),
    Rule("zero3_comm", lambda s, p: p.zero == 3 and p.shard_degree > 1 and not s.fsdp_accumulate_unsharded, "prefetched",
         "ZeRO-3's per-layer collectives: zero 3 sharded over more than one rank, weights not kept gathered through the step"),
    Rule("overlap_grad_reduce", lambda s, p: not s.fsdp_accumulate_unsharded, False,
         "torch's pipeline stage reduce-scatters unsharded gradients after the stage's last backward, behind nothing "
         "(torch/distributed/pipelining/stage.py, backward_maybe_with_nosync)"),
    Rule("pp_return_outputs", lambda s, p: p.pp > 1 and s.pp_buffers == "per-micro-batch", False,
         "the kept outputs are torch.distributed.pipelining's last stage: pp > 1 with per-micro-batch buffers"),
    Rule("fsdp_head_in_root", lambda s, p: _torch_fsdp2(s, p) and p.pp == 1, False,
         "FSDP2's root unit: zero 3 on the compiled or eager kernels, pp 1"),
    Rule("fsdp_fp8_all_gather", lambda s, p: _torch_fsdp2(s, p) and p.shard_degree > 1 and p.precision.precision == "fp8"
         and s.fp8_library == "torchao" and p.precision.fp8_scaling == "tensorwise", False,
         "FP8 all-gathers are torch's FSDP2 gathering torchao's Float8 linears: zero 3 sharded over more than one rank, "
         "precision fp8 scaled per tensor (torchao gathers row-wise scaled weights in 16 bits), compiled or eager kernels"),
    Rule("pipeline_runtime", lambda s, p: p.pp > 1 and p.schedule in _RUNTIME_SCHEDULES.get(s.pipeline_runtime, LOCKSTEP_SCHEDULES)
         and not (s.pipeline_runtime == "blocking" and p.schedule == "interleaved" and p.grad_accum % p.pp),
         "dependency",
         "the lockstep runtime is torch's multi-stage schedule classes (interleaved, interleaved-zb, zbh1 or zbv), "
         "DeepSpeed's is its 1F1B TrainSchedule, Megatron-LM's blocking one its 1F1B and interleaved loops (the "
         "micro-batches a multiple of pp); all on pp > 1"),
    Rule("attention_kernel", lambda s, p: p.attention == "flash", "auto",
         "the attention kernel is a FlashAttention-style one: attention flash"),
)


def applied(stack: Stack, plan: Any) -> Stack:
    """``stack`` as it applies to ``plan``: each field a rule of :data:`RULES` says the plan
    ignores set to its neutral value (the rules read the plan's layout, batch and precision and
    the stack's fields as already applied)."""
    changes: dict[str, Any] = {}
    for rule in RULES:
        current = stack.model_copy(update=changes) if changes else stack
        if getattr(current, rule.field) != rule.neutral and not rule.applies(current, plan):
            changes[rule.field] = rule.neutral
    return stack.model_copy(update=changes) if changes else stack


def field_applies(field: str, stack: Stack, plan: Any) -> bool:
    """Whether ``plan`` uses ``stack``'s ``field``: its rule in :data:`RULES` applies (a field
    without a rule always does)."""
    return all(rule.applies(stack, plan) for rule in RULES if rule.field == field)


def ignored(stack: Stack, plan: Any) -> list[tuple[str, Any, str]]:
    """The fields of ``stack`` that ``plan`` ignores: (field, the stack's value, the rule)."""
    out = []
    now = applied(stack, plan)
    for rule in RULES:
        if getattr(now, rule.field) != getattr(stack, rule.field):
            out.append((rule.field, getattr(stack, rule.field), rule.text))
    return out
