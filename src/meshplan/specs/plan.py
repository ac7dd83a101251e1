"""TrainingPlan: how one training job is laid out and run.

Symbols: ``t`` tensor-parallel size, ``c`` context-parallel size, ``p`` pipeline stages,
``D`` data-parallel size, ``e`` expert-parallel size, ``v`` virtual stages per pipeline rank,
``b`` micro-batch (sequences per forward on one DP rank), ``m`` micro-batches per step per
pipeline (= grad_accum), ``B`` global batch in sequences = b·m·D, ``s`` sequence length.

Bytes per parameter of the persistent training state follow the precision recipe; the five
conventions the literature uses are all expressible:

==============================  =========  ====  ======  =====  ============
convention                      precision  grad  master  copy   bytes/param
==============================  =========  ====  ======  =====  ============
fp32 (4+4+8)                    fp32       fp32  --      --     16
bf16, no master (2+2+8)         bf16       bf16  no      no     12
ZeRO paper (2+2+12)             bf16       bf16  yes     no     16
Megatron (2+4+12)               bf16       fp32  yes     no     18
bf16 + fp32 copies (2+2+4+4+8)  bf16       bf16  yes     yes    20
==============================  =========  ====  ======  =====  ============

(Adam's two moments are fp32: 8 bytes; the fp32 master copy 4; "copy" is an fp32 copy of
low-precision gradients kept by the optimizer, as Megatron does for fp16.)
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, model_validator

from meshplan.pipeline.stages import split_problem
from meshplan.specs.base import Spec
from meshplan.specs.rules import batch_breaks
from meshplan.specs.stack import BEHAVIOUR_FIELDS, Stack, applied, fp8_library_of  # noqa: F401 (fp8_library_of re-exported)

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
AXES = ("tp", "cp", "pp", "dp")


#: FP8 scaling recipes (torchao's ``Float8LinearRecipeName``; :mod:`meshplan.cost.float8`):
#: one scale per tensor, one per row of every operand, or per row with the weight-gradient GEMM
#: in 16 bits
FP8_SCALINGS = ("tensorwise", "rowwise", "rowwise_with_gw_hp")


class PrecisionRecipe(Spec):
    """Dtypes of weights, gradients and optimizer state, and how FP8 GEMM operands are scaled
    (``fp8_scaling``, precision fp8 only: :data:`FP8_SCALINGS`)."""

    precision: Literal["fp32", "bf16", "fp16", "fp8"] = "bf16"
    grad_dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    master_weights: bool = True
    grad_fp32_copy: bool = False
    optimizer: Literal["adam", "sgd"] = "adam"
    fp8_scaling: Literal[FP8_SCALINGS] = "tensorwise"

    @model_validator(mode="after")
    def _check_scaling(self) -> "PrecisionRecipe":
        if self.fp8_scaling != "tensorwise" and self.precision != "fp8":
            raise ValueError(f"fp8_scaling {self.fp8_scaling} scales FP8 GEMM operands: it needs precision fp8 "
                             f"(got {self.precision})")
        return self

    @property
    def weight_bytes(self) -> int:
        """Bytes per parameter of the weights held for compute. FP8 training (Transformer Engine,
        torchao float8) keeps bf16 weights and casts them to fp8 per GEMM, so fp8 stores 2."""
        return 2 if self.precision == "fp8" else DTYPE_BYTES[self.precision]

    @property
    def grad_bytes(self) -> int:
        return DTYPE_BYTES[self.grad_dtype]

    @property
    def master_bytes(self) -> int:
        """fp32 master copy: needed only when the weights themselves are not fp32."""
        return 4 if (self.master_weights and self.weight_bytes < 4) else 0

    @property
    def grad_copy_bytes(self) -> int:
        return 4 if (self.grad_fp32_copy and self.grad_bytes < 4) else 0

    @property
    def state_bytes(self) -> int:
        """Optimizer moments: Adam keeps m and v in fp32 (8 bytes); SGD with momentum 4."""
        return {"adam": 8, "sgd": 4}[self.optimizer]

    @property
    def optimizer_bytes(self) -> int:
        """Everything the optimizer owns: master weights, fp32 gradient copy, moments."""
        return self.master_bytes + self.grad_copy_bytes + self.state_bytes

    @property
    def optimizer_step_bytes(self) -> int:
        """Bytes a fused optimizer step moves per parameter: it reads the gradient, the moments and
        the fp32 master copy (or the weights when there is none) and writes the moments, the master
        copy and the weights. Megatron's recipe (bf16, fp32 gradients, Adam): reads 4 + 8 + 4,
        writes 8 + 4 + 2 = 30."""
        source = self.master_bytes or self.weight_bytes
        reads = self.grad_bytes + self.grad_copy_bytes + self.state_bytes + source
        writes = self.state_bytes + self.master_bytes + self.weight_bytes
        return reads + writes

    @property
    def bytes_per_param(self) -> int:
        """Unsharded persistent bytes per parameter: weights + gradients + optimizer."""
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes

    @property
    def activation_bytes(self) -> int:
        """Bytes per activation element: 16-bit for bf16/fp16/fp8 recipes, 4 for fp32."""
        return 4 if self.precision == "fp32" else 2

    @property
    def compute_dtype(self) -> str:
        return self.precision


def split_stack_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """Flat fields as TrainingPlan's keyword arguments: the stack's fields by name moved into
    ``stack`` (over the ``stack`` given, a Stack or a dict)."""
    flat = {k: fields[k] for k in BEHAVIOUR_FIELDS if k in fields}
    out = {k: v for k, v in fields.items() if k not in flat}
    if flat:
        base = out.get("stack", Stack())
        base = base.model_dump() if isinstance(base, Stack) else dict(base)
        out["stack"] = {**base, **flat}
    return out


def ep_span_note(ep: int, tp_cp_dp: int) -> str:
    """Why an ep that does not divide D but divides t·c·D is refused: Megatron-Core's MoE parallel
    folding (``--expert-model-parallel-size`` with ``--expert-tensor-parallel-size``, Megatron-Core
    0.10+; Liu et al. 2025, arXiv 2504.14960) lays the expert groups over the t·c·D ranks of a stage,
    so ep may exceed D (DeepSeek-V3-style EP64 on a stage of TP x DP ranks). meshplan places expert
    groups inside the DP group only (docs/model.md), so such layouts are not modelled."""
    if tp_cp_dp % ep:
        return ""
    return (": expert parallelism spanning tp x cp x dp (Megatron-Core's MoE parallel folding, ep up to "
            f"tp x cp x dp = {tp_cp_dp}) is not modelled; meshplan's expert groups lie inside the DP group")


class TrainingPlan(Spec):
    """A layout (axes), a batch, precision, recompute and schedule, and the stack that runs it."""

    tp: int = Field(default=1, ge=1, le=1_000_000)
    cp: int = Field(default=1, ge=1, le=1_000_000)
    pp: int = Field(default=1, ge=1, le=1_000_000)
    dp: int = Field(default=1, ge=1, le=10_000_000)
    ep: int = Field(default=1, ge=1, le=1_000_000)
    dp_shard: Optional[int] = Field(default=None, ge=1)  # HSDP: shard within groups of this size
    vpp: int = Field(default=1, ge=1, le=10_000)
    schedule: Literal["1f1b", "interleaved", "gpipe", "zbh1", "interleaved-zb", "zbv"] = "1f1b"
    micro_batch: int = Field(default=1, ge=1, le=1_000_000)
    global_batch: int = Field(ge=1, le=1_000_000_000)  # sequences per optimizer step
    seq_len: int = Field(ge=1, le=100_000_000)
    recompute: Literal["none", "selective", "op", "full"] = "none"
    # with recompute full: the layers of each virtual stage recomputed, the first n (Megatron's
    # --recompute-method block); None: every layer
    recompute_layers: Optional[int] = Field(default=None, ge=0, le=1_000_000)
    sequence_parallel: bool = True
    zero: Literal[0, 1, 2, 3] = 1
    precision: PrecisionRecipe = PrecisionRecipe()
    attention: Literal["flash", "materialized"] = "flash"
    attention_flops: Literal["causal", "full"] = "causal"
    layer_split: Optional[tuple[int, ...]] = None  # layers per virtual stage, pipeline order
    rank_order: tuple[str, ...] = ("tp", "cp", "dp", "pp")  # innermost first (Megatron)
    # the software that runs the plan (meshplan.specs.stack); stored as it applies to this plan
    stack: Stack = Stack()

    @model_validator(mode="after")
    def _check(self) -> "TrainingPlan":
        if sorted(self.rank_order) != sorted(AXES):
            raise ValueError(f"rank_order must be a permutation of {','.join(AXES)}")
        from meshplan.pipeline.schedules import check_vpp

        try:
            check_vpp(self.schedule, self.vpp)
        except ValueError as exc:  # InputError is a ValueError: pydantic reports it by field
            raise ValueError(str(exc).split(": ", 1)[-1]) from None
        if batch_breaks(self.global_batch, self.micro_batch, self.dp):
            raise ValueError(
                f"global batch ({self.global_batch} sequences) must be divisible by "
                f"micro_batch x dp ({self.micro_batch} x {self.dp})"
            )
        if self.recompute_layers is not None and self.recompute != "full":
            raise ValueError(f"recompute_layers ({self.recompute_layers}) needs recompute full (got {self.recompute})")
        if self.dp_shard is not None and self.dp % self.dp_shard:
            raise ValueError(f"dp_shard ({self.dp_shard}) must divide dp ({self.dp})")
        if self.dp % self.ep:
            raise ValueError(f"ep ({self.ep}) must divide dp ({self.dp}){ep_span_note(self.ep, self.tp * self.cp * self.dp)}")
        if self.layer_split is not None:
            problem = split_problem(tuple(self.layer_split))
            if problem:
                raise ValueError(problem)
        now = applied(self.stack, self)
        if now is not self.stack:
            object.__setattr__(self, "stack", now)  # frozen: set once, while validating
        return self

    # ---- construction from flat fields --------------------------------------------------------
    @classmethod
    def of(cls, **fields: Any) -> "TrainingPlan":
        """A plan from flat fields: the plan's own and the stack's by name together (what CLI
        options, presets and engine configs give); a ``stack`` given as a Stack, a dict or a
        profile's fields is the base the flat stack fields override."""
        return cls(**split_stack_fields(fields))

    @classmethod
    def build(cls, where: str = "", **fields: Any) -> "TrainingPlan":
        """:meth:`of` with the first validation error as an ``InputError`` (field, rule)."""
        return super().build(where, **split_stack_fields(fields))

    def replace(self, **changes: Any) -> "TrainingPlan":
        """This plan with ``changes`` (plan or stack fields by name), validated again."""
        fields = self.model_dump()
        fields["stack"] = self.stack
        return TrainingPlan.of(**{**fields, **changes})

    # ---- derived ----------------------------------------------------------------------------
    @property
    def num_gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def grad_accum(self) -> int:
        """Micro-batches per optimizer step per DP rank: m = B / (b·D)."""
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def num_microbatches(self) -> int:
        return self.grad_accum

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def shard_degree(self) -> int:
        """Ranks over which ZeRO shards model state: the DP shard group times CP (CP ranks hold
        the same weights, so Megatron's distributed optimizer and torchtitan's FSDP shard over
        both)."""
        return (self.dp_shard or self.dp) * self.cp

    @property
    def virtual_stages(self) -> int:
        return self.pp * self.vpp
