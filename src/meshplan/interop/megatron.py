"""Megatron-LM: the argument list of ``pretrain_gpt.py`` (``megatron/training/arguments.py``).

The export is a ``torchrun`` command: the launcher's ``--nnodes`` × ``--nproc-per-node`` is the
world size, the one thing Megatron does not take as an argument (data parallelism is
``world / (tp · cp · pp)``); then the model shape and the plan. Data, tokenizer, learning-rate
and checkpoint arguments are the user's.

Mapping (plan field → argument; what cannot be expressed warns on stderr):

* tp, pp, cp, ep → ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
  ``--context-parallel-size``, ``--expert-model-parallel-size``; dp → the launcher's world size.
* vpp → ``--num-layers-per-virtual-pipeline-stage`` (layers divide evenly) or the layout below;
  schedules: 1F1B and interleaved 1F1B only (GPipe, ZB-H1, interleaved zero bubble and ZBV warn
  and export as the 1F1B of the same number of chunks). The pipeline runs dependency-driven: a
  lockstep plan (pipeline_runtime, torch's multi-stage runtime of 2024) warns.
* layer_split → ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``
  when only the end stages differ, else ``--pipeline-model-parallel-layout`` (``E`` embedding,
  ``t`` layer, ``L`` loss, ``|`` between virtual stages in pipeline order).
* micro_batch, global_batch, seq_len → ``--micro-batch-size``, ``--global-batch-size``,
  ``--seq-length``.
* recompute: selective → ``--recompute-granularity selective``; full → ``--recompute-granularity
  full --recompute-method uniform --recompute-num-layers 1``, and with recompute_layers N
  ``--recompute-method block --recompute-num-layers N`` (the first N layers of each virtual stage);
  op (torchtitan's) warns, exported as selective.
* sequence_parallel → ``--sequence-parallel``; tp_comm_overlap → ``--tp-comm-overlap`` (Transformer
  Engine's userbuffers, ``tp_overlap_kind = "userbuffers"``).
* zero: 1 → ``--use-distributed-optimizer``; 2 / 3 → ``--use-megatron-fsdp
  --data-parallel-sharding-strategy optim_grads`` / ``optim_grads_params``; dp_shard →
  ``--num-distributed-optimizer-instances dp / dp_shard``.
* overlap_grad_reduce, overlap_param_gather → ``--overlap-grad-reduce``, ``--overlap-param-gather``.
* precision: bf16 → ``--bf16`` (Megatron keeps fp32 main gradients and fp32 master weights);
  fp16 → ``--fp16`` (+ ``--accumulate-allreduce-grads-in-fp32`` for fp32 gradients); fp8 →
  ``--bf16 --fp8-format hybrid`` (Transformer Engine's FP8 linears: ``fp8_linears`` torchao
  warns); other recipes warn. optimizer sgd → ``--optimizer sgd``.
* attention: materialized → ``--attention-backend unfused``; attention_kernel flash2 →
  ``--attention-backend flash``, cudnn → ``fused`` (cuDNN's fused attention), auto → no flag
  (Megatron's ``auto`` lets Transformer Engine choose: cuDNN on Hopper).
* kernels: Megatron-LM runs Megatron-Core/Transformer Engine fused kernels and its fused
  vocab-parallel cross-entropy, meshplan's ``fused`` (no flag; read back so); compiled and eager
  warn and export as fused.
* rank_order: tp,cp,dp,pp (Megatron's default) or tp,cp,pp,dp (``--use-tp-pp-dp-mapping``).
* Model: ``--num-layers --hidden-size --ffn-hidden-size --num-attention-heads
  --group-query-attention --num-query-groups --kv-channels --max-position-embeddings
  --vocab-size --swiglu --squared-relu --normalization --position-embedding-type
  --untie-embeddings-and-output-weights --disable-bias-linear --add-qkv-bias --attention-dropout
  --hidden-dropout``, ``--qk-layernorm``; mixture of experts: ``--num-experts
  --moe-router-topk --moe-ffn-hidden-size --moe-shared-expert-intermediate-size
  --moe-shared-expert-gate --moe-layer-freq`` (a 0/1 list when some layers are dense); MLA:
  ``--multi-latent-attention --q-lora-rank --kv-lora-rank --qk-head-dim`` (the non-rotary part,
  d − d_r, as Megatron-Core's ``MLATransformerConfig`` defines it) ``--qk-pos-emb-head-dim
  --v-head-dim``. GeGLU and plain ReLU MLPs, parallel residuals, bias on the output and MLP linears
  without bias on q/k/v, and Gemma's post-norms cannot be expressed.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Optional

from meshplan.errors import InputError
from meshplan.interop import shell
from meshplan.interop.common import (
    DEFAULT_RANK_ORDER, Ledger, ParseResult, arg_pairs, arg_tokens, as_int, choice,
    dependency_pipeline, effective_split, fp8_all_gather, fp8_library, fsdp_root_unit, grad_accumulation, pipeline_messages,
    single_values, stage_buffers, tp_backward,
)
from meshplan.pipeline.stages import check_split, default_layer_split
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan

FORMAT = "megatron"
SOURCE = "NVIDIA/Megatron-LM megatron/training/arguments.py"
#: meshplan schedule → (schedule Megatron runs instead, or None when it has it)
NEAREST = {"gpipe": "1f1b", "zbh1": "1f1b", "interleaved-zb": "interleaved", "zbv": "interleaved"}
SHARDING = {2: "optim_grads", 3: "optim_grads_params"}
PP_DP_ORDER = ("tp", "cp", "pp", "dp")
#: meshplan's attention kernels as Megatron-LM's ``--attention-backend`` (AttnBackend) names them
ATTENTION_BACKEND = {"flash2": "flash", "cudnn": "fused"}
#: ModelSpec.mlp -> Megatron-LM's activation flag (GeLU is its default, no flag)
MLP_FLAGS = {"swiglu": "--swiglu", "relu2": "--squared-relu"}


def _layout(split: tuple[int, ...]) -> str:
    """``--pipeline-model-parallel-layout`` of a split: "E" and "L" mark the embedding and the loss,
    an empty end stage is "E" or "L" alone, and a run of equal inner stages is written once,
    "(t|)*126" as in Megatron-LM's own examples ("Et|(tt|)*30L")."""
    stage = lambda n: "t" * n if n <= 4 else "t*%d" % n  # noqa: E731
    if len(split) == 1:
        return "E" + stage(split[0]) + "L"
    inner, runs = split[1:-1], []
    for n in inner:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    middle = "".join(f"({stage(n)}|)*{k}" if k > 1 else f"{stage(n)}|" for n, k in runs)
    return "E" + stage(split[0]) + "|" + middle + stage(split[-1]) + "L"


def _model_args(model: ModelSpec, plan: TrainingPlan, led: Ledger) -> list[tuple[str, Optional[str]]]:
    m = model
    a: list[tuple[str, Optional[str]]] = [
        ("--num-layers", str(m.n_layers)), ("--hidden-size", str(m.hidden)),
        ("--ffn-hidden-size", str(m.ffn_hidden)), ("--num-attention-heads", str(m.n_heads)),
    ]
    if m.n_kv_heads != m.n_heads:
        a += [("--group-query-attention", None), ("--num-query-groups", str(m.n_kv_heads))]
    if m.hidden % m.n_heads or m.head_dim != m.hidden // m.n_heads:
        a.append(("--kv-channels", str(m.head_dim)))
    a += [("--seq-length", str(plan.seq_len)), ("--max-position-embeddings", str(m.max_position)),
          ("--vocab-size", str(m.vocab_size))]
    if m.mlp in MLP_FLAGS:
        a.append((MLP_FLAGS[m.mlp], None))
    elif m.mlp != "gelu":
        led.lose("model.mlp", f"Megatron-LM has no {m.mlp} MLP flag (--swiglu, --squared-relu or the default GeLU); exported as GeLU")
    a.append(("--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"))
    a.append(("--position-embedding-type", "rope" if m.position == "rope" else "learned_absolute"))
    if not m.tied_embeddings:
        a.append(("--untie-embeddings-and-output-weights", None))
    if not m.linear_bias:
        a.append(("--disable-bias-linear", None))
        if m.qkv_bias:
            a.append(("--add-qkv-bias", None))
    elif not m.qkv_bias:
        led.lose("model.qkv_bias", "Megatron-LM's bias on the linear layers includes q/k/v; exported with it")
    drop = "0.1" if m.dropout else "0.0"
    a += [("--attention-dropout", drop), ("--hidden-dropout", drop)]
    if m.parallel_residual:
        led.lose("model.parallel_residual", "Megatron-LM's GPT has no parallel residual; exported sequential")
    if m.qk_norm:
        a.append(("--qk-layernorm", None))
    if m.norms_per_layer == 4:
        led.lose("model.norms_per_layer", "Megatron-LM's GPT has no post-attention / post-MLP norms (Gemma 2/3); exported without them")
    return a + _moe_mla_args(m)


def _moe_mla_args(m: ModelSpec) -> list[tuple[str, Optional[str]]]:
    """Megatron-Core's mixture-of-experts and multi-latent-attention arguments of ``m``."""
    a: list[tuple[str, Optional[str]]] = []
    if m.is_moe:
        # the all-to-all dispatcher meshplan prices (Megatron-Core's default is allgather) and the
        # experts' GEMMs grouped, as Megatron-Core's MoE guide runs them
        a += [("--num-experts", str(m.n_experts)), ("--moe-router-topk", str(m.experts_per_token)),
              ("--moe-ffn-hidden-size", str(m.expert_ffn_hidden)), ("--moe-token-dispatcher-type", "alltoall"),
              ("--moe-grouped-gemm", None)]
        if m.shared_expert_ffn_hidden:
            a.append(("--moe-shared-expert-intermediate-size", str(m.shared_expert_ffn_hidden)))
        if m.shared_expert_gate:
            a.append(("--moe-shared-expert-gate", None))
        if m.dense_layers:
            a.append(("--moe-layer-freq", "[" + ",".join("1" if x else "0" for x in m.moe_layers) + "]"))
    if m.is_mla:
        a.append(("--multi-latent-attention", None))
        if m.q_lora_rank:
            a.append(("--q-lora-rank", str(m.q_lora_rank)))
        a += [("--kv-lora-rank", str(m.kv_lora_rank)), ("--qk-head-dim", str(m.head_dim - m.qk_rope_head_dim)),
              ("--qk-pos-emb-head-dim", str(m.qk_rope_head_dim)), ("--v-head-dim", str(m.value_head_dim))]
    return a


def parse_layer_freq(text: str, n_layers: int) -> tuple[int, ...]:
    """Dense layer indices of ``--moe-layer-freq``: an integer N (layer i is MoE when i % N == 0,
    Megatron-Core's rule) or a 0/1 pattern, as a list (``[0,1,1]``) or Megatron's list expression
    (``([0]*3+[1]*58)``)."""
    body = text.strip().strip("'\"").strip()
    if body.isdigit():
        freq = int(body)
        if freq < 1:
            raise InputError("moe-layer-freq", f"must be a positive integer or a 0/1 list (got {text!r})")
        return tuple(i for i in range(n_layers) if i % freq)
    if body.startswith("(") and body.endswith(")"):
        body = body[1:-1]
    flags: list[int] = []
    for term in body.replace(" ", "").split("+"):
        items, _, times = term.partition("]*")
        items = items.rstrip("]")
        if not items.startswith("[") or (times and not times.isdigit()):
            raise InputError("moe-layer-freq", f"must be an integer or a 0/1 list such as [0]*3+[1]*58 (got {text!r})")
        values = items[1:].split(",")
        if any(v not in ("0", "1") for v in values):
            raise InputError("moe-layer-freq", f"entries must be 0 (dense) or 1 (MoE) (got {text!r})")
        repeat = int(times) if times else 1
        if len(flags) + len(values) * repeat > n_layers:  # refused before the list is built
            raise InputError("moe-layer-freq", f"gives more entries than the {n_layers} layers (got {text!r})")
        flags += [int(v) for v in values] * repeat
    if len(flags) != n_layers:
        raise InputError("moe-layer-freq", f"has {len(flags)} entries for {n_layers} layers")
    return tuple(i for i, x in enumerate(flags) if not x)


def export(model: ModelSpec, plan: TrainingPlan, gpus_per_node: int = 8) -> Any:
    led = Ledger()
    p = plan
    gpus = p.num_gpus
    per_node = min(gpus_per_node, gpus) if gpus % min(gpus_per_node, gpus) == 0 else 1
    a = _model_args(model, p, led)
    a += [("--tensor-model-parallel-size", str(p.tp)), ("--pipeline-model-parallel-size", str(p.pp)),
          ("--context-parallel-size", str(p.cp))]
    if p.ep > 1:
        a.append(("--expert-model-parallel-size", str(p.ep)))

    schedule, vpp = p.schedule, p.vpp
    if schedule in NEAREST:
        led.lose("schedule", f"Megatron-LM has no {schedule} schedule; exported as {NEAREST[schedule]} with {vpp} chunk(s) per rank")
    dependency_pipeline(p, led, "Megatron-LM")
    tp_backward(p, led, "Megatron-Core", native=True)
    pipeline_messages(p, led, "Megatron-Core", native=False)
    if p.stack.grad_accumulation != "buffer":  # buffer: --no-gradient-accumulation-fusion, below
        grad_accumulation(p, led, "Megatron-LM", native="fused")
    fsdp_root_unit(p, led, "Megatron-LM")
    fp8_all_gather(p, led, "Megatron-LM")
    fp8_library(p, led, "Megatron-LM", "transformer-engine")
    stage_buffers(p, led, "Megatron-LM", "in-flight")
    split = effective_split(model, p)
    n_stages = p.pp * vpp
    even = model.n_layers % n_stages == 0 and split == (model.n_layers // n_stages,) * n_stages
    if p.pp > 1 or vpp > 1:
        if even:
            if vpp > 1:
                a.append(("--num-layers-per-virtual-pipeline-stage", str(model.n_layers // n_stages)))
        elif vpp == 1 and p.pp > 1 and len(set(split[1:-1])) <= 1 and min(split[0], split[-1]) >= 1:
            a += [("--decoder-first-pipeline-num-layers", str(split[0])),
                  ("--decoder-last-pipeline-num-layers", str(split[-1]))]
        else:
            a.append(("--pipeline-model-parallel-layout", _layout(split)))

    a += [("--micro-batch-size", str(p.micro_batch)), ("--global-batch-size", str(p.global_batch))]
    if p.recompute in ("selective", "op"):
        if p.recompute == "op":
            led.lose("recompute", "Megatron-LM has no op-level selective recompute (torchtitan's); exported as selective (the attention core)")
        a.append(("--recompute-granularity", "selective"))
    elif p.recompute == "full" and p.recompute_layers is not None:
        a += [("--recompute-granularity", "full"), ("--recompute-method", "block"), ("--recompute-num-layers", str(p.recompute_layers))]
    elif p.recompute == "full":
        a += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", "1")]
    if p.sequence_parallel and p.tp > 1:
        a.append(("--sequence-parallel", None))
    if p.stack.tp_comm_overlap and p.tp > 1:
        a.append(("--tp-comm-overlap", None))
        if p.stack.tp_overlap_kind != "userbuffers":
            led.lose("tp_overlap_kind", "Megatron's --tp-comm-overlap is Transformer Engine's userbuffers overlap; exported as it")

    if p.stack.grad_accumulation == "buffer":  # the DDP hook's main_grad.add_ instead of the fused wgrad GEMM
        a.append(("--no-gradient-accumulation-fusion", None))
    if p.zero == 1:
        a.append(("--use-distributed-optimizer", None))
    elif p.zero in SHARDING:
        # validate_args: "Megatron-FSDP requires the `fsdp_dtensor` checkpointing format"
        a += [("--use-megatron-fsdp", None), ("--data-parallel-sharding-strategy", SHARDING[p.zero]),
              ("--ckpt-format", "fsdp_dtensor")]
        if p.zero == 3 and not p.stack.reshard_after_forward:
            led.lose("reshard_after_forward", "Megatron-FSDP reshards weights after forward; exported resharding")
        if p.stack.fsdp_accumulate_unsharded:
            led.lose("fsdp_accumulate_unsharded", "Megatron-FSDP reduce-scatters every micro-batch; exported so")
    if p.zero > 0 and p.dp_shard is not None and p.dp_shard != p.dp:
        a.append(("--num-distributed-optimizer-instances", str(p.dp // p.dp_shard)))
    if p.dp * p.cp > 1:
        if p.stack.overlap_grad_reduce:
            a.append(("--overlap-grad-reduce", None))
        if p.stack.overlap_param_gather and p.zero > 0:
            a.append(("--overlap-param-gather", None))

    r = p.precision
    if r.precision in ("bf16", "fp8"):
        a.append(("--bf16", None))
        if r.precision == "fp8":
            a.append(("--fp8-format", "hybrid"))
        canonical = dict(grad_dtype="fp32", master_weights=True, grad_fp32_copy=False)
    elif r.precision == "fp16":
        a.append(("--fp16", None))
        if r.grad_dtype == "fp32":
            a.append(("--accumulate-allreduce-grads-in-fp32", None))
            canonical = dict(grad_dtype="fp32", master_weights=True, grad_fp32_copy=False)
        else:
            canonical = dict(grad_dtype="fp16", master_weights=True, grad_fp32_copy=True)
    else:
        canonical = dict(grad_dtype="fp32", master_weights=True, grad_fp32_copy=False)
    for k, v in canonical.items():
        if getattr(r, k) != v and not (r.precision == "fp32" and k in ("master_weights", "grad_fp32_copy")):
            led.lose(f"precision.{k}", f"Megatron-LM with {r.precision} keeps {k} = {v}; exported so")
    if r.optimizer == "sgd":
        a.append(("--optimizer", "sgd"))
    if p.attention == "materialized":
        a.append(("--attention-backend", "unfused"))
    elif p.stack.attention_kernel != "auto":
        a.append(("--attention-backend", ATTENTION_BACKEND[p.stack.attention_kernel]))
    if p.stack.kernels != "fused":
        led.lose("kernels", f"Megatron-LM runs Megatron-Core/Transformer Engine fused kernels and its fused vocab-parallel cross-entropy, not {p.stack.kernels} ones; exported as fused")
    if tuple(p.rank_order) == PP_DP_ORDER:
        a.append(("--use-tp-pp-dp-mapping", None))
    elif tuple(p.rank_order) != DEFAULT_RANK_ORDER:
        led.lose("rank_order", "Megatron-LM orders ranks tp,cp,ep,dp,pp or (--use-tp-pp-dp-mapping) tp,cp,ep,pp,dp; exported as tp,cp,dp,pp")

    nodes = gpus // per_node
    lines = [
        f"# Megatron-LM arguments ({SOURCE}), written by meshplan for {model.name} on {gpus:,} GPUs:",
        f"# dp = {p.dp} = world size / (tp x cp x pp). Add the data, tokenizer, learning-rate and checkpoint arguments.",
        *_device_connections(p, led),
        f"torchrun --nnodes {nodes} --nproc-per-node {per_node} pretrain_gpt.py \\",
    ]
    body = [f"    {flag}" + ("" if value is None else f" {shlex.quote(value)}") for flag, value in a]
    lines += [x + " \\" for x in body[:-1]] + body[-1:]
    return led.result("\n".join(lines) + "\n")


def _device_connections(p: TrainingPlan, led: Ledger) -> list[str]:
    """The ``CUDA_DEVICE_MAX_CONNECTIONS`` line Megatron-LM's ``validate_args`` needs before Blackwell:
    TP or CP > 1 asserts it is 1 (one hardware queue, so the TP/CP communication kernels launch in
    the order they overlap compute); Megatron-FSDP asserts it is not 1 (and with TP/CP only warns
    that the two want different settings)."""
    fsdp = p.zero in SHARDING
    if fsdp:
        if p.tp > 1 or p.cp > 1:
            led.note("CUDA_DEVICE_MAX_CONNECTIONS: Megatron-FSDP needs it unset or above 1, tensor/context parallelism "
                     "wants 1 on Hopper and earlier (validate_args warns); unset here")
        return ["unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP asserts it is not 1"]
    if p.tp > 1 or p.cp > 1:
        return ["export CUDA_DEVICE_MAX_CONNECTIONS=1  # TP/CP > 1 on Hopper and earlier: validate_args asserts it"]
    return []


# ---- parse ------------------------------------------------------------------------------------------


def _unroll(layout: str) -> list[str]:
    text = layout.replace(",", "").replace(" ", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), text)
    return text.split("|")


def parse_layout(layout: str, pp: int) -> tuple[int, ...]:
    """Layers per virtual stage of a ``--pipeline-model-parallel-layout`` string."""
    stages = _unroll(layout)
    where = "pipeline-model-parallel-layout"
    flat = "".join(stages)
    if set(flat) - set("EtL"):
        raise InputError(where, f"only E, t and L are understood (got {layout!r}; MTP layers are not modelled)")
    if not flat.startswith("E") or not flat.endswith("L") or flat.count("E") != 1 or flat.count("L") != 1:
        raise InputError(where, f"must start with the embedding E and end with the loss L once each (got {layout!r})")
    if len(stages) % pp:
        raise InputError(where, f"{len(stages)} stages is not a multiple of pipeline-model-parallel-size ({pp})")
    counts = tuple(s.count("t") for s in stages)
    check_split(counts, where)
    return counts


def _flag(values: dict[str, Optional[str]], name: str) -> bool:
    if name not in values:
        return False
    if values[name] is not None:
        raise InputError(name.lstrip("-"), f"is a switch and takes no value (got {values[name]!r})")
    return True


def parse(text: str) -> ParseResult:
    pairs = arg_pairs(arg_tokens(shell.expand(text)))
    v = single_values(pairs, "Megatron-LM")
    notes: list[str] = []

    def num(name: str, default: Optional[int] = None, lo: int = 1) -> Optional[int]:
        if name not in v:
            return default
        if v[name] is not None and shell.unresolved(v[name]):
            raise InputError(name.lstrip("-"), f"is {v[name]}, a shell variable the file does not set: set it in the file "
                                               "(NAME=value) or give the value to meshplan")
        return as_int(name.lstrip("-"), v[name], lo)

    def val(name: str) -> Optional[str]:
        if name in v and v[name] is None:
            raise InputError(name.lstrip("-"), "needs a value")
        return v.get(name)

    f: dict[str, Any] = {}
    tp = num("--tensor-model-parallel-size", 1)
    pp = num("--pipeline-model-parallel-size", 1)
    cp = num("--context-parallel-size", 1)
    f.update(tp=tp, pp=pp, cp=cp, ep=num("--expert-model-parallel-size", 1))
    launcher = [v.get(k) for k in ("--nnodes", "--nproc-per-node", "--nproc_per_node")]
    nodes = num("--nnodes") if str(launcher[0]).isdigit() else None  # shell variables: unknown
    per_node = next((int(x) for x in launcher[1:] if str(x).isdigit()), None)
    if nodes is not None and per_node is not None and (nodes * per_node) % (tp * pp * cp):
        notes.append(f"dp: the launcher's world size {nodes * per_node:,} (--nnodes {nodes} x --nproc-per-node {per_node}) is not a "
                     f"multiple of tp x cp x pp = {tp * cp * pp:,}, so Megatron would not start it: give --gpus or --dp")
    elif nodes is not None and per_node is not None:
        f["dp"] = nodes * per_node // (tp * pp * cp)
    else:
        notes.append("dp: no torchrun --nnodes/--nproc-per-node in the file, so the world size is unknown (give --gpus or --dp)")

    _gpt2_vocab(v, notes)
    model = _parse_model(v, num, val, _flag)
    dispatcher = v.get("--moe-token-dispatcher-type") or "allgather"  # Megatron-Core's default
    if model is not None and model.is_moe and dispatcher != "alltoall":
        notes.append(f"ep: --moe-token-dispatcher-type {dispatcher} gathers every token to every expert rank; meshplan "
                     "prices the all-to-all dispatcher (--moe-token-dispatcher-type alltoall)")

    # pipeline chunks and split
    layout = val("--pipeline-model-parallel-layout")
    per_vstage = num("--num-layers-per-virtual-pipeline-stage")
    vstages = num("--num-virtual-stages-per-pipeline-rank")
    split: Optional[tuple[int, ...]] = None
    vpp = 1
    if layout is not None:
        split = parse_layout(layout, pp)
        vpp = len(split) // pp
        if model is not None and sum(split) != model.n_layers:
            raise InputError("pipeline-model-parallel-layout", f"has {sum(split)} layers, --num-layers says {model.n_layers}")
    elif per_vstage is not None:
        if model is None:
            raise InputError("num-layers", "is needed to read --num-layers-per-virtual-pipeline-stage")
        vpp = model.n_layers // (pp * per_vstage)
        if vpp * pp * per_vstage != model.n_layers:
            raise InputError("num-layers-per-virtual-pipeline-stage", f"{per_vstage} x pp {pp} does not divide {model.n_layers} layers")
    if vstages is not None:
        if (layout is not None or per_vstage is not None) and vstages != vpp:
            raise InputError("num-virtual-stages-per-pipeline-rank", f"{vstages} contradicts the {vpp} chunks per rank of the other pipeline arguments")
        vpp = vstages
    first, last = num("--decoder-first-pipeline-num-layers"), num("--decoder-last-pipeline-num-layers")
    if (first is not None or last is not None) and layout is None:
        if model is None:
            raise InputError("num-layers", "is needed to read --decoder-first/last-pipeline-num-layers")
        n_stages = pp * vpp
        ends = (first or 0) + (last or 0)
        inner = n_stages - (first is not None) - (last is not None)
        rest = model.n_layers - ends
        if inner < 0 or (inner and rest % inner) or (not inner and rest):
            raise InputError("decoder-first-pipeline-num-layers", f"the other {rest} layers do not split evenly over {inner} stages")
        mid = rest // inner if inner else 0
        split = tuple(([first] if first is not None else []) + [mid] * inner + ([last] if last is not None else []))
    f["vpp"] = vpp
    f["schedule"] = "interleaved" if vpp > 1 else "1f1b"
    if split is not None and model is not None and split == default_layer_split(model.n_layers, pp * vpp):
        split = None
    if split is not None:
        f["layer_split"] = split

    f["micro_batch"] = num("--micro-batch-size", 1)
    if "--rampup-batch-size" in v:
        notes.append("global_batch: --rampup-batch-size grows the batch over the first samples; planned at --global-batch-size")
    gb = num("--global-batch-size")
    if gb is not None:
        f["global_batch"] = gb
    s = num("--seq-length")
    if s is not None:
        f["seq_len"] = s

    gran = val("--recompute-granularity")
    if _flag(v, "--recompute-activations"):
        gran = gran or "selective"
    f["recompute"] = "none" if gran is None else choice("recompute-granularity", gran, {"full": "full", "selective": "selective"})
    if gran == "full" and val("--recompute-method") == "block":
        f["recompute_layers"] = num("--recompute-num-layers", 1, lo=0)  # the first N layers of each virtual stage
    elif gran == "full" and num("--recompute-num-layers", 1) != 1:
        notes.append("recompute: --recompute-method uniform with more than one layer per checkpoint read as one layer per "
                     "checkpoint (every layer recomputed; the stored inputs are fewer)")
    f["sequence_parallel"] = _flag(v, "--sequence-parallel") or tp == 1
    f["tp_comm_overlap"] = _flag(v, "--tp-comm-overlap") and tp > 1
    f["tp_backward_overlap"] = True  # Megatron-Core's linears and Transformer Engine's, always
    f["pp_scatter_gather"] = False  # Megatron-Core sends each stage message whole
    f["grad_accumulation"] = "buffer" if _flag(v, "--no-gradient-accumulation-fusion") else "fused"

    fsdp = _flag(v, "--use-megatron-fsdp")
    strategy = val("--data-parallel-sharding-strategy")
    if fsdp or (strategy not in (None, "no_shard")):
        f["zero"] = choice("data-parallel-sharding-strategy", strategy or "no_shard",
                           {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3})
    elif _flag(v, "--use-torch-fsdp2"):
        f["zero"] = 3
        f["reshard_after_forward"] = not _flag(v, "--torch-fsdp2-no-reshard-after-forward")
    elif "--zero-stage" in v:  # Megatron-DeepSpeed: DeepSpeed's ZeRO under Megatron's model
        f["zero"] = num("--zero-stage", 0, lo=0)
        if f["zero"] > 3:
            raise InputError("zero-stage", f"must be 0, 1, 2 or 3 (got {f['zero']})")
    else:
        f["zero"] = 1 if _flag(v, "--use-distributed-optimizer") else 0
    inst = num("--num-distributed-optimizer-instances", 1)
    if inst > 1 and "dp" in f:
        if f["dp"] % inst:
            raise InputError("num-distributed-optimizer-instances", f"{inst} does not divide dp ({f['dp']})")
        f["dp_shard"] = f["dp"] // inst
    f["overlap_grad_reduce"] = _flag(v, "--overlap-grad-reduce")
    f["overlap_param_gather"] = _flag(v, "--overlap-param-gather") or f["zero"] == 0

    bf16, fp16 = _flag(v, "--bf16"), _flag(v, "--fp16")
    if bf16 and fp16:
        raise InputError("bf16", "--bf16 and --fp16 contradict each other")
    prec: dict[str, Any] = {}
    if v.get("--fp8-format") is not None or "--fp8-format" in v:
        choice("fp8-format", val("--fp8-format"), {"hybrid": 1, "e4m3": 1})
        prec.update(precision="fp8", grad_dtype="bf16" if _flag(v, "--grad-reduce-in-bf16") else "fp32")
    elif bf16:
        prec.update(precision="bf16", grad_dtype="bf16" if _flag(v, "--grad-reduce-in-bf16") else "fp32")
    elif fp16:
        fp32_grads = _flag(v, "--accumulate-allreduce-grads-in-fp32")
        prec.update(precision="fp16", grad_dtype="fp32" if fp32_grads else "fp16", grad_fp32_copy=not fp32_grads)
    else:
        prec.update(precision="fp32", grad_dtype="fp32")
    opt = val("--optimizer")
    if opt is not None:
        prec["optimizer"] = choice("optimizer", opt, {"adam": "adam", "sgd": "sgd"})
    f["precision"] = prec
    backend = val("--attention-backend")
    f["attention"] = "materialized" if backend in ("unfused", "local") else "flash"
    kernel = {v: k for k, v in ATTENTION_BACKEND.items()}.get(backend or "auto")
    if kernel is not None:
        f["attention_kernel"] = kernel
    f["rank_order"] = PP_DP_ORDER if _flag(v, "--use-tp-pp-dp-mapping") else DEFAULT_RANK_ORDER
    f["kernels"] = "fused"
    if not any(name in v for name in ("--tensor-model-parallel-size", "--micro-batch-size", "--num-layers", "--global-batch-size")):
        raise InputError("plan", "no Megatron-LM parallelism, batch or model arguments in the file")
    return ParseResult(FORMAT, f, model, tuple(notes))


#: GPT-2's byte-level BPE (Radford et al. 2019): the vocabulary of Megatron's GPT2BPETokenizer
GPT2_VOCAB = 50257


def _gpt2_vocab(v: dict[str, Optional[str]], notes: list[str]) -> None:
    """A script that gives GPT-2's vocab and merge files (Megatron's GPT2BPETokenizer, which its GPT-3
    examples use) and no --vocab-size has GPT-2's 50,257 tokens: set it in ``v``, with a note."""
    kind = v.get("--tokenizer-type")
    if "--vocab-size" in v or "--vocab-file" not in v or "--merge-file" not in v or kind not in (None, "GPT2BPETokenizer"):
        return
    v["--vocab-size"] = str(GPT2_VOCAB)
    notes.append(f"vocab_size: --vocab-file with --merge-file is GPT-2's BPE, {GPT2_VOCAB:,} tokens (Megatron pads it to a "
                 "multiple of --make-vocab-size-divisible-by x tp; meshplan counts the tokens)")


def _prob(name: str, text: Optional[str]) -> float:
    if text is None:
        return 0.1  # Megatron's default dropout
    try:
        x = float(text)
    except ValueError:
        x = -1.0
    if not 0.0 <= x < 1.0:
        raise InputError(name, f"must be a probability in [0, 1) (got {text!r})")
    return x


def _parse_moe_mla(v, num, val, flag, n_layers: int) -> dict:
    """ModelSpec's expert and MLA fields from Megatron-Core's arguments (see :func:`_moe_mla_args`)."""
    out: dict = {}
    experts = num("--num-experts")
    if experts:
        out.update(n_experts=experts, experts_per_token=num("--moe-router-topk", 2),
                   expert_ffn_hidden=num("--moe-ffn-hidden-size", num("--ffn-hidden-size")),
                   shared_expert_ffn_hidden=num("--moe-shared-expert-intermediate-size", 0),
                   shared_expert_gate=flag(v, "--moe-shared-expert-gate"))
        freq = val("--moe-layer-freq")
        if freq is not None:
            out["dense_layers"] = parse_layer_freq(freq, n_layers)
    if flag(v, "--multi-latent-attention"):
        rope = num("--qk-pos-emb-head-dim", 64)
        out.update(q_lora_rank=num("--q-lora-rank", 0), kv_lora_rank=num("--kv-lora-rank", 32), qk_rope_head_dim=rope,
                   v_head_dim=num("--v-head-dim", 128), head_dim=num("--qk-head-dim", 128) + rope)
    return out


def _parse_model(v, num, val, flag) -> Optional[ModelSpec]:
    L = num("--num-layers")
    if L is None:
        return None
    for need in ("--hidden-size", "--num-attention-heads", "--vocab-size"):
        if need not in v:
            raise InputError(need.lstrip("-"), "is needed with --num-layers to read the model (Megatron takes the vocabulary from the tokenizer; give --vocab-size)")
    h, a = num("--hidden-size"), num("--num-attention-heads")
    # Megatron-DeepSpeed names the K/V heads --num-key-value-heads (Megatron-LM: --num-query-groups)
    g = num("--num-query-groups", 1) if flag(v, "--group-query-attention") else num("--num-key-value-heads", a)
    given = [m for m, f in MLP_FLAGS.items() if flag(v, f)]
    if len(given) > 1:
        raise InputError("swiglu", "and --squared-relu are exclusive: give one MLP activation")
    mlp = given[0] if given else "gelu"
    if "--quick-geglu" in v:
        raise InputError("quick-geglu", "is not modelled by meshplan")
    norm = choice("normalization", val("--normalization") or "LayerNorm", {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"})
    legacy_rope = "rope" if flag(v, "--use-rotary-position-embeddings") else None  # Megatron's pre-2024 switch
    pos = choice("position-embedding-type", val("--position-embedding-type") or legacy_rope or "learned_absolute",
                 {"learned_absolute": "learned", "rope": "rope"})
    bias = not flag(v, "--disable-bias-linear")
    drop = [_prob(n.lstrip("-"), val(n)) for n in ("--attention-dropout", "--hidden-dropout")]
    if h % a and "--kv-channels" not in v:
        raise InputError("kv-channels", f"is needed: hidden size {h} is not a multiple of {a} heads")
    from meshplan.interop.common import catalog_match

    extra = _parse_moe_mla(v, num, val, flag, L)
    spec = ModelSpec.build(
        where="model", name="megatron-model", n_layers=L, hidden=h, n_heads=a, n_kv_heads=g,
        head_dim=extra.pop("head_dim", None) or num("--kv-channels", h // a if h % a == 0 else None), ffn_hidden=num("--ffn-hidden-size", 4 * h),
        vocab_size=num("--vocab-size"), max_position=num("--max-position-embeddings", num("--seq-length", 8192)),
        mlp=mlp, norm=norm, position=pos, tied_embeddings=not flag(v, "--untie-embeddings-and-output-weights"),
        qkv_bias=bias or flag(v, "--add-qkv-bias"), linear_bias=bias, dropout=any(d > 0 for d in drop),
        qk_norm=flag(v, "--qk-layernorm"), source="Megatron-LM arguments", **extra,
    )
    name = catalog_match(spec)
    return spec.model_copy(update={"name": name}) if name else spec
