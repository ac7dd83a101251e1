"""Runs on Megatron-DeepSpeed / DeepSpeed / FairScale stacks: BLOOM 176B, OPT-175B, GPT-NeoX-20B."""

from __future__ import annotations

from typing import Any

from meshplan.accuracy.formulas import narayanan21_eq3, step_from_tflops
from meshplan.accuracy.runs import MappedRun, gpt_model, unsupported
from meshplan.catalog import load_gpu, load_stack
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import PrecisionRecipe, TrainingPlan
from meshplan.units import GB, GBIT_PER_S, GiB

DEEPSPEED_ORDER = (
    "rank order tp, dp, pp (DeepSpeed's PipeModelDataParallelTopology: model innermost, pipe outermost)"
)


# ---- BLOOM 176B -------------------------------------------------------------------------------


def map_bloom(r: dict[str, Any]) -> list[MappedRun]:
    src = "BLOOM tr11-176B-ml log (BigScience, 2022)"
    model = gpt_model(
        "BLOOM 176B", r["layers"], r["hidden"], r["heads"], r["vocab"], r["seq_len"], ffn=r["ffn"],
        position="rope", tied=True, dropout=True, source=r["source"],
    )
    plan = TrainingPlan.build(
        where="plan", tp=r["tp"], pp=r["pp"], dp=r["dp"], micro_batch=r["micro_batch"],
        global_batch=r["global_batch_seqs"], seq_len=r["seq_len"], recompute="full",
        sequence_parallel=False, zero=1, precision=PrecisionRecipe(precision="bf16", grad_dtype="fp32"),
        attention="materialized", attention_flops="full", stack=load_stack("megatron-deepspeed"),
    )
    nic = 4 * 100 * GBIT_PER_S / 8  # 4 Omni-Path 100 Gb/s links per 8-GPU node
    cluster = ClusterSpec.of(load_gpu("a100-sxm-80gb"), r["gpu_count"], nic_bandwidth=nic)
    assumptions = [
        "1F1B pipeline (DeepSpeed PipelineEngine's TrainSchedule), no interleaving; meshplan's default "
        "split gives the published partition 5, 6 x 10, 5 layers (embedding on ranks 0 and 11)",
        "BF16_Optimizer (its own ZeRO-1): bf16 weights, fp32 gradient accumulation, fp32 master "
        "weights and Adam moments sharded over DP (zero 1)",
        "gradients reduced after the pipeline finishes and weights gathered after the step, "
        "neither overlapped (DeepSpeed pipeline engine)",
        "full recompute (--checkpoint-activations, one layer per checkpoint), no sequence parallelism",
        "materialized attention (2022, no FlashAttention); dropout 0.1 on attention and hidden "
        "(Megatron defaults, which the tr11 README says were inherited)",
        "ALiBi modelled as a parameter-free rotary position (meshplan has no ALiBi; both add no "
        "weights, RoPE's elementwise pass stands in for ALiBi's bias add); the embedding LayerNorm "
        "(2h parameters) is left out",
        "Jean Zay nodes: 8 A100-80GB with NVLink (catalog 300 GB/s per direction kept); "
        "4 x 100 Gb/s Omni-Path per node = 6.25 GB/s per GPU",
        "not modelled: the slurm script exports CUDA_LAUNCH_BLOCKING=1 (every kernel launch "
        "synchronizes with the host), which slows the real run",
        DEEPSPEED_ORDER,
    ]
    return [MappedRun(
        id=r["id"], run_id=r["id"], group="bloom", source=src, gpu="a100-sxm-80gb (Jean Zay)",
        gpus=r["gpu_count"], model=model, cluster=cluster, plan=plan,
        published_step_s=float(r["step_time_s"]),
        formula=f"printed 'elapsed time per iteration' {r['step_time_s']} s (log line, iteration 85376)",
        published_mem_gib=60 * GB / GiB,
        assumptions=assumptions + [
            "published memory '~60 GB per GPU' (BigScience notion page) read as 60e9 bytes = 55.9 GiB; "
            "the page's unit is loose (if it meant nvidia-smi's GiB the figure is 60.0 GiB)",
        ],
    )]


# ---- OPT-175B ---------------------------------------------------------------------------------


def map_opt(r: dict[str, Any]) -> list[MappedRun]:
    return [unsupported(
        r, "opt", "OPT paper (Zhang et al. 2022), Sec. 2.4",
        "147 TFLOP/s is an 'up to' peak with no stated FLOP formula, so no step time follows from "
        "the source's own formula (TP 8 is recalled and the 2M-token batch does not split over dp 124)",
    )]


# ---- GPT-NeoX-20B -----------------------------------------------------------------------------


def map_neox(r: dict[str, Any]) -> list[MappedRun]:
    src = "GPT-NeoX-20B (Black et al. 2022) + configs/20B.yml"
    L, h, a, V, s = r["layers"], r["hidden"], r["heads"], r["vocab"], r["seq_len"]
    model = ModelSpec.build(
        where="model GPT-NeoX-20B", name="GPT-NeoX-20B", n_layers=L, hidden=h, n_heads=a,
        n_kv_heads=a, head_dim=h // a, ffn_hidden=r["ffn"], vocab_size=V, max_position=s,
        mlp="gelu", norm="layernorm", position="rope", tied_embeddings=False, qkv_bias=True,
        linear_bias=True, parallel_residual=True, dropout=False, source=r["source"],
    )
    plan = TrainingPlan.build(
        where="plan", tp=r["tp"], pp=r["pp"], dp=r["dp"], micro_batch=r["micro_batch"],
        global_batch=r["global_batch_seqs"], seq_len=s, recompute="full", sequence_parallel=False,
        zero=1, precision=PrecisionRecipe(precision="fp16", grad_dtype="fp16", grad_fp32_copy=True),
        attention="materialized", attention_flops="full", stack=load_stack("megatron-deepspeed"),
    )
    nic = 4 * 200 * GBIT_PER_S / 8  # 4 HDR 200 Gb/s HCAs per 8-GPU node
    cluster = ClusterSpec.of(load_gpu("a100-sxm-40gb"), r["gpu_count"], nic_bandwidth=nic)
    B, n, X = r["global_batch_seqs"], r["gpu_count"], r["tflops_per_gpu"]
    step = step_from_tflops(narayanan21_eq3(B, s, L, h, V), n, X)
    formula = (
        "GPT-NeoX / Megatron-DeepSpeed throughput formula with activation checkpointing = Narayanan "
        f"2021 Eq. 3: 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)) with B={B}, s={s}, L={L}, h={h}, V={V}, "
        f"divided by {n} GPUs x {X} TFLOP/s (117 is 'hardware-style', recalled; NeoX's later logger "
        "drops the vocabulary term by a bracket slip, which would make the step 1.1% shorter)"
    )
    assumptions = [
        "from configs/20B.yml: TP 2, PP 4, micro-batch 4, 32 accumulation steps, ZeRO-1, fp16, full "
        "checkpointing (1 layer), dropout 0, rotary, parallel attention + MLP, untied embeddings",
        "fp16 weights and gradients, fp32 master weights, Adam moments and gradient partition "
        "sharded over DP (DeepSpeed ZeRO-1 fp16 optimizer)",
        "1F1B pipeline (DeepSpeed TrainSchedule); gradients reduced after the pipeline, not overlapped",
        "materialized attention with the fused upper-triangular masked softmax (2022, no FlashAttention)",
        "rotary on 25% of the head dims (rotary_pct 0.25) modelled as full RoPE (slightly more "
        "elementwise traffic); vocabulary 50432 as padded",
        "CoreWeave nodes: 8 A100-SXM4-40GB on NVSwitch, 4 HDR 200 Gb/s HCAs per node = 12.5 GB/s per "
        "GPU (paper Sec. 3, recalled)",
        "not modelled: synchronize-each-layer (a CUDA synchronize after every layer)",
        DEEPSPEED_ORDER,
    ]
    return [MappedRun(
        id=r["id"], run_id=r["id"], group="neox", source=src, gpu="a100-sxm-40gb", gpus=n,
        model=model, cluster=cluster, plan=plan, published_step_s=step, formula=formula,
        assumptions=assumptions,
    )]
