"""Megatron-LM runs: Narayanan et al. 2021 Table 1, Korthikanti et al. 2022 Tables 3/5, and the
Megatron-LM README's H100 weak-scaling table (Megatron-Core r0.8, 2024-07).

Architecture (all rows): GPT-2/3 — MHA, GeLU MLP of 4h, LayerNorm, learned positions, tied
embeddings, biases on every linear, dropout 0.1 on attention and hidden states (Megatron's
defaults). 2021–2022 Megatron ran materialized attention (fused scale-mask-softmax, no
FlashAttention); the 2024 README ran Transformer Engine's fused (flash) attention.
"""

from __future__ import annotations

from typing import Any, Optional

from meshplan.accuracy.formulas import megatron_r08_flops, narayanan21_eq3, step_from_tflops
from meshplan.accuracy.runs import MappedRun, gpt_model, unsupported
from meshplan.catalog import load_gpu, load_stack
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.plan import PrecisionRecipe, TrainingPlan

GPT_ARCH = (
    "GPT-2/3 architecture: MHA, GeLU MLP 4h, LayerNorm, learned positions, tied embeddings, biases "
    "on every linear, dropout 0.1 on attention and hidden states (Megatron defaults)"
)
SELENE = (
    "Selene DGX A100: 8 GPUs per NVSwitch node, 8 x 200 Gb/s HDR InfiniBand per node (catalog "
    "a100-sxm-80gb: 300 GB/s NVLink and 25 GB/s NIC per GPU per direction)"
)
MEGATRON_ORDER = "rank order tp, cp, dp, pp (Megatron's default: TP inside a node, PP outermost)"

#: examples/sc21/run_table_1.sh in NVIDIA/Megatron-LM, the scripts published to reproduce Table 1:
#: micro-batch size, DDP implementation, --num-layers-per-virtual-pipeline-stage (None: 1F1B).
SC21_TABLE1: dict[str, tuple[int, str, Optional[int]]] = {
    "narayanan21_t1_1.7B": (16, "torch", None),
    "narayanan21_t1_3.6B": (16, "torch", None),
    "narayanan21_t1_7.5B": (16, "torch", None),
    "narayanan21_t1_18.4B": (8, "torch", None),
    "narayanan21_t1_39.1B": (4, "local", None),
    "narayanan21_t1_76.1B": (2, "local", 5),
    "narayanan21_t1_145.6B": (2, "local", 5),
    "narayanan21_t1_310.1B": (1, "local", 3),
    "narayanan21_t1_529.6B": (1, "local", 1),
    "narayanan21_t1_1008.0B": (1, "local", None),
}


def _model(r: dict[str, Any], *, dropout: bool = True):
    return gpt_model(
        r["model"], r["layers"], r["hidden"], r["heads"], r["vocab"], r["seq_len"], ffn=r["ffn"],
        dropout=dropout, source=r["source"],
    )


def _mapped(r: dict[str, Any], group: str, source: str, gpu_name: str, model, cluster, plan, **kw) -> MappedRun:
    return MappedRun(
        id=r["id"], run_id=r["id"], group=group, source=source, gpu=gpu_name, gpus=r["gpu_count"],
        model=model, cluster=cluster, plan=plan, **kw,
    )


#: the profiles of Megatron-LM without its distributed optimizer: local DDP (gradients all-reduced after
#: the backward), no TP overlap; v2.6 meets each TP collective where autograd does, the 2022 code runs
#: the column-parallel linears' backward collectives behind their GEMMs (catalog/data/stacks.yaml)
MEGATRON_2021, MEGATRON_2022 = "megatron-lm-2021", "megatron-lm-2022"


# ---- Narayanan et al. 2021, Table 1 -------------------------------------------------------------


def map_narayanan21(r: dict[str, Any]) -> list[MappedRun]:
    src = "Narayanan et al. 2021, Table 1"
    if r["id"] not in SC21_TABLE1:
        return [unsupported(r, "narayanan21", src, "no run_table_1.sh configuration for this row")]
    mbs, ddp, layers_per_vstage = SC21_TABLE1[r["id"]]
    tp, pp, dp, n = r["tp"], r["pp"], r["dp"], r["gpu_count"]
    vpp = r["layers"] // pp // layers_per_vstage if layers_per_vstage else 1
    overlap = ddp == "torch"
    plan = TrainingPlan.build(
        where="plan", tp=tp, pp=pp, dp=dp, vpp=vpp, schedule="interleaved" if vpp > 1 else "1f1b",
        micro_batch=mbs, global_batch=r["global_batch_seqs"], seq_len=r["seq_len"], recompute="full",
        sequence_parallel=False, zero=0,
        precision=PrecisionRecipe(precision="fp16", grad_dtype="fp16", grad_fp32_copy=True),
        attention="materialized", attention_flops="full", stack=load_stack(MEGATRON_2021), overlap_grad_reduce=overlap,
    )
    gpu = load_gpu("a100-sxm-80gb")
    cluster = ClusterSpec.of(gpu, n)
    B, s, L, h, V = r["global_batch_seqs"], r["seq_len"], r["layers"], r["hidden"], r["vocab"]
    X = r["tflops_per_gpu"]
    step = step_from_tflops(narayanan21_eq3(B, s, L, h, V), n, X)
    formula = (
        f"Narayanan 2021 Eq. 3 (counts the full-recompute forward): 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)) "
        f"with B={B}, s={s}, L={L}, h={h}, V={V}, divided by {n} GPUs x {X} TFLOP/s"
    )
    sched = (
        f"interleaved 1F1B, {layers_per_vstage} layers per virtual stage -> vpp {vpp}" if vpp > 1
        else "1F1B without interleaving"
    )
    assumptions = [
        f"micro-batch {mbs}, {sched}, DDP '{ddp}': from Megatron-LM examples/sc21/run_table_1.sh "
        "(NVIDIA's scripts reproducing Table 1; the paper's table does not print them)",
        "full activation recompute of every layer (--recompute-method uniform, 1 layer per "
        "checkpoint), as Eq. 3's 4x-forward count implies",
        "fp16 mixed precision (--fp16): fp16 weights and gradients, fp32 master weights and fp32 "
        "gradient copy in the optimizer (Megatron 2021 default: no --accumulate-allreduce-grads-in-fp32)",
        "no ZeRO: Megatron 2021 had no distributed optimizer (zero 0)",
        ("torch DDP: the gradient all-reduce overlaps the last micro-batch's backward (Megatron runs "
         "the earlier micro-batches under no_sync)") if overlap else
        ("Megatron's local DDP (2021): gradients all-reduced after the whole backward, not overlapped"),
        "materialized attention (no FlashAttention in 2021) with the fused scale-mask-softmax kernel",
        GPT_ARCH, MEGATRON_ORDER, SELENE,
    ]
    return [_mapped(r, "narayanan21", src, "a100-sxm-80gb", _model(r), cluster, plan,
                    published_step_s=step, formula=formula, assumptions=assumptions)]


# ---- Korthikanti et al. 2022 ------------------------------------------------------------------


def map_korthikanti22(r: dict[str, Any]) -> list[MappedRun]:
    src = "Korthikanti et al. 2022, Tables 3/5"
    selective = str(r["activation_recompute"]).startswith("selective")
    vpp = r["vp"] or 1
    plan = TrainingPlan.build(
        where="plan", tp=r["tp"], pp=r["pp"], dp=r["dp"], vpp=vpp,
        schedule="interleaved" if vpp > 1 else "1f1b", micro_batch=r["micro_batch"],
        global_batch=r["global_batch_seqs"], seq_len=r["seq_len"],
        recompute="selective" if selective else "full", sequence_parallel=selective, zero=0,
        precision=PrecisionRecipe(precision="fp16", grad_dtype="fp32"),
        attention="materialized", attention_flops="full", stack=load_stack(MEGATRON_2022),
    )
    cluster = ClusterSpec.of(load_gpu("a100-sxm-80gb"), r["gpu_count"])
    assumptions = [
        ("selective recompute of the attention core with sequence parallelism (the paper's "
         "'present work' configuration)") if selective else
        "full recompute without sequence parallelism (Table 5's baseline)",
        f"{'interleaved 1F1B with ' + str(vpp) + ' virtual stages per rank (Table 3)' if vpp > 1 else '1F1B without interleaving (Table 3 interleaves only 175B and 530B)'}",
        "precision not stated ('mixed'): fp16 weights with fp32 gradient accumulation and fp32 "
        "master weights assumed",
        "no ZeRO (zero 0), as the rows state; output-tensor deallocation affects memory only",
        "gradient all-reduce not overlapped with the backward (Megatron 2022 local DDP; the dp8 row's "
        "note says no overlap)",
        "materialized attention (Megatron 2022, before FlashAttention) with dropout",
        ("the column-parallel linears' backward collectives behind their own GEMMs (Megatron-LM since 2021-09; "
         "the paper's Sec. 6.2 names the all-reduce's overlap with the weight-gradient GEMM)"),
        GPT_ARCH, MEGATRON_ORDER, SELENE,
    ]
    formula = f"printed iteration time ({r['step_time_s']} s; Table 5 / Sec. 6.3)"
    return [_mapped(r, "korthikanti22", src, "a100-sxm-80gb", _model(r), cluster, plan,
                    published_step_s=float(r["step_time_s"]), formula=formula, assumptions=assumptions)]


# ---- Megatron-LM README, H100 weak scaling (2024-07) ------------------------------------------


def map_megatron_readme(r: dict[str, Any]) -> list[MappedRun]:
    src = "Megatron-LM README (r0.8, 2024-07), H100 table"
    if not isinstance(r.get("gpu_count"), int) or r.get("tp") is None:
        return [unsupported(r, "megatron_readme", src,
                            "strong-scaling series over a GPU range (96..4608) with no parallel layout per point")]
    tp, pp, dp, n = r["tp"], r["pp"], r["dp"], r["gpu_count"]
    plan = TrainingPlan.build(
        where="plan", tp=tp, pp=pp, dp=dp, micro_batch=1, global_batch=r["global_batch_seqs"],
        seq_len=r["seq_len"], recompute="none", sequence_parallel=tp > 1, zero=1,
        precision=PrecisionRecipe(precision="bf16", grad_dtype="fp32"), attention="flash",
        attention_flops="full", tp_comm_overlap=tp > 1, overlap_grad_reduce=True,
        overlap_param_gather=True,
    )
    cluster = ClusterSpec.of(load_gpu("h100-sxm-80gb"), n)
    B, s, L, h, a, f, V = (r["global_batch_seqs"], r["seq_len"], r["layers"], r["hidden"], r["heads"],
                           r["ffn"], r["vocab"])
    X = r["tflops_per_gpu"]
    step = step_from_tflops(megatron_r08_flops(B, s, L, h, a, a, h // a, f, V), n, X)
    formula = (
        "Megatron-LM num_floating_point_operations (Megatron-Core r0.8, non-causal attention): "
        f"12·B·s·L·h²·((1 + g/a + s/h)·(a·d/h) + f/h + V/(2·L·h)) with B={B}, s={s}, L={L}, h={h}, "
        f"a=g={a}, f={f}, V={V}, divided by {n} GPUs x {X} TFLOP/s"
    )
    assumptions = [
        "micro-batch 1 (not published)",
        "1F1B without interleaving (Megatron's default; the README gives no virtual-pipeline size)"
        if pp > 1 else "no pipeline parallelism",
        "no activation recompute (Megatron's default; the README names none)",
        ("sequence parallelism on: --tp-comm-overlap requires it; TP communication overlapped with "
         "GEMMs (--tp-comm-overlap)") if tp > 1 else "no tensor parallelism",
        "BF16 with fp32 gradient accumulation (Megatron forces fp32 main grads under --bf16); "
        "distributed optimizer = ZeRO-1 over DP with --overlap-grad-reduce --overlap-param-gather",
        "cuDNN's fused attention (Transformer Engine's choice on Hopper, Megatron-Core's default backend; meshplan "
        "attention_kernel auto), causal mask",
        "Megatron-Core GPT defaults: learned absolute positions, LayerNorm, GeLU 4h, biases, tied "
        "embeddings, dropout 0.1",
        MEGATRON_ORDER,
        "DGX H100 nodes: 8 GPUs on NVSwitch, one 400 Gb/s NDR NIC per GPU (catalog h100-sxm-80gb)",
    ]
    return [_mapped(r, "megatron_readme", src, "h100-sxm-80gb", _model(r), cluster, plan,
                    published_step_s=step, formula=formula, assumptions=assumptions)]
