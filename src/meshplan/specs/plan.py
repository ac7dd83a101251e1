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

from typing import Literal, Optional

from pydantic import Field, model_validator

from meshplan.pipeline.stages import split_problem
from meshplan.specs.base import Spec

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
AXES = ("tp", "cp", "pp", "dp")


class PrecisionRecipe(Spec):
    """Dtypes of weights, gradients and optimizer state."""

    precision: Literal["fp32", "bf16", "fp16", "fp8"] = "bf16"
    grad_dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    master_weights: bool = True
    grad_fp32_copy: bool = False
    optimizer: Literal["adam", "sgd"] = "adam"

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


def fp8_library_of(kernels: str, fp8_linears: str = "auto") -> str:
    """The library of the FP8 linears ``fp8_linears`` names, ``auto`` resolved by the stack:
    ``transformer-engine`` on the fused kernels, ``torchao`` on the compiled and eager ones."""
    if fp8_linears != "auto":
        return fp8_linears
    return "transformer-engine" if kernels == "fused" else "torchao"


class TrainingPlan(Spec):
    """A layout (axes), a batch, and the switches that change memory or time."""

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
    sequence_parallel: bool = True
    zero: Literal[0, 1, 2, 3] = 1
    precision: PrecisionRecipe = PrecisionRecipe()
    attention: Literal["flash", "materialized"] = "flash"
    attention_flops: Literal["causal", "full"] = "causal"
    # element-wise kernels and loss of the software stack (meshplan.cost.compute, .activations):
    # fused (Megatron-Core/Transformer Engine, fused vocab-parallel cross-entropy), compiled
    # (torch.compile'd blocks, torch's cross-entropy), eager (PyTorch eager, torch's cross-entropy)
    kernels: Literal["fused", "compiled", "eager"] = "fused"
    # with compiled kernels, whether torch.compile also compiles the loss (torchtitan's
    # build_cross_entropy_loss under --training.compile, 2025 on); off: the cross-entropy runs
    # eager beside compiled blocks (torchtitan's December 2024 train.py). See loss_kernels.
    compile_loss: bool = True
    layer_split: Optional[tuple[int, ...]] = None  # layers per virtual stage, pipeline order
    rank_order: tuple[str, ...] = ("tp", "cp", "dp", "pp")  # innermost first (Megatron)
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    tp_comm_overlap: bool = False
    # how TP communication is overlapped (meshplan.cost.async_tp): userbuffers (Megatron
    # --tp-comm-overlap, Transformer Engine: every TP collective behind the GEMMs) or
    # micro-pipeline (torch's AsyncTP: the fused all-gather/reduce-scatter matmuls only)
    tp_overlap_kind: Literal["userbuffers", "micro-pipeline"] = "userbuffers"
    # how the pipeline ranks advance (meshplan.pipeline.lockstep): dependency (Megatron-LM, torch's
    # single-stage schedules and its 2025+ runtime: an action waits for its rank and its input) or
    # lockstep (torch's PipelineScheduleMulti runtime of 2024: slot by slot over the schedule's
    # precomputed grid, every rank waiting for its neighbours' sends and receives of the slot);
    # lockstep changes only the multi-stage schedules (interleaved, interleaved-zb, zbh1, zbv) on
    # pp > 1 — torch runs GPipe and 1F1B with its single-stage classes, dependency-driven
    pipeline_runtime: Literal["dependency", "lockstep"] = "dependency"
    # the pipeline's stage-to-stage buffers (meshplan.cost.compose.pp_buffer_messages): in-flight
    # (Megatron-LM: one activation and one gradient message received at a time, each stage output
    # freed once sent) or per-micro-batch (torch.distributed.pipelining: every stage but the first
    # allocates a receive buffer per micro-batch, every stage but the last a gradient receive
    # buffer per micro-batch, kept through the step; each stage output kept until its backward)
    pp_buffers: Literal["in-flight", "per-micro-batch"] = "in-flight"
    # with per-micro-batch buffers (torch.distributed.pipelining): whether the last stage keeps
    # every micro-batch's output (the logits) through the step and concatenates them at its end
    # (meshplan.cost.compose.merged_outputs_items): torch's schedule.step(return_outputs=True), its
    # default, and what every torch did before the option (pytorch/pytorch#165822, 2025-10);
    # off: return_outputs=False, which torchtitan's trainer passes since
    pp_return_outputs: bool = False
    reshard_after_forward: bool = True  # ZeRO-3/FSDP: free gathered weights after forward
    # ZeRO-3/FSDP: keep weights gathered and gradients unsharded across the step's micro-batches,
    # one all-gather and one reduce-scatter per step (torch.distributed.pipelining with FSDP2)
    fsdp_accumulate_unsharded: bool = False
    # torch's FSDP2 (ZeRO-3 on the compiled or eager stack, pp = 1): the embedding, final norm and
    # LM head left to the root unit, which FSDP2 never reshards after forward, and the last block
    # kept gathered (torchtitan's units until pytorch/torchtitan#1094, 2025-07;
    # meshplan.cost.compose.rank_other_items); off: each a unit of its own (torchtitan since then:
    # the embedding resharded after forward, the final norm + LM head kept gathered to their backward)
    fsdp_head_in_root: bool = False
    # torch's FSDP2 with torchao's Float8 linears (ZeRO-3, precision fp8, the compiled or eager
    # kernels): the blocks' Float8Linear weights cast to FP8 on their shards and all-gathered as 1
    # byte each, the forward taking them cast (torchtitan's float8.enable_fsdp_float8_all_gather,
    # with precompute_float8_dynamic_scale_for_fsdp; meshplan.cost.fsdp_copies); off: gathered in
    # the compute dtype and cast in every forward
    fsdp_fp8_all_gather: bool = False
    # the library of the FP8 linears (precision fp8; meshplan.cost.compute, .float8):
    # transformer-engine (cast and transpose fused, the FP8 input saved for the backward:
    # Megatron-Core, Composer's amp_fp8, Accelerate's te backend) or torchao (Float8Linear:
    # torchtitan, Accelerate's ao backend); auto: Transformer Engine on the fused stack, torchao on
    # the compiled and eager ones
    fp8_linears: Literal["auto", "torchao", "transformer-engine"] = "auto"
    # the attention kernel (attention flash; meshplan.cost.compute.flash_attention_times):
    # flash2 (FlashAttention-2: torch's SDPA, the flash-attn package, the calibration's flash
    # rates) or cudnn (cuDNN's fused attention, which Transformer Engine runs on Hopper, measured
    # 1.6-1.9x FlashAttention-2; Hopper only); auto: cudnn on the fused stack where the GPU's
    # calibration has it (Transformer Engine's choice), flash2 otherwise (attention_kernel_of)
    attention_kernel: Literal["auto", "flash2", "cudnn"] = "auto"

    @model_validator(mode="after")
    def _check(self) -> "TrainingPlan":
        if sorted(self.rank_order) != sorted(AXES):
            raise ValueError(f"rank_order must be a permutation of {','.join(AXES)}")
        from meshplan.pipeline.schedules import check_vpp

        try:
            check_vpp(self.schedule, self.vpp)
        except ValueError as exc:  # InputError is a ValueError: pydantic reports it by field
            raise ValueError(str(exc).split(": ", 1)[-1]) from None
        if self.global_batch % (self.micro_batch * self.dp):
            raise ValueError(
                f"global batch ({self.global_batch} sequences) must be divisible by "
                f"micro_batch x dp ({self.micro_batch} x {self.dp})"
            )
        if self.dp_shard is not None and self.dp % self.dp_shard:
            raise ValueError(f"dp_shard ({self.dp_shard}) must divide dp ({self.dp})")
        if self.fsdp_accumulate_unsharded and self.zero != 3:
            raise ValueError("fsdp_accumulate_unsharded applies to ZeRO-3 / FSDP (zero = 3) only")
        if self.pp_return_outputs and self.pp_buffers != "per-micro-batch":
            raise ValueError("pp_return_outputs describes torch.distributed.pipelining's last stage: give pp_buffers per-micro-batch")
        if self.fsdp_head_in_root and (self.zero != 3 or self.kernels == "fused" or self.pp > 1):
            raise ValueError("fsdp_head_in_root describes torch's FSDP2 units: zero = 3 on the compiled or eager kernels, pp = 1")
        if self.fp8_linears == "torchao" and self.kernels == "fused":
            raise ValueError("fp8_linears torchao needs the compiled or eager kernels (the fused stack's FP8 is Transformer Engine's)")
        if self.fsdp_fp8_all_gather and (self.zero != 3 or self.kernels == "fused" or self.precision.precision != "fp8"
                                         or self.fp8_library != "torchao"):
            raise ValueError("fsdp_fp8_all_gather describes torch's FSDP2 with torchao's Float8 linears: zero = 3, "
                             "precision fp8, the compiled or eager kernels, fp8_linears torchao")
        if self.attention_kernel != "auto" and self.attention != "flash":
            raise ValueError("attention_kernel names a FlashAttention-style kernel: give attention flash (or attention_kernel auto)")
        if self.dp % self.ep:
            raise ValueError(f"ep ({self.ep}) must divide dp ({self.dp})")
        if self.layer_split is not None:
            problem = split_problem(tuple(self.layer_split))
            if problem:
                raise ValueError(problem)
        return self

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
    def fp8_library(self) -> str:
        """The FP8 linears' library (:func:`fp8_library_of` of the plan's kernels)."""
        return fp8_library_of(self.kernels, self.fp8_linears)

    @property
    def loss_kernels(self) -> str:
        """The stack the cross-entropy runs on: the blocks' ``kernels``, except an eager loss
        beside compiled blocks when ``compile_loss`` is off."""
        return "eager" if self.kernels == "compiled" and not self.compile_loss else self.kernels

    @property
    def virtual_stages(self) -> int:
        return self.pp * self.vpp
