"""What context parallelism's ring attention adds to one attention kernel, forward and backward:
the merges of each later ring step's block into the running output and gradients, fused
(Transformer Engine, torch compiled) or as torch's eager element-wise ops; and the key length
at which torch's load-balanced ring runs its FlashAttention calls.
"""

from __future__ import annotations

from meshplan.cost.calibration import Calibration
from meshplan.cost.kernel_time import memory_time
from meshplan.specs.hardware import GPUSpec


def ring_attention_merge_times(
    tokens: float, heads: int, kv_heads: int, d: float, d_v: float, cp: int, e: int, gpu: GPUSpec, cal: Calibration
) -> tuple[float, float]:
    """What ring attention over ``cp`` ranks adds to one attention kernel, forward and backward.

    Each of the c − 1 later ring steps is a FlashAttention call of its own (one more kernel
    launch each way), and its result has to be folded into the running one: forward, the block's
    output O_j (n·a·d_v elements, e bytes) and log-sum-exp are merged into the fp32 running output
    by online-softmax rescaling, reading and writing it (Liu et al. 2023, "Ring Attention with
    Blockwise Transformers", Sec. 3; torch's ``_SDPAMerger.step`` in
    ``torch.distributed.tensor.experimental._attention``); backward, the block's dQ is added into
    the fp32 dQ and its dK, dV (n·g·(d + d_v) elements) into the fp32 buffers that travel the ring:

        t_fwd = (c − 1)·(t_kernel + (8 + e)·n·a·d_v / (W·η_hbm) + t_kernel)
        t_bwd = (c − 1)·(t_kernel + (8 + e)·n·(a·d + g·(d + d_v)) / (W·η_hbm) + t_kernel)

    (n local query tokens, a and g query and K/V heads on this TP rank; 8 + e bytes per element:
    fp32 read and write of the running value, e-byte read of the block's). This is one fused pass
    per step: Transformer Engine's CP kernels (``fused``), and torch's ring under torch.compile
    (``compiled``: torchtitan compiles each block whole, ring included, and Inductor fuses each
    step's element-wise merge), where g is the heads SDPA sees, a after ``repeat_kv``."""
    steps = cp - 1
    k = cal.kernel_overhead
    fwd = steps * (k + memory_time((8 + e) * tokens * heads * d_v, gpu, cal))
    bwd = steps * (k + memory_time((8 + e) * tokens * (heads * d + kv_heads * (d + d_v)), gpu, cal))
    return fwd, bwd


def torch_ring_keys(seq_len: float, cp: int) -> float:
    """The key length L at which one FlashAttention call over torch's whole ring costs what its c
    calls cost, for η(L) = η∞·L/(L + L₀) (:func:`meshplan.cost.attention.flash_attention_efficiency`).

    torch's ring (``_templated_ring_attention`` in ``torch.distributed.tensor.experimental.
    _attention``) balances the causal mask round-robin: rank r holds chunks r and 2c − 1 − r of
    the 2c chunks of s/(2c) tokens. Step 0 is one causal call over the n = s/c local queries and
    keys (1/c of the rank's causal work, L = s/c); each of the c − 1 later steps is a non-causal
    call of half a block, ``key.chunk(2)[0]`` with all n queries for i ≤ r (L = s/(2c)) or
    ``query.chunk(2)[1]`` against all n keys for i > r. Rank c − 1 takes the first branch at every
    step, and every layer waits for it (its all-gather of K/V, FSDP's collectives). With a call's
    time ∝ work·(1 + L₀/L):

        Σ_i w_i·(1 + L₀/L_i) = w·(1 + L₀·(1·c + (c − 1)·2c)/(c·s)) = w·(1 + L₀·(2c − 1)/s)

    so L = s/(2c − 1): s for c = 1, against s/c if every call saw a whole block."""
    return seq_len / (2 * cp - 1)


#: Element-wise kernels torch's eager ring launches per later step, forward (casts of O and the
#: LSE, the sigmoid merge of O in five ops, its LSE difference included, and of the LSE in three,
#: the K/V concatenation: 2 + 5 + 3 + 1) and backward (dK and dV: chunk add and concatenation
#: each; dQ add; dK|dV and K|V concatenations), and once per call (forward: K, V
#: ``.contiguous()``, the first step's two casts, the two casts back; backward: K, V
#: ``.contiguous()``, three zero buffers, step 0's three adds and concatenation, two casts back).
EAGER_RING_KERNELS = {"fwd_step": 11, "bwd_step": 7, "fwd_call": 6, "bwd_call": 11}


def eager_ring_attention_times(
    tokens: float, heads: int, kv_heads: int, d: float, d_v: float, cp: int, e: int, gpu: GPUSpec, cal: Calibration
) -> tuple[float, float]:
    """What torch's ring attention over ``cp`` ranks adds to one attention kernel in eager mode,
    forward and backward: the element-wise ops of ``_templated_ring_attention``, ``_SDPAMerger``
    and ``_templated_ring_attention_backward`` (``torch.distributed.tensor.experimental.
    _attention``, ``convert_to_f32 = True``) one kernel each, each reading its inputs and writing
    its output once. On rank c − 1 (the ``i <= rank`` branch at every step, :func:`torch_ring_keys`),
    with X_o = n·a·d_v, X_q = n·a·d and X_kv = n·g·(d + d_v) elements (n local tokens; a query
    heads, g the K/V heads SDPA sees; e-byte activations, fp32 accumulators):

    * forward, each of the c − 1 later steps: ``out.to(float32)`` (e + 4), ``out - block_out``
      (4 + 4 + 4), ``sigmoid(Δlse) * (…)`` (4 + 4), ``out - …`` (4 + 4 + 4): (36 + e)·X_o; the K/V
      concatenation for the rotation, ``torch.cat([key.flatten(), value.flatten()])``: 2e·X_kv;
    * forward, once: ``key.contiguous()``/``value.contiguous()`` (2e·X_kv), the first step's cast
      (e + 4)·X_o and the cast back in ``results()`` (4 + e)·X_o;
    * backward, each later step: dK and dV added into the first half of their fp32 buffers
      (``_partial_update``: (8 + e)/2) and concatenated back (4 + 4), the dK|dV concatenation
      that travels the ring (4 + 4), the K/V concatenation (2e): (20 + 2.5e)·X_kv; dQ added into
      the fp32 dQ: (8 + e)·X_q;
    * backward, once: ``.contiguous()`` (2e·X_kv), the three fp32 zero buffers 4·(X_q + X_kv),
      step 0's adds (8 + e)·(X_q + X_kv) and dK|dV concatenation 8·X_kv, the casts back
      (4 + e)·(X_q + X_kv).

    The LSE's n·a elements (1/d of O's) are left out. Each pass is ``memory_time`` with one launch
    per kernel (:data:`EAGER_RING_KERNELS`) plus the SDPA call of each later step:

        t_fwd = (c − 1)·(t_k + mem((36 + e)·X_o + 2e·X_kv) + 10·t_k) + mem((8 + 2e)·X_o + 2e·X_kv) + 5·t_k
        t_bwd = (c − 1)·(t_k + mem((20 + 2.5e)·X_kv + (8 + e)·X_q) + 6·t_k)
                + mem((16 + 2e)·X_q + (24 + 4e)·X_kv) + 10·t_k

    (mem(B) = B/(W·η_hbm) + t_k)."""
    if cp <= 1:
        return 0.0, 0.0
    steps = cp - 1
    k = cal.kernel_overhead
    x_o, x_q, x_kv = tokens * heads * d_v, tokens * heads * d, tokens * kv_heads * (d + d_v)
    n_k = EAGER_RING_KERNELS
    fwd = steps * (k + memory_time((36 + e) * x_o + 2 * e * x_kv, gpu, cal) + (n_k["fwd_step"] - 1) * k)
    fwd += memory_time((8 + 2 * e) * x_o + 2 * e * x_kv, gpu, cal) + (n_k["fwd_call"] - 1) * k
    bwd = steps * (k + memory_time((20 + 2.5 * e) * x_kv + (8 + e) * x_q, gpu, cal) + (n_k["bwd_step"] - 1) * k)
    bwd += memory_time((16 + 2 * e) * x_q + (24 + 4 * e) * x_kv, gpu, cal) + (n_k["bwd_call"] - 1) * k
    return fwd, bwd
