"""Activation memory of one transformer layer, from the list of tensors its backward needs.

Per micro-batch of ``b`` sequences, each GPU holds ``n = b·s/c`` tokens (``c`` the context-parallel
size). Every saved tensor is listed with its size; ``e`` is bytes per activation element
(2 for 16-bit training). "rep" tensors are replicated across the TP group unless sequence
parallelism shards them (÷t); "tp" tensors are split by TP (÷t).

=====================  ==================================  =====  ===========================
tensor                 bytes                               split  kept under recompute
=====================  ==================================  =====  ===========================
norm 1 input           n·h·e                               rep    none, selective
Q/K/V input (normed)   n·h·e                               rep†   none, selective
Q, K, V                n·(a + 2g)·d·e (g = a on torch)     tp     none, selective
attention scores       b·a·(s/c)·s·e (softmax output)      tp     none (materialized only)
 + dropout mask/out    b·a·(s/c)·s·(1 + e)                 tp     none (materialized, dropout)
flash softmax stats    4·n·a  (fp32 log-sum-exp)           tp     none (flash only)
out-proj input         n·a·d·e                             tp     none, selective
attention dropout mask n·h                                 rep    none, selective (dropout)
norm 2 input           n·h·e (not with parallel residual)  rep    none, selective
MLP input (normed)     n·h·e                               rep†   none, selective
MLP hidden             3·n·f·e gated (gate|up, product)    tp     none, selective
                       2·n·f·e (GeLU input, fc2 input)
MLP dropout mask       n·h                                 rep    none, selective (dropout)
layer input            n·h·e                               rep    full (the only one kept)
=====================  ==================================  =====  ===========================

† On the torch stacks (``kernels`` compiled or eager) with sequence parallelism, the column-parallel
linears save the input torch's ``PrepareModuleInput`` all-gathered, n·h·e, where Megatron saves its
n·h·e/t shard and gathers it again in backward (Korthikanti et al. 2022, Sec. 4.2.2). The torch
stacks also hand SDPA K and V repeated to the query heads (torchtitan's ``repeat_kv``), which it
saves: g = a there (:func:`meshplan.cost.cp_exchange.sdpa_kv_heads`). Both measured: the saved
tensors of a torchtitan block, eager and ``torch.compile``'d (tests/test_eager_activations.py), and
Hugging Face's layers under torch's MemTracker (``meshplan verify memory``).

The eager stack (``kernels`` eager) keeps more (:func:`eager_activation_items`): an RMSNorm written
as torchtitan and Hugging Face write it (``x.float()``, ``x * rsqrt(mean(x²) + ε)``, cast back, times
the weight) saves its fp32 input and fp32 reciprocal RMS besides the normalized copy, 4·n·h + 4·n
per norm beyond the fused kernel's input (÷t under SP); SiLU saves its output for the gated
product, n·f·e more (÷t). torch's LayerNorm is one native op and a GeLU MLP saves what the table
lists, so GPT-style layers keep no more in eager mode.

For GPT (MHA, 4h GeLU MLP, dropout, materialized attention, e = 2) the list sums to Korthikanti
et al. 2022, Table 2: ``sbh(34 + 5as/h)`` without parallelism, ``sbh(10 + 24/t + 5as/(ht))`` with
TP, ``sbh(34/t + 5as/(ht))`` with TP+SP, ``sbh(10 + 24/t)`` TP+selective, ``34sbh/t``
TP+SP+selective, and ``2sbh`` for full recompute (the tests assert each). Norm statistics
(4–8 bytes per token) are left out, as in the paper (< 0.1 %).

A gated MLP keeps the fused gate|up output (2·n·f·e, the SwiGLU input) and the down-projection
input (n·f·e), as Megatron-LM's fused ``bias_swiglu`` does (it recomputes SiLU in backward);
plain eager PyTorch also keeps SiLU's output, one n·f·e more.

FP8 training with Transformer Engine (the ``fused`` stack) saves each linear layer's input for
the weight-gradient GEMM as the FP8 (1-byte) copy it cast in forward, not in 16-bit: on Hopper
the wgrad GEMM reads the input column-wise, so TE keeps that quantized copy and drops the
high-precision one (Transformer Engine docs, "Low precision training: performance
considerations", tensor usages). The inputs that only a GEMM needs shrink to 1 byte per element
(QKV input, MLP input, the MLP activation's output); the attention output is needed by the
attention backward in 16-bit and by the output projection in FP8, so it costs ``e + 1``. For GPT
with TP+SP this is ``29sbh/t`` instead of ``34sbh/t``. torchao's Float8Linear (torchtitan) saves
the 16-bit input and casts again in backward: no change (:func:`saved_gemm_input_bytes`).

torchtitan's op-level selective checkpointing ("op") keeps the layer input, the outputs of every
other matmul and of the attention kernel, and recomputes the rest (``op_sac_saved``).

Full recompute keeps only the layer input but rebuilds the rest of one layer's activations during
its backward: that working set is reported separately (``working``), with the gradients the
layer's MLP backward holds at once (:func:`mlp_backward_gradient_bytes`) and, under context
parallelism on the torch stacks, the buffers of torch's ring attention backward
(:func:`layer_activations`).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost.cp_exchange import ring_backward_buffer_bytes, sdpa_kv_heads
from meshplan.cost.params import layer_matmuls, matmuls_per_rank, padded_vocab
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import fp8_library_of


@dataclass(frozen=True)
class LayerActivations:
    """Bytes one layer keeps for one micro-batch on one GPU, and its recompute working set."""

    stored: float
    working: float  # transient peak while a recomputed layer runs its backward
    items: tuple[tuple[str, float], ...]  # what ``stored`` is made of (for explain)
    gradients: float = 0.0  # the part of ``working`` that is the MLP backward's gradients (0 when the ring's moment wins)


#: A layer's tensors its backward frees before it reaches the attention: the MLP's (dense or MoE)
#: and the norms' between the attention and the MLP (Gemma's post-attention norm included).
MLP_SIDE_ITEMS = frozenset({
    "norm2_input", "post_norm_inputs", "mlp_input", "mlp_hidden", "mlp_dropout_mask",
    "router_probs", "expert_inputs", "expert_hidden", "expert_outputs", "shared_expert_hidden",
    "eager_norm2", "eager_silu_output",
})


def layer_activation_items(
    model: ModelSpec,
    micro_batch: int,
    seq_len: int,
    tp: int,
    cp: int,
    sequence_parallel: bool,
    attention: str,
    act_bytes: int,
    moe: bool = False,
    gemm_input_bytes: float | None = None,
    kernels: str = "fused",
) -> list[tuple[str, float, str]]:
    """Every tensor a layer saves without recompute: (name, bytes per GPU, recompute class).
    Class ``core`` is dropped by selective recompute; ``layer`` by full recompute too.
    ``moe`` gives a mixture-of-experts layer of an MoE model (:func:`moe_activation_items`);
    MLA keeps its normalized latents and queries/keys of d, values of d_v. ``gemm_input_bytes``
    (default ``act_bytes``) is what a tensor saved only as a GEMM input costs per element
    (:func:`saved_gemm_input_bytes`). ``kernels`` is the plan's stack: the torch stacks save the
    gathered inputs under SP and repeated K/V, the eager one its norms' and SiLU's tensors
    (module docstring)."""
    e = act_bytes
    gi = e if gemm_input_bytes is None else gemm_input_bytes
    n = micro_batch * seq_len / cp
    h, f, d, a = model.hidden, model.ffn_hidden, model.head_dim, model.n_heads
    rep = tp if sequence_parallel else 1
    gathered = 1 if kernels != "fused" else rep  # torch's column-parallel linears keep the gathered input
    a_r = a / tp
    g_r = sdpa_kv_heads(model, tp, kernels)
    items: list[tuple[str, float, str]] = [
        ("norm1_input", n * h * e / rep, "layer"),
        ("qkv_input", n * h * gi / gathered, "layer"),
        ("q_k_v", n * (a_r + 2 * g_r) * d * e, "layer"),
    ]
    if model.is_mla:  # q and k of d, v of d_v; the latents that feed the up-projections
        items[-1] = ("q_k_v", n * a_r * (2 * d + model.value_head_dim) * e, "layer")
        latents = model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim
        items.append(("mla_latents", n * latents * e, "layer"))
    if attention == "materialized":
        scores = micro_batch * a_r * (seq_len / cp) * seq_len
        items.append(("attention_scores", scores * e, "core"))
        if model.dropout:
            items.append(("attention_dropout", scores * (1 + e), "core"))
    else:
        items.append(("flash_softmax_stats", 4 * n * a_r, "core"))
    # flash attention's backward needs its 16-bit output; the projection keeps its own FP8 copy
    o_bytes = e + gi if (attention == "flash" and gi != e) else gi
    items.append(("out_proj_input", n * a_r * model.value_head_dim * o_bytes, "layer"))
    if model.dropout:
        items.append(("attention_out_dropout_mask", n * h / rep, "layer"))
    if not model.parallel_residual:
        items.append(("norm2_input", n * h * e / rep, "layer"))
    if model.norms_per_layer == 4:  # Gemma 2/3: the post-attention and post-MLP norms' inputs
        items.append(("post_norm_inputs", 2 * n * h * e / rep, "layer"))
    items.append(("mlp_input", n * h * gi / gathered, "layer"))
    if moe:
        items.extend(moe_activation_items(model, n, tp, e))
    else:
        # the first GEMM's output (the activation's input, 16-bit) and the second GEMM's input
        items.append(("mlp_hidden", ((2 if model.gated_mlp else 1) * e + gi) * n * (f / tp), "layer"))
    if model.dropout:
        items.append(("mlp_dropout_mask", n * h / rep, "layer"))
    if kernels == "eager":
        items.extend(eager_activation_items(model, n, tp, sequence_parallel, e, moe))
    return items


def eager_norm_bytes(model: ModelSpec, n: float, width: int, rep: int = 1) -> float:
    """What one RMSNorm over ``width`` features of ``n`` tokens keeps in eager mode beyond a fused
    kernel's input: its fp32 input (``x.float()``; for fp32 activations the input itself, and then
    the normalized copy instead) and its fp32 reciprocal RMS, ``(4·width + 4)·n / rep`` bytes
    (``rep`` = t for a sequence-parallel norm). torch's LayerNorm is one native op that keeps its
    input and statistics, as a fused kernel does: 0."""
    return (4 * width + 4) * n / rep if model.norm == "rmsnorm" else 0.0


def eager_activation_items(
    model: ModelSpec, n: float, tp: int, sequence_parallel: bool, act_bytes: int, moe: bool = False,
) -> list[tuple[str, float, str]]:
    """What a layer's eager PyTorch modules keep beyond the fused kernels' list, per GPU for ``n``
    tokens (all of class ``layer``): the norms' fp32 tensors (:func:`eager_norm_bytes`; the
    attention's norm, MLA's latent norms, the MLP's, and Gemma's post-norms), and SiLU's output for
    the gated product, ``n·f/t·e`` (``n·k·f_e/t·e`` and the shared expert's in an MoE layer)."""
    rep = tp if sequence_parallel else 1
    items = [("eager_norm1", eager_norm_bytes(model, n, model.hidden, rep), "layer")]
    if model.is_mla:
        latent = eager_norm_bytes(model, n, model.kv_lora_rank) + (eager_norm_bytes(model, n, model.q_lora_rank) if model.q_lora_rank else 0.0)
        items.append(("eager_latent_norms", latent, "layer"))
    after = 1 if model.norms_per_layer == 2 else 3  # Gemma: post-attention, pre- and post-MLP norms
    items.append(("eager_norm2", after * eager_norm_bytes(model, n, model.hidden, rep), "layer"))
    if model.gated_mlp:
        if moe:
            width = model.experts_per_token * model.expert_ffn_hidden + model.shared_expert_ffn_hidden
        else:
            width = model.ffn_hidden
        items.append(("eager_silu_output", n * width / tp * act_bytes, "layer"))
    return [item for item in items if item[1]]


def moe_activation_items(model: ModelSpec, n: float, tp: int, e: int) -> list[tuple[str, float, str]]:
    """What a mixture-of-experts MLP keeps for its backward, per GPU for ``n`` tokens (balanced,
    dropless routing: the GPU's experts receive as many token copies, n·k, as it sends): the
    router's fp32 probabilities ``4·n·E``, the permuted expert inputs ``n·k·h·e`` (all-gathered
    over TP, as Megatron-Core's dispatcher hands them to expert-TP ranks), the experts' hidden
    activations ``(3|2)·n·k·f_e/t·e``, their outputs before the weighted combine ``n·k·h·e``
    (the routing weights' gradient needs them), and the shared expert's hidden activations
    ``(3|2)·n·f_s/t·e`` (Megatron-Core MoE; Korthikanti et al. 2022's method applied to the
    layer's tensors)."""
    k, h, per = model.experts_per_token, model.hidden, (3 if model.gated_mlp else 2)
    items = [
        ("router_probs", 4 * n * model.n_experts, "layer"),
        ("expert_inputs", n * k * h * e, "layer"),
        ("expert_hidden", per * n * k * (model.expert_ffn_hidden / tp) * e, "layer"),
        ("expert_outputs", n * k * h * e, "layer"),
    ]
    if model.shared_expert_ffn_hidden:
        items.append(("shared_expert_hidden", per * n * (model.shared_expert_ffn_hidden / tp) * e, "layer"))
    return items


def mlp_backward_gradient_bytes(
    model: ModelSpec, n: float, tp: int, sequence_parallel: bool, act_bytes: int,
    moe: bool = False, gemm_input_bytes: float | None = None,
) -> float:
    """The gradients a layer's backward holds at its peak, beyond the activations it saved: at the
    MLP's activation backward, per GPU for ``n`` tokens,

        G = n·h·e/rep + (k + 1)·n·f/t·e − n·f/t·e_in

    * ``n·h·e/rep`` — the gradient of the layer's output, which the residual's backward holds
      until the MLP branch has returned its own (÷t under SP: the reduce-scattered output);
    * ``(k + 1)·n·f/t·e`` — the down-projection's input gradient and, computed from it while it
      is alive, the activation's input gradients: k = 2 for a gated MLP (gate and up, from
      ``d(silu(g)·u)``), k = 1 for GeLU;
    * ``− n·f/t·e_in`` — the down-projection's saved input (``e_in`` its bytes per element: 1 for
      Transformer Engine's FP8 copy), freed once that GEMM's backward has run.

    For a mixture-of-experts MLP f/t is the wider of the routed experts' n·k·f_e/t token copies
    (one grouped GEMM over the local experts) and the shared expert's n·f_s/t: their backwards run
    one after the other. The attention's backward comes later, with the MLP's tensors freed.

    Measured: torch 2.13 on the CPU, a tiny Llama block in fp32 under full recompute (h 256,
    f 512, n 1,024): the live tensors at the backward's peak are, besides the rebuilt layer less
    the down-projection's input, exactly n·h·4 + 3·n·f·4 = 7,340,032 bytes of gradients (the
    ``aten.mul`` of SwiGLU's backward), MemTracker's "Temp" at the peak (tests/test_verify_memory.py,
    ``test_full_recompute_layer_moment_holds_the_mlp_backward_gradients``)."""
    e = act_bytes
    e_in = e if gemm_input_bytes is None else gemm_input_bytes
    rep = tp if sequence_parallel else 1
    k = 2 if model.gated_mlp else 1
    if moe:
        width = max(n * model.experts_per_token * model.expert_ffn_hidden, n * model.shared_expert_ffn_hidden) / tp
        e_in = e  # the experts' hidden activations are kept in 16 bits (moe_activation_items)
    else:
        width = n * model.ffn_hidden / tp
    return n * model.hidden * e / rep + (k + 1) * width * e - width * e_in


def layer_activations(
    model: ModelSpec,
    micro_batch: int,
    seq_len: int,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    attention: str = "flash",
    act_bytes: int = 2,
    moe: bool = False,
    gemm_input_bytes: float | None = None,
    kernels: str = "fused",
) -> LayerActivations:
    """Bytes one layer stores per micro-batch on one GPU under ``recompute`` (table above);
    ``moe`` for a mixture-of-experts layer; ``gemm_input_bytes`` as in
    :func:`layer_activation_items`.

    ``working`` is the layer's transient peak in its backward beyond what it stores: what
    recompute rebuilds (W_r: the core under selective, what op-level checkpointing did not keep,
    under full the whole layer but its input, which the checkpoint kept and the rebuilt layer
    reads), with the gradients of the MLP's backward G (:func:`mlp_backward_gradient_bytes`),
    and, with context parallelism on the torch stacks (``kernels`` compiled or eager), the ring
    attention backward's buffers B_ring (:func:`meshplan.cost.cp_exchange.ring_backward_buffer_bytes`).
    Those come in the attention's backward, after the MLP's (and its norms') tensors M have been
    freed:

        working = max(W_r + G, W_r + B_ring − M)"""
    items = layer_activation_items(
        model, micro_batch, seq_len, tp, cp, sequence_parallel, attention, act_bytes, moe, gemm_input_bytes, kernels
    )
    full = sum(b for _, b, _ in items)
    n = micro_batch * seq_len / cp
    ring = ring_backward_buffer_bytes(model, n, tp, act_bytes, kernels, cp)
    mlp_side = sum(b for name, b, _ in items if name in MLP_SIDE_ITEMS)
    grads = mlp_backward_gradient_bytes(model, n, tp, sequence_parallel, act_bytes, moe, gemm_input_bytes)

    def layer(stored: float, rebuilt: float, kept: list[tuple[str, float]]) -> LayerActivations:
        at_mlp, at_ring = rebuilt + grads, rebuilt + ring - mlp_side
        return LayerActivations(stored, max(at_mlp, at_ring), tuple(kept), grads if at_mlp >= at_ring else 0.0)
    if recompute == "none":
        return layer(full, 0.0, [(name, b) for name, b, _ in items])
    if recompute == "selective":
        core = sum(b for _, b, cls in items if cls == "core")
        return layer(full - core, core, [(name, b) for name, b, cls in items if cls != "core"])
    rep = tp if sequence_parallel else 1
    layer_input = n * model.hidden * act_bytes / rep
    if recompute == "op":
        kept = [("layer_input", layer_input)] + op_sac_saved(model, micro_batch, seq_len, tp, cp, act_bytes, kernels)
        stored = sum(b for _, b in kept)
        # the backward rebuilds what was not kept, from the layer input; a residual-bound matmul
        # output SAC keeps is not among the layer's own saved tensors (the full list)
        bound = residual_bound_matmuls(model)
        beyond = sum(b for name, b in kept if name.removesuffix("_output") in bound)
        return layer(stored, full - (stored - beyond) + layer_input, kept)
    # the checkpoint kept the layer input, which the rebuilt layer reads (its first norm's input)
    return layer(layer_input, full - layer_input, [("layer_input", layer_input)])


def saved_gemm_input_bytes(compute_dtype: str, kernels: str, act_bytes: int, fp8_linears: str = "auto") -> float:
    """Bytes per element of a tensor a layer saves only as a GEMM input: 1 for Transformer Engine's
    FP8 GEMMs (:func:`meshplan.specs.plan.fp8_library_of` the stack and ``fp8_linears``), which
    keep the FP8 copy they cast in forward (module docstring), else the activation's ``act_bytes``
    (torchao's Float8Linear keeps the 16-bit input)."""
    te = fp8_library_of(kernels, fp8_linears) == "transformer-engine"
    return 1 if (compute_dtype == "fp8" and te) else act_bytes


#: Matmuls whose output only feeds the residual add (or, under TP, the reduction before it): no
#: backward formula reads it (an add's backward does not need its inputs, nor does a reduction's).
RESIDUAL_BOUND_MATMULS = frozenset({"o", "down", "fc2"})


def residual_bound_matmuls(model: ModelSpec) -> frozenset[str]:
    """:data:`RESIDUAL_BOUND_MATMULS`, or none for a layer with post-norms (Gemma 2/3's four norms
    a layer), where the attention and MLP outputs go through a norm whose backward reads them."""
    return RESIDUAL_BOUND_MATMULS if model.norms_per_layer == 2 else frozenset()


def op_sac_saved(model: ModelSpec, micro_batch: int, seq_len: int, tp: int, cp: int, act_bytes: int,
                 kernels: str = "fused") -> list[tuple[str, float]]:
    """What torchtitan's op-level selective checkpointing keeps besides the layer input: the
    outputs of every other matmul in forward order (q, v, gate, down for Llama; column-parallel
    outputs split t ways, row-parallel ones full width before their reduction) and of the
    attention kernel (its output and fp32 log-sum-exp); everything else is recomputed.

    Eager (and the ``fused`` default), torch's SAC caches the output of every op its policy marks
    MUST_SAVE, needed or not. Under ``torch.compile`` (``kernels`` compiled) AOTAutograd's
    partitioner saves only what the backward graph reads, so the down projection's output, which
    only the residual add consumes (:func:`residual_bound_matmuls`), is not kept: n·h·e less per
    layer. Measured on torch 2.13 (CPU), a torchtitan Llama block under torchtitan's policy keeps
    exactly this list eager and this list less the down projection's output compiled
    (tests/test_eager_activations.py)."""
    n = micro_batch * seq_len / cp
    e = act_bytes
    a_r = model.n_heads / tp
    shapes = matmuls_per_rank(model, tp)
    dropped = residual_bound_matmuls(model) if kernels == "compiled" else frozenset()
    kept = [(f"{name}_output", n * shapes[name][1] * e) for name, _, _ in layer_matmuls(model)[0::2] if name not in dropped]
    kept.append(("attention_output", n * a_r * model.head_dim * e))
    kept.append(("flash_softmax_stats", 4 * n * a_r))
    return kept


def embedding_activation_bytes(model: ModelSpec, micro_batch: int, seq_len: int, tp: int, cp: int, sp: bool) -> float:
    """First stage, outside the layers: the embedding dropout mask (n·h bytes) when dropout is on;
    the embedding output itself is layer 0's input and counted there."""
    rep = tp if sp else 1
    return micro_batch * seq_len / cp * model.hidden / rep if model.dropout else 0.0


def compiled_loss(loss_kernels: str, tp: int) -> bool:
    """Whether the cross-entropy runs as one compiled graph: ``loss_kernels`` (the plan's
    :attr:`~meshplan.specs.plan.TrainingPlan.loss_kernels`) is "compiled" and there is no TP.
    Under TP torchtitan runs the loss in ``loss_parallel``'s DTensor handlers, whose eager
    figures meshplan keeps (their compiled buffers were not measured)."""
    return loss_kernels == "compiled" and tp == 1


def head_activation_bytes(
    model: ModelSpec, micro_batch: int, seq_len: int, tp: int, cp: int, sp: bool, act_bytes: int,
    loss_kernels: str = "fused", kernels: str = "fused",
) -> float:
    """Last stage, outside the layers: final-norm input and LM-head input (n·h·e each, ÷t with SP)
    and what the loss keeps for its backward, with n = b·s/c tokens and V/t vocabulary entries
    per GPU (V padded to a multiple of t). On the torch stacks (``kernels`` compiled or eager) the
    final norm runs eager (torchtitan compiles the transformer blocks only) and keeps its fp32
    tensors (:func:`eager_norm_bytes`), and under SP the LM head saves the input torch gathered,
    n·h·e (the layers' column-parallel linears do the same, module docstring). The loss keeps:

    * the fp32 logits (or softmax), 4·n·V/t (Korthikanti et al. 2022, Sec. 4.3; torch's eager
      ``cross_entropy`` saves its fp32 log-softmax output, the same bytes);
    * a compiled loss (:func:`compiled_loss`) saves only its e-byte input logits, e·n·V (its two
      fp32 numbers per token, 8·n bytes, 8/(e·V) of that, are left out): AOTAutograd's
      partitioner recomputes the upcast and the softmax in the backward rather than keep fp32
      tensors (torch 2.13 on CPU: the saved tensors of ``torch.compile(cross_entropy)`` are the
      bf16 logits, the labels and two (n, 1) fp32 statistics; tests/test_compiled_loss.py)."""
    n = micro_batch * seq_len / cp
    rep = tp if sp else 1
    torch_stack = kernels != "fused"
    norm = n * model.hidden * act_bytes / rep + (eager_norm_bytes(model, n, model.hidden, rep) if torch_stack else 0.0)
    head_input = n * model.hidden * act_bytes / (1 if torch_stack else rep)
    per_entry = act_bytes if compiled_loss(loss_kernels, tp) else 4
    return norm + head_input + per_entry * _logit_entries(model, micro_batch, seq_len, tp, cp)


def loss_grad_bytes(
    model: ModelSpec, micro_batch: int, seq_len: int, tp: int, cp: int, kernels: str = "fused", act_bytes: int = 2,
) -> float:
    """Transient fp32 buffers of the loss's backward on the last stage, besides the fp32 logits
    (or softmax) the loss keeps (:func:`head_activation_bytes`), with n = b·s/c tokens and V/t
    vocabulary entries per GPU:

    * fused — Megatron's vocab-parallel cross-entropy keeps the fp32 softmax and turns it into
      the logits' gradient in place: one more ``4·n·V/t`` buffer for the gradient cast back
      through the LM head (Korthikanti et al. 2022, Sec. 4.3; ``fused_vocab_parallel_cross_entropy``);
    * compiled, eager — torch's ``cross_entropy`` on fp32 logits saves the log-softmax output;
      its backward holds the incoming gradient (from ``nll_loss``) and the outgoing one at once:
      ``8·n·V/t`` (torchtitan computes the loss outside the compiled blocks);
    * compiled, eager with t > 1 — torchtitan runs the loss under torch's ``loss_parallel`` on
      the vocabulary-sharded logits, whose fused nll-loss + log-softmax backward
      (``torch/distributed/tensor/parallel/loss.py``, ``_nll_loss_and_log_softmax_backward``:
      ``grad_input = torch.zeros_like(x)`` … ``return (grad_input + torch.exp(x)) * grad_output``)
      holds beside the saved log-softmax ``x`` the zeroed ``grad_input``, ``exp(x)`` or the
      product, and the sum: ``12·n·V/t`` (torch's MemTracker on this backward: 4 fp32 logits-sized
      tensors at its peak with ``loss_parallel``, 3 without);
    * a compiled loss (:func:`compiled_loss`: ``kernels`` is the plan's ``loss_kernels``) fuses
      its backward into one kernel that reads the saved e-byte logits and writes their e-byte
      gradient: ``e·n·V/t``, no fp32 buffer (torch 2.13 on CPU, peak resident memory of the
      backward: +2·n·V bytes compiled against +12·n·V eager, of which 4·n·V is the kept
      log-softmax; tests/test_compiled_loss.py)."""
    entries = _logit_entries(model, micro_batch, seq_len, tp, cp)
    if compiled_loss(kernels, tp):
        return act_bytes * entries
    per = 4 * entries
    return per if kernels == "fused" else (3 * per if tp > 1 else 2 * per)


def _logit_entries(model: ModelSpec, micro_batch: int, seq_len: int, tp: int, cp: int) -> float:
    """Logits per GPU: n = b·s/c tokens times V/t vocabulary entries (V padded to a multiple of t)."""
    return micro_batch * seq_len / cp * (padded_vocab(model, tp) // tp)


def freed_logits_block_bytes(
    model: ModelSpec, micro_batch: int, seq_len: int, tp: int, cp: int, kernels: str = "fused", act_bytes: int = 2,
) -> float:
    """Reserved, not allocated, at the loss's backward: the block of the LM head's e-byte logits
    (e·n·V/t bytes), which torch's eager ``cross_entropy`` on ``logits.float()`` (``kernels``
    compiled or eager, the loss not compiled: :func:`compiled_loss`) leaves between its fp32
    tensors and which the caching allocator keeps but cannot use.

    torchtitan's loss casts the logits up (P, e·n·V/t), takes the log-softmax (L, 4·n·V/t) and frees
    the cast once the loss is known and the logits before the backward (``del pred``): P and the
    cast merge into one free block of (4 + e)·n·V/t. The backward's first fp32 request (nll-loss's
    gradient, or ``loss_parallel``'s zeroed ``grad_input``) takes 4·n·V/t of it; the next finds
    only e·n·V/t free and the segment grows, so the reserved peak is the allocated one plus
    e·n·V/t. torch's CPU allocator trace of both losses, replayed through a model of the CUDA
    caching allocator with expandable segments (:mod:`meshplan.verify.allocator`), shows that block
    exactly; with fp32 logits (e = 4) the cast is the logits themselves and the first request
    reuses their block: 0. Megatron's fused loss (``fused``) casts in place and a compiled loss
    keeps no fp32 tensor: 0."""
    if kernels == "fused" or compiled_loss(kernels, tp) or act_bytes >= 4:
        return 0.0
    return act_bytes * _logit_entries(model, micro_batch, seq_len, tp, cp)


def held_logits_bytes(model: ModelSpec, micro_batch: int, seq_len: int, tp: int, cp: int, act_bytes: int = 2,
                      loss_kernels: str = "fused") -> float:
    """The last stage's output as torch.distributed.pipelining holds it to the micro-batch's backward,
    beyond what :func:`head_activation_bytes` counts: the logits O
    (:func:`logits_output_bytes`), or nothing when a compiled loss already saves them as its input
    (:func:`compiled_loss`: the same tensor)."""
    return 0.0 if compiled_loss(loss_kernels, tp) else logits_output_bytes(model, micro_batch, seq_len, tp, cp, act_bytes)


def logits_output_bytes(model: ModelSpec, micro_batch: int, seq_len: int, tp: int, cp: int, act_bytes: int = 2) -> float:
    """O = e·n·V/t: the last pipeline stage's output for one micro-batch, the LM head's e-byte logits
    (n = b·s/c tokens, V/t vocabulary entries per GPU: torchtitan's head returns its
    vocabulary-sharded logits under ``loss_parallel``), which torch.distributed.pipelining's last
    stage appends to ``output_chunks`` in every forward when the plan returns outputs
    (``pp_return_outputs``; :func:`meshplan.cost.compose.rank_other_items`)."""
    return act_bytes * _logit_entries(model, micro_batch, seq_len, tp, cp)
