"""Named plans of published training runs, with the figures their authors reported.

A preset is data: the plan's settings, keyed by the names of ``meshplan estimate``'s options
(``seq_len`` for ``--seq-len``), and the published figures to compare the estimate with. Options
given on the command line override a preset's values. Besides the named presets below, every
published run of ``meshplan validate`` is a preset under its row id
(:mod:`meshplan.accuracy.run_presets`); :func:`meshplan.presets.get_preset` looks up both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

LLAMA3_SOURCE = (
    "Llama Team, 'The Llama 3 Herd of Models' (arXiv 2407.21783), Table 4 (TFLOP/s per GPU, "
    "MFU vs 989 BF16 TFLOP/s); Sec. 3.3 (layout, batch, network)"
)


@dataclass(frozen=True)
class Published:
    """What a run's authors reported (``None``: not published). MFU as a fraction.

    ``flops_per_step`` is the authors' own FLOP count for a step of the plan (their TFLOP/s and MFU
    are measured with it), described by ``formula``: the comparison converts meshplan's step time
    with that count, so both sides use one convention (DESIGN.md: compare step times)."""

    source: str
    model_tflops_per_gpu: Optional[float] = None
    mfu: Optional[float] = None
    step_s: Optional[float] = None
    tokens_per_s: Optional[float] = None
    peak_memory_gib: Optional[float] = None
    flops_per_step: Optional[Callable[[Any], float]] = None
    formula: str = ""


def _llama3_flops(est: Any) -> float:
    """Llama 3's model FLOPs per step, (6·N + 12·L·h·s) per token (accuracy.formulas)."""
    from meshplan.accuracy.formulas import llama3_model_flops

    m = est.model
    return float(llama3_model_flops(est.plan.tokens_per_step, est.params.total, m.n_layers, m.hidden, est.plan.seq_len))


LLAMA3_FORMULA = "(6·N + 12·L·h·s) FLOPs per token (non-causal attention term), N = all parameters"


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    values: Mapping[str, Any]
    published: Optional[Published] = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    # plan fields no option sets (the optimizer), applied after
    # the options as a ``--plan`` file's are
    extra: Mapping[str, Any] = field(default_factory=dict)


def _llama3_405b(gpus: int, dp: int) -> dict[str, Any]:
    return {
        "model": "llama3-405b",
        "gpu": "h100-sxm-80gb",
        "gpus": gpus,
        "tp": 8,
        "cp": 1,
        "pp": 16,
        "dp": dp,
        "seq_len": 8192,
        "global_batch": 2048,  # 16M tokens (Sec. 3.4.1: 16M-token batches at 8K sequences)
        "micro_batch": 1,
        "schedule": "interleaved",
        # V is not printed, but it follows from the split Llama 3 describes (Sec. 3.3.2): one layer
        # fewer on the first and last stages leaves "the first model chunk on the first stage [with]
        # only the embedding", so each chunk held one layer: 126 + 2 = 128 = 16 x 8. meshplan's
        # default split for pp x vpp = 128 is that split: 0, 1 x 126, 0 (meshplan.pipeline.stages).
        "vpp": 8,
        "recompute": "none",  # "pre-train on sequences of 8K tokens without activation checkpointing"
        # Meta's own PyTorch stack, not Transformer Engine: the paper names no attention kernel, so
        # FlashAttention-2's rates, not the cuDNN attention meshplan's fused stack takes on Hopper
        "attention_kernel": "flash2",
        # and not Megatron-LM's or Transformer Engine's linears: torch's TP meets each collective
        # where autograd does (the stack's tp_backward_overlap off; on, the rows are 2 points faster)
        "tp_backward_overlap": False,
        "zero": 2,  # optimizer state and gradients sharded, weights kept after forward
        "pod_size": 3072,  # 3,072-GPU pods with full bisection ...
        "oversubscription": 7.0,  # ... and 1:7 oversubscription above them
        "tokens": "15.6T",
        "rank_order": "tp,cp,pp,dp",  # Llama 3's order, innermost first
    }


PRESETS: dict[str, Preset] = {
    "llama3-405b-16k": Preset(
        name="llama3-405b-16k",
        description="Llama 3 405B pre-training on 16,384 H100s: TP8 CP1 PP16 DP128, 8K sequences, 16M-token batches",
        values=_llama3_405b(16384, 128),
        published=Published(source=LLAMA3_SOURCE, model_tflops_per_gpu=400.0, mfu=0.41,
                            flops_per_step=_llama3_flops, formula=LLAMA3_FORMULA),
        notes=("16 sequences per DP rank; vpp 8 with one layer per chunk, the first chunk holding only the embedding and the "
               "last only the LM head (0, 1 x 126, 0; 7, 8 x 14, 7 layers per rank), as the paper's Sec. 3.3.2 describes",),
    ),
    "llama3-405b-8k": Preset(
        name="llama3-405b-8k",
        description="Llama 3 405B pre-training on 8,192 H100s: TP8 CP1 PP16 DP64, 8K sequences, 16M-token batches",
        values=_llama3_405b(8192, 64),
        published=Published(source=LLAMA3_SOURCE, model_tflops_per_gpu=430.0, mfu=0.43,
                            flops_per_step=_llama3_flops, formula=LLAMA3_FORMULA),
        notes=("32 sequences per DP rank",),
    ),
}
