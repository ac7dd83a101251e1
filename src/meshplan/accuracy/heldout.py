"""The held-out runs: published training runs that no calibration constant was set from.

``catalog/data/heldout_runs.yaml`` lists runs gathered after the calibration was fixed, on A100
and H100, BF16 and FP8, Megatron-style stacks (NVIDIA NeMo 24.07's H100 FP8 table,
Megatron-Bridge's of 2025–26 and the DGX Cloud Benchmarking recipes' H100 BF16 and FP8 tables;
DeepSpeed + Megatron's MT-NLG 530B on A100) and FSDP-style ones
(MosaicML LLM Foundry's MPT benchmarks: PyTorch FSDP on A100 40/80 GB and H100, BF16 and FP8). They are mapped like the visible runs
(:mod:`meshplan.accuracy.runs`: same :class:`MappedRun`, same ``estimate``) and reported apart
(``meshplan validate --set held-out``), so their error measures how meshplan predicts runs it
was not compared with while its constants were chosen.

Unstated settings take the framework's documented default, recorded in each run's assumptions:

* NeMo 24.07 (Megatron-Core + Transformer Engine, the perf recipes): distributed optimizer
  (ZeRO-1) with overlapped gradient reduce-scatter and parameter all-gather; sequence parallelism
  and TP communication overlap whenever TP > 1; interleaved 1F1B when VP > 1; no activation
  recompute; FP8 GEMMs with BF16 attention (cuDNN's fused attention, Transformer Engine's choice on
  Hopper) and fp32 gradients; fused kernels.
* Megatron-Bridge (NeMo 25.11 and 26.02 containers, the perf scripts' Llama 3 / 3.1 configs):
  as NeMo 24.07, with gradients reduced in bf16 (``grad_reduce_in_fp32 = False``) and FP8 with
  current scaling (meshplan's FP8 recipe has no scaling mode: the same FP8 GEMMs); the 405B
  recipe's pipeline split, which counts the embedding and the loss as a layer each, is meshplan's
  default split for 126 layers over 64 chunks (1, 2 × 62, 1).
* DGX Cloud Benchmarking (NVIDIA's performance recipes, release 24.11: NeMo 24.09, GPT-3 on
  NeMo 24.05, Grok-1 on a NeMo development image of that era; DGX H100, eight 400 Gb/s
  InfiniBand links a node): as NeMo 24.07, with each
  workload's settings read from the recipe's ``configure.sh`` / YAML (:data:`DGXC_RECIPES`):
  the attention backend its ``NVTE_FUSED_ATTN`` picks (1: cuDNN's fused attention; 0:
  FlashAttention-2), the gradient-reduction dtype of its optimizer config, Nemotron-4 340B's
  selective recompute; the 405B runs use GPT-2's tokenizer as a proxy (50,257 tokens, padded by
  NeMo to 51,200) and NeMo's 405B config has 16 query groups; the 405B proxy columns keep the
  recipe but cut the layers (7, 21, 42) and the pipeline (1, 3, 3 stages), as Grok-1's do (2 to
  32 layers, with the recipe's own EP, CP and sequence length per column).
* MT-NLG (Megatron-DeepSpeed, 2021): DeepSpeed's 1F1B pipeline engine (no interleaving),
  ZeRO-1, full activation checkpointing, BF16 with fp32 gradients, materialized attention (no
  FlashAttention in 2021), gradients reduced after the pipeline (not overlapped), no sequence
  parallelism (2022).
* LLM Foundry (Composer, 2023): PyTorch FSDP FULL_SHARD over every GPU (no TP or PP), one
  micro-batch per gradient-accumulation step as the table lists, full activation checkpointing
  of every block where the table says so, FlashAttention (MPT's ``flash`` / ``triton``
  ``attn_impl``), PyTorch eager; mixed precision ``DEFAULT`` (amp_bf16, amp_fp8: bf16 compute,
  fp32 reduction) or ``PURE`` (bf16: bf16 reduction), fp32 parameter shards as the master copy
  and Adam's moments. The models are the LLM Foundry MPT configs, GPT-2 style by MPTConfig's
  defaults (learned positions, biases, LayerNorm, GeLU 4h, tied embeddings, vocabulary 50,368,
  no dropout): meshplan's count equals the table's NumParams on every row (tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from meshplan.accuracy.formulas import step_from_tokens_per_gpu
from meshplan.accuracy.runs import MappedRun, gpt_model, unsupported
from meshplan.catalog import load_gpu, load_model, load_stack, read_data_file
from meshplan.errors import InputError
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import PrecisionRecipe, TrainingPlan
from meshplan.specs.validate import check_plan

HELDOUT_FILE = "heldout_runs.yaml"

#: group -> publication, as the report names it
HELDOUT_SOURCES = {
    "nemo2407": "NVIDIA NeMo 24.07 performance summary, DGX-H100, FP8",
    "mbridge": "NVIDIA Megatron-Bridge performance summary (NeMo 25.11, 26.02), DGX-H100, FP8",
    "dgxc": "NVIDIA DGX Cloud Benchmarking recipes (release 24.11: NeMo 24.09 and 24.05), DGX H100, BF16 and FP8",
    "mtnlg": "Smith et al. 2022 (MT-NLG 530B, arXiv 2201.11990), Sec. 2.4",
    "llmfoundry": "MosaicML LLM Foundry MPT benchmarks (PyTorch FSDP), A100 and H100",
}

#: LLM Foundry's MPT sizes (``scripts/train/yamls/pretrain/mpt-<size>.yaml``): layers, d_model,
#: heads; expansion ratio 4, vocabulary 50,368
MPT_SIZES = {"1b": (24, 2048, 16), "3b": (32, 2560, 20), "7b": (32, 4096, 32), "13b": (40, 5120, 40),
             "30b": (48, 7168, 64), "70b": (80, 8192, 64)}
MPT_VOCAB = 50368

#: LLM Foundry's precision column: meshplan's recipe and what Composer's FSDP mixed precision does
MPT_PRECISION = {
    "amp_bf16": (PrecisionRecipe(precision="bf16", grad_dtype="fp32"),
                 "amp_bf16, FSDP mixed precision DEFAULT: bf16 compute, fp32 reduction"),
    "bf16": (PrecisionRecipe(precision="bf16", grad_dtype="bf16"),
             "bf16, FSDP mixed precision PURE: bf16 compute and reduction"),
    "amp_fp8": (PrecisionRecipe(precision="fp8", grad_dtype="fp32"),
                "amp_fp8: Transformer Engine's FP8 linears under eager PyTorch (meshplan fp8_linears "
                "transformer-engine), fp32 reduction"),
}


@dataclass(frozen=True)
class NemoRecipe:
    """One DGX Cloud Benchmarking workload: what its scripts set that meshplan's plan expresses.

    ``model_overrides`` change the catalog model to what the run built (vocabulary, query
    groups); ``grads`` is the gradient-reduction dtype; ``attention_kernel`` follows the
    recipe's ``NVTE_FUSED_ATTN`` (1 → cudnn, 0 → flash2, Transformer Engine then running the
    flash-attn package); ``notes`` say where each setting was read."""

    model: str
    grads: str
    attention_kernel: str
    recompute: str = "none"
    model_overrides: tuple[tuple[str, Any], ...] = ()
    notes: tuple[str, ...] = ()


_LLAMA_ENV = ("NVTE_FUSED_ATTN=1, NVTE_FLASH_ATTN=0 (llama3.1/configure.sh): cuDNN's fused attention; "
              "FP8 runs add fp8_hybrid and fp8_params (FP8 weights: not modelled)")
_LLAMA_GRADS = ("distributed_fused_adam with grad_sync_dtype bf16 (the GSW 24.11 llama3.1 YAMLs as copied in "
                "mindhash/dgxc-bench f9d8bc85; the recipe's own YAMLs are not published)")

#: DGX Cloud Benchmarking release 24.11 workloads (NVIDIA/dgxc-benchmarking 35a9aecc / 143b90dd)
DGXC_RECIPES = {
    "llama3.1-8b": NemoRecipe("llama3-8b", "bf16", "cudnn", notes=(_LLAMA_ENV, _LLAMA_GRADS, "NeMo 24.09")),
    "llama3.1-70b": NemoRecipe("llama3-70b", "bf16", "cudnn", notes=(
        _LLAMA_ENV, _LLAMA_GRADS, "NeMo 24.09; defer_embedding_wgrad_compute (not modelled)")),
    "llama3.1-405b": NemoRecipe("llama3-405b", "bf16", "cudnn", model_overrides=(("n_kv_heads", 16), ("vocab_size", 51200)), notes=(
        _LLAMA_ENV, "gradient dtype not published for the 405B YAML: bf16 as the 8B and 70B recipes",
        "GPT2BPETokenizer as a proxy (README_405b): 50,257 tokens padded by NeMo to 128 x TP 8 multiples, 51,200; "
        "16 query groups as NeMo's 405B config and the recipe's FLOP formula state; mock data", "NeMo 24.09")),
    "nemotron4-15b": NemoRecipe("nemotron4-15b", "fp32", "cudnn", notes=(
        "NVTE_FUSED_ATTN=1 (nemotron/configure.sh): cuDNN's fused attention",
        "mcore_distributed_optim without grad_sync_dtype: fp32 gradient reduction (nemotron4-15b-synth.yaml, "
        "stored only at the 25.02 commit 8f5cbb37)", "sequence parallelism and userbuffers TP overlap set by the launch overrides",
        "NeMo 24.09; mock data")),
    "nemotron4-340b": NemoRecipe("nemotron4-340b", "bf16", "flash2", recompute="selective", notes=(
        "NVTE_FUSED_ATTN=0 (nemotron/configure.sh): Transformer Engine's FlashAttention (flash-attn 2)",
        "distributed_fused_adam with grad_sync_dtype bf16; selective activation recompute "
        "(nemotron4-340b-synth.yaml, stored only at the 25.02 commit 8f5cbb37)",
        "sequence parallelism and userbuffers TP overlap set by the launch overrides",
        "NeMo 24.09; mock data; defer_embedding_wgrad_compute (not modelled)")),
    "grok1-314b": NemoRecipe("grok1-314b", "bf16", "flash2", model_overrides=(
        ("vocab_size", 128256), ("tied_embeddings", False), ("norms_per_layer", 2)), notes=(
        "NVTE_FUSED_ATTN=0 (grok1/configure.sh): Transformer Engine's FlashAttention (flash-attn 2)",
        "grok1_314b.yaml at 35a9aecc: Megatron-Core MoE, 8 experts, top 2, all-to-all dispatch padded to "
        "capacity factor 1.0 (balanced, as meshplan routes), experts split by TP (expert tensor parallel = tp), "
        "mcore_distributed_optim with grad_sync_dtype bf16, no recompute; userbuffers TP overlap and "
        "sequence parallelism set by configure.sh",
        "NeMo's block: pre-norm only (2 RMSNorms a layer), untied embeddings, Llama 3's tokenizer as a proxy "
        "(128,256 tokens); mock data",
        "NeMo development image of the 24.09 era (the release lists Grok-1 with 24.09)")),
    "gpt3-175b": NemoRecipe("gpt3-175b", "bf16", "flash2", notes=(
        "NVTE_FUSED_ATTN=0 (nemo_megatron/launch.sh): Transformer Engine's FlashAttention (flash-attn 2)",
        "distributed_fused_adam with grad_sync_dtype bf16, userbuffers TP overlap, dropout 0.1 "
        "(gpt3_175b_hydra.yaml at 35a9aecc)", "NeMo 24.05; the Pile")),
}


@lru_cache(maxsize=1)
def heldout_runs() -> tuple[dict[str, Any], ...]:
    """The ``runs`` of the held-out file, in file order (read-only)."""
    return tuple(read_data_file(HELDOUT_FILE)["runs"])


def _model(r: dict[str, Any]):
    if r["group"] == "dgxc":
        recipe = DGXC_RECIPES[r["recipe"]]
        base = load_model(recipe.model)
        changes = dict(recipe.model_overrides) | ({"n_layers": r["layers"]} if "layers" in r else {})
        if not changes:
            return base
        return ModelSpec.build(where=f"model {r['id']}", **(base.model_dump() | changes | {"name": f"{base.name} ({r['recipe']} run)"}))
    spec = r["model"]
    if isinstance(spec, str):
        return load_model(spec)
    if "mpt" in spec:
        layers, hidden, heads = MPT_SIZES[spec["mpt"]]
        return gpt_model(f"mpt-{spec['mpt']}", layers, hidden, heads, MPT_VOCAB, r["seq_len"], dropout=False,
                         source=HELDOUT_SOURCES[r["group"]])
    layers, hidden, heads, vocab = spec["gpt"]
    return gpt_model(spec.get("name", r["id"]), layers, hidden, heads, vocab, r["seq_len"], source=HELDOUT_SOURCES[r["group"]])


def _foundry_plan(r: dict[str, Any]) -> tuple[TrainingPlan, list[str]]:
    """An LLM Foundry row: FSDP over every GPU, Composer's micro-batches, eager PyTorch."""
    n, checkpointed = r["gpus"], r["activation_checkpointing"]
    recipe, precision_note = MPT_PRECISION[r["precision"]]
    plan = TrainingPlan.build(
        where="plan", dp=n, micro_batch=r["micro_batch"], global_batch=r["global_batch"], seq_len=r["seq_len"],
        zero=3, recompute="full" if checkpointed else "none", precision=recipe, attention="flash",
        stack=load_stack("composer"),
    )
    if r["gpu"].startswith("a100"):
        network = f"1600 Gbps RoCE per 8-GPU node, 25 GB/s per GPU, as the table's title says (catalog {r['gpu']})"
    else:
        network = "network not stated: 8 GPUs per node, 400 Gb/s per GPU assumed (catalog h100-sxm-80gb)"
    notes = [
        f"PyTorch FSDP FULL_SHARD over all {n} GPUs; micro-batch {r['micro_batch']} x {plan.grad_accum} accumulation steps "
        f"= global batch {r['global_batch']}",
        "full activation checkpointing of every block" if checkpointed else "no activation checkpointing",
        precision_note,
        f"MPT-{r['model']['mpt']} (LLM Foundry config, MPTConfig defaults): learned positions, biases, LayerNorm, "
        f"GeLU 4h, tied embeddings, vocabulary {MPT_VOCAB:,}, no dropout; {r['params']:,} parameters as the table's NumParams",
        "FlashAttention (MPT attn_impl flash / triton), PyTorch eager (meshplan kernels 'eager')",
        "not expressible: Composer's FSDP (FSDP1) all-gathers into flat parameters and copies nothing out, where "
        "meshplan's eager ZeRO-3 charges FSDP2's copy-out; LLM Foundry's fused cross-entropy, where meshplan runs "
        "torch's (fp32 logits: more memory, a little more time)",
        network,
    ]
    return plan, notes


def _plan(r: dict[str, Any]) -> tuple[TrainingPlan, list[str]]:
    if r["group"] == "llmfoundry":
        return _foundry_plan(r)
    tp, pp, cp, vp, n = r["tp"], r["pp"], r["cp"], r["vp"], r["gpus"]
    dp = n // (tp * pp * cp)
    fp8 = r["precision"] == "fp8"
    megatron_core = r["group"] in ("nemo2407", "mbridge", "dgxc")
    workload = DGXC_RECIPES[r["recipe"]] if r["group"] == "dgxc" else None
    if workload:
        grads = workload.grads
    else:
        grads = "bf16" if r["group"] == "mbridge" else "fp32"  # Megatron-Bridge's perf scripts: grad_reduce_in_fp32 = False
    recipe = PrecisionRecipe(precision="fp8" if fp8 else "bf16", grad_dtype=grads)
    common = dict(where="plan", tp=tp, pp=pp, cp=cp, dp=dp, ep=r.get("ep", 1), vpp=vp, micro_batch=r["micro_batch"],
                  global_batch=r["global_batch"], seq_len=r["seq_len"], zero=1, precision=recipe)
    if megatron_core:
        recompute = workload.recompute if workload else "none"
        plan = TrainingPlan.build(
            **common, schedule="interleaved" if vp > 1 else "1f1b", recompute=recompute,
            sequence_parallel=tp > 1, attention="flash", stack=load_stack("nemo"),
            attention_kernel=workload.attention_kernel if workload else "auto",
        )
        framework = (f"DGX Cloud Benchmarking {r['recipe']} recipe" if workload else
                     "Megatron-Bridge perf script settings" if r["group"] == "mbridge" else "NeMo 24.07 perf recipe defaults")
        notes = [
            f"{framework}: distributed optimizer (ZeRO-1), overlapped grad reduce-scatter and param "
            f"all-gather, {'no activation recompute' if recompute == 'none' else recompute + ' activation recompute'}",
            "sequence parallelism and TP communication overlap (TP > 1)" if tp > 1 else "no TP",
            f"interleaved 1F1B, {vp} virtual stages per rank" if vp > 1 else "1F1B" if pp > 1 else "no PP",
            f"FP8 (Transformer Engine) GEMMs, BF16 attention, {grads} gradients" if fp8 else f"BF16, {grads} gradients",
            "DGX H100: 8 GPUs per NVSwitch node, one 400 Gb/s NIC per GPU (catalog h100-sxm-80gb)",
        ]
        if workload:
            notes += list(workload.notes)
            if "layers" in r:
                notes.append(f"proxy configuration: {r['layers']} of the model's layers, as the recipe runs it on {n} GPUs")
        else:
            notes.insert(4, "cuDNN's fused attention, Transformer Engine's choice on Hopper (meshplan attention_kernel auto)")
        if r["group"] == "mbridge":
            notes.append("FP8 with current scaling (FP8-CS): meshplan models the FP8 GEMMs, not the scaling mode")
    else:
        plan = TrainingPlan.build(
            **common, schedule="1f1b", recompute="full", sequence_parallel=False,
            attention="materialized", stack=load_stack("megatron-deepspeed"),
            # these rows were mapped with the parameter all-gather overlapped, which the profile says
            # DeepSpeed's ZeRO-1 does not do; kept so, as held-out predictions move only in an
            # accuracy change of their own (docs/accuracy.md, MT-NLG)
            overlap_param_gather=True,
        )
        notes = [
            "Megatron-DeepSpeed 2021: DeepSpeed 1F1B pipeline engine, ZeRO-1, full activation "
            "checkpointing, gradients reduced after the pipeline",
            "materialized attention (no FlashAttention in 2021); no sequence parallelism",
            "BF16 with fp32 gradients; GPT-3 block (MHA, GeLU 4h, LayerNorm, dropout 0.1)",
            "Selene DGX A100 80GB: 8 GPUs per node, 8 x 200 Gb/s HDR per node (catalog a100-sxm-80gb)",
        ]
    return plan, notes


def map_heldout(r: dict[str, Any]) -> MappedRun:
    """One held-out run as a meshplan plan (or unsupported, with the reason)."""
    group = r["group"]
    src = HELDOUT_SOURCES[group]
    try:
        model = _model(r)
        plan, notes = _plan(r)
        cluster = ClusterSpec.of(load_gpu(r["gpu"]), r["gpus"])
        check_plan(model, cluster, plan)
    except InputError as exc:
        return unsupported({"id": r["id"], "gpu": r["gpu"], "gpu_count": r["gpus"]}, group, src,
                           f"meshplan cannot express the plan: {exc}")
    tokens = r["global_batch"] * r["seq_len"]
    if "step_time_s" in r:
        step, formula = float(r["step_time_s"]), "printed iteration time"
    else:
        tps = r["tokens_per_s_per_gpu"]
        step = step_from_tokens_per_gpu(tokens, r["gpus"], tps)
        formula = f"global batch tokens / (tokens/s per GPU x GPUs) = {tokens:,} / ({tps:g} x {r['gpus']})"
    return MappedRun(
        id=r["id"], run_id=r["id"], group=group, source=src, gpu=r["gpu"], gpus=r["gpus"], model=model,
        cluster=cluster, plan=plan, published_step_s=step, formula=formula, assumptions=notes,
    )


def map_heldout_runs() -> list[MappedRun]:
    """Every held-out run mapped, in file order."""
    return [map_heldout(r) for r in heldout_runs()]
