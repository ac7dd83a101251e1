"""``meshplan verify flops``: torch's FlopCounterMode over forward and backward of one micro-batch.

How it is measured: the Hugging Face model of the spec is built under ``FakeTensorMode`` (fake CPU
tensors: no memory, but the kernels CPU training would dispatch), one micro-batch of ``b`` sequences of
``s`` tokens runs forward with the loss under one ``FlopCounterMode`` and backward under another, and
the counts are read per aten op:

* dense  = ``aten.mm`` + ``aten.addmm`` (every ``nn.Linear`` and GPT-2's ``Conv1D``, the LM head included);
* attention = ``aten.bmm`` (eager attention: QKᵀ and A·V) + the SDPA kernels.

Traps, and what is done about each:

* On CPU, SDPA dispatches to ``aten._scaled_dot_product_flash_attention_for_cpu`` (and its backward),
  which FlopCounterMode has no formula for: it would count 0. The counter is given
  ``custom_mapping`` entries with torch's own ``sdpa_flop_count`` / ``sdpa_backward_flop_count``.
* The counter ignores causal masking: it counts the full s² work (4·s²·a·d forward per layer and
  sequence, 8·s²·a·d backward). meshplan is compared under that same convention
  (``attention_flops="full"``); meshplan's default causal figure is half of it and is shown for reference.
* Only matmul-like ops are counted: norms, softmax, RoPE, activations and the loss are not, and
  meshplan does not count them either.
* The CPU flash kernel's backward recomputes the score matrix QKᵀ (torch's formula counts 5 matmuls,
  2.5x the forward); meshplan's model FLOPs count the backward as 2x the forward, so the extra QKᵀ,
  half the attention forward, is a named known difference (``flash-backward-recomputes-scores``).
  Eager attention (``--attn-impl eager``, plain ``bmm``) shows exactly 2x.
* On CUDA (``--device cuda``) the model is real, on one GPU, and SDPA dispatches to a CUDA kernel:
  flash (fp16/bf16 only), memory-efficient (what the fp32 model takes) or cuDNN, or the math path
  (``bmm``) when none applies. torch 2.13 registers formulas for all of them
  (``_scaled_dot_product_{flash,efficient,cudnn}_attention`` and their backward, ``_flash_attention_*``,
  ``_efficient_attention_*``: ``sdpa_flop_count`` / ``sdpa_backward_flop_count``, the formulas the CPU
  kernels are given here), so the rows and the known difference are the same.
* Full recompute (``--recompute full``) wraps every layer in activation checkpointing; the repeated
  forward then appears in the backward's count and is compared with meshplan's hardware FLOPs. The
  count is taken with torch's checkpoint *early stop* off: by default non-reentrant checkpointing stops
  re-running a layer once every tensor its backward saved is rebuilt, which skips the layer's last
  matmul when nothing saved depends on its output (measured: Llama's down projection, 2·h·f FLOPs per
  token and layer less than the whole forward meshplan counts; GPT-2 with dropout re-runs everything).
"""

from __future__ import annotations

from typing import Any

from meshplan.cost.flops import attention_forward_flops_per_seq_layer, step_flops
from meshplan.cost.params import count_params
from meshplan.errors import InputError
from meshplan.specs.model import ModelSpec
from meshplan.verify.compare import EXACT, Comparison, KnownDifference, Row

DENSE_OPS = ("mm", "addmm")
ATTENTION_OPS = (
    "bmm",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_cudnn_attention_backward",
    "_flash_attention_forward",
    "_flash_attention_backward",
    "_efficient_attention_forward",
    "_efficient_attention_backward",
)
#: fused SDPA backward kernels: they recompute QKᵀ (:data:`FLASH_BWD`)
FUSED_BACKWARD = tuple(op for op in ATTENTION_OPS if op.endswith("_backward"))

FLASH_BWD = KnownDifference(
    "flash-backward-recomputes-scores",
    "A fused (flash) SDPA backward recomputes the score matrix QKᵀ from the saved log-sum-exp instead of "
    "reading it from memory: 5 s x s matmuls where the model-FLOPs convention counts 4. torch's "
    "FlopCounterMode formula counts that recompute (2·s²·a·d per layer and sequence, half the attention "
    "forward); meshplan's model FLOPs do not (it is hardware work, like recompute).",
)
CAUSAL = KnownDifference(
    "counter-ignores-causal-mask",
    "FlopCounterMode counts the full s x s attention score matrix even when the kernel is causal; "
    "meshplan is compared under the same full convention (--attention-flops full). meshplan's default "
    "causal convention counts half of the attention FLOPs, the work a causal kernel really does.",
)


def _cpu_sdpa_mapping() -> dict[Any, Any]:
    """FlopCounterMode formulas for the CPU flash-attention kernels (torch has none registered)."""
    import torch
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    aten = torch.ops.aten

    def fwd(query, key, value, *args, out_shape=None, **kwargs):
        return sdpa_flop_count(query, key, value)

    def bwd(grad_out, query, key, value, *args, out_shape=None, **kwargs):
        return sdpa_backward_flop_count(grad_out, query, key, value)

    return {
        aten._scaled_dot_product_flash_attention_for_cpu: fwd,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: bwd,
    }


def _by_op(counter) -> dict[str, int]:
    return {str(op).split(".", 1)[-1]: int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}


def measure(
    model: ModelSpec, micro_batch: int, seq_len: int, *, attn: str = "sdpa", recompute: str = "none", device: str = "cpu"
) -> dict[str, dict[str, int]]:
    """FLOPs per aten op of one micro-batch: ``{"forward": {...}, "backward": {...}}``. On ``cpu``
    the model is fake (FakeTensorMode: CPU kernels, no memory); on ``cuda`` it is real, on the
    current GPU, so that SDPA dispatches to the CUDA kernels, whose formulas torch registers."""
    import contextlib

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from meshplan.verify import device as device_mod
    from meshplan.verify.build import build_model

    if recompute not in ("none", "full"):
        raise InputError("recompute", f"verify flops runs none or full recompute (Hugging Face checkpoints whole layers), got {recompute}")
    device_mod.check(device, 1)
    fake = device == "cpu"
    where = None if fake else device_mod.here(device)
    mapping = _cpu_sdpa_mapping()
    with FakeTensorMode() if fake else contextlib.nullcontext():
        net = build_model(model, device=where, attn=attn)
        if recompute == "full":
            if hasattr(net, "activation_checkpointing_enable"):  # transformers >= 5.x
                net.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        ids = torch.randint(0, model.vocab_size, (micro_batch, seq_len), device=where)
        fwd = FlopCounterMode(display=False, custom_mapping=mapping)
        bwd = FlopCounterMode(display=False, custom_mapping=mapping)
        with torch.utils.checkpoint.set_checkpoint_early_stop(False):
            with fwd:
                loss = net(input_ids=ids, labels=ids).loss
            with bwd:
                loss.backward()
    return {"forward": _by_op(fwd), "backward": _by_op(bwd)}


def _split(counts: dict[str, int]) -> tuple[int, int, int]:
    dense = sum(n for op, n in counts.items() if op.split(".")[0] in DENSE_OPS)
    attention = sum(n for op, n in counts.items() if op.split(".")[0] in ATTENTION_OPS)
    return dense, attention, sum(counts.values()) - dense - attention


def compare(model: ModelSpec, micro_batch: int, seq_len: int, *, attn: str = "sdpa", recompute: str = "none",
            device: str = "cpu") -> Comparison:
    """Rows: dense and attention FLOPs, forward and backward, and the totals, exact."""
    counts = measure(model, micro_batch, seq_len, attn=attn, recompute=recompute, device=device)
    d_f, a_f, o_f = _split(counts["forward"])
    d_b, a_b, o_b = _split(counts["backward"])

    pred = step_flops(model, seq_len, micro_batch, recompute, "full")  # one micro-batch: B = b
    causal = step_flops(model, seq_len, micro_batch, recompute, "causal")
    n_mm = count_params(model).matmul
    tokens = micro_batch * seq_len
    attn_fwd = attention_forward_flops_per_seq_layer(model, seq_len, "full") * model.n_layers * micro_batch
    # meshplan's recompute figure repeats the layers' matmuls and the attention forward
    rec_dense = pred.recompute - (attn_fwd if recompute == "full" else 0)
    rec_attn = pred.recompute - rec_dense

    c = Comparison("flops", f"FLOPs of one micro-batch ({micro_batch} x {seq_len} tokens), forward + backward")
    c.setup = {
        "model": model.name, "micro_batch": micro_batch, "seq_len": seq_len, "attention_impl": attn,
        "recompute": recompute, "matmul_params": n_mm, "tokens": tokens,
        "measured_by_op": counts, "meshplan_causal_attention": causal.attention,
        "device": device,
        "how": "FlopCounterMode under FakeTensorMode (CPU kernels), custom formulas for the CPU SDPA kernels" if device == "cpu"
        else "FlopCounterMode on real CUDA tensors (torch's own formulas for the CUDA SDPA kernels)",
    }
    c.add(Row("dense forward (2·N_mm·T)", d_f, 2 * n_mm * tokens, EXACT, "FLOP"))
    c.add(Row("dense backward (4·N_mm·T" + (" + recompute)" if recompute == "full" else ")"), d_b,
              4 * n_mm * tokens + rec_dense, EXACT, "FLOP"))
    c.add(Row("attention forward (full s², 4·L·a·d·s²·b)", a_f, attn_fwd, EXACT, "FLOP", notes=(CAUSAL.name,)), CAUSAL)
    fused = any(op.split(".")[0] in FUSED_BACKWARD for op in counts["backward"])
    flash = attn_fwd // 2 if fused else 0  # the recomputed QKᵀ, half the attention forward
    known_attn = (CAUSAL, FLASH_BWD) if fused else (CAUSAL,)
    c.add(Row("attention backward (full s², 8·L·a·d·s²·b" + (" + recompute)" if recompute == "full" else ")"), a_b,
              2 * attn_fwd + rec_attn, EXACT, "FLOP", known=flash, notes=tuple(k.name for k in known_attn)), *known_attn)
    c.add(Row("other counted ops", o_f + o_b, 0, EXACT, "FLOP"))
    c.add(Row("model FLOPs (dense + attention, full s²)" if recompute == "none" else "hardware FLOPs (with recompute, full s²)",
              d_f + d_b + a_f + a_b + o_f + o_b, pred.hardware, EXACT, "FLOP", known=flash,
              notes=tuple(k.name for k in known_attn)), *known_attn)
    return c
