"""Meta's runs: Llama 3 405B pre-training (the paper's Table 4) and the torchtitan benchmarks
(Llama 3.1 8B/70B/405B on H100, 2024-12; Llama 3.1 8B on H200 by Trainy/WhiteFiber, 2025-06)."""

from __future__ import annotations

import re
from typing import Any

from meshplan.accuracy.formulas import llama3_model_flops, step_from_tflops, step_from_tokens_per_gpu
from meshplan.accuracy.runs import MappedRun, unsupported
from meshplan.catalog import load_gpu, load_model, load_stack
from meshplan.cost.calibration import power_capped
from meshplan.cost.params import count_params
from meshplan.named_presets import PRESETS
from meshplan.specs.hardware import ClusterSpec, GPUSpec
from meshplan.specs.plan import PrecisionRecipe, TrainingPlan
from meshplan.units import GiB

LLAMA3_BATCH_TOKENS = 16 * 2**20  # "16M tokens" = 2,048 x 8,192


# ---- Llama 3 405B (Table 4) ---------------------------------------------------------------------


def map_llama3(r: dict[str, Any]) -> list[MappedRun]:
    src = "Llama 3 paper (arXiv 2407.21783), Table 4"
    n, cp, dp, s = r["gpu_count"], r["cp"], r["dp"], r["seq_len"]
    preset = PRESETS["llama3-405b-8k" if n == 8192 else "llama3-405b-16k"]
    v = dict(preset.values)
    if (r["tp"], r["pp"]) != (v["tp"], v["pp"]):
        return [unsupported(r, "llama3", src, f"layout TP{r['tp']} PP{r['pp']} differs from the preset's")]
    model = load_model(v["model"])
    plan = TrainingPlan.build(
        where="plan", tp=v["tp"], cp=cp, pp=v["pp"], dp=dp, vpp=v["vpp"], schedule=v["schedule"],
        micro_batch=v["micro_batch"], global_batch=LLAMA3_BATCH_TOKENS // s, seq_len=s,
        recompute=v["recompute"], zero=v["zero"], rank_order=tuple(v["rank_order"].split(",")),
        precision=PrecisionRecipe(precision="bf16", grad_dtype="fp32"), attention_kernel=v["attention_kernel"],
        tp_backward_overlap=v["tp_backward_overlap"],
    )
    cluster = ClusterSpec.of(load_gpu(v["gpu"]), n, pod_size=v["pod_size"],
                             oversubscription=v["oversubscription"])
    N = count_params(model).total
    X = r["tflops_per_gpu"]
    tokens = plan.tokens_per_step
    step = step_from_tflops(llama3_model_flops(tokens, N, model.n_layers, model.hidden, s), n, X)
    formula = (
        f"Llama 3 model FLOPs (6·N + 12·L·h·s) per token, N = {N:,} (Llama 3.1 405B), L = {model.n_layers}, "
        f"h = {model.hidden}, s = {s}, non-causal attention term (the ground truth's derivation; the "
        f"paper does not print its formula), x {tokens:,} tokens, divided by {n} GPUs x {X} TFLOP/s"
    )
    per_rank = plan.global_batch // dp
    assumptions = [
        f"preset '{preset.name}' (src/meshplan/named_presets.py): TP{v['tp']} PP{v['pp']}, interleaved with "
        f"vpp {v['vpp']} (not printed; one layer per chunk follows from Sec. 3.3.2's split, whose first chunk holds only "
        f"the embedding: 126 + 2 = 16 x 8), micro-batch {v['micro_batch']}, ZeRO-2-like sharding, "
        f"3,072-GPU pods with 1:7 oversubscription above, rank order {v['rank_order']}",
        f"16M-token batch = {plan.global_batch} x {s:,}: {per_rank} sequences per DP rank",
        ("no activation checkpointing (the paper, for 8K pre-training)" if cp == 1 else
         "no activation checkpointing assumed for the 128K stage too (each GPU still holds 8,192 "
         "tokens per micro-batch with CP 16); DP 8 as the ground truth corrects the printed 4"),
        "BF16 with fp32 gradient accumulation and fp32 reduce-scatter (the paper)",
        "catalog Llama 3.1 405B (vocabulary 128,256; the paper rounds it to 128,000)",
        "Llama 3's own schedule variant (tunable consecutive micro-batches per chunk, async P2P) "
        "approximated by Megatron's interleaved schedule; per virtual stage 0, 1 x 126, 0 layers, the "
        "first chunk with only the embedding and the last with only the LM head (meshplan's default split "
        "for 128 stages of 126 layers)",
        "document masking not modelled: attention spans whole sequences",
        "Meta's own PyTorch stack, not Transformer Engine: the paper names no attention kernel; FlashAttention-2's "
        "rates (meshplan attention_kernel flash2), not the cuDNN attention the fused stack takes on Hopper; "
        "and not Megatron's or Transformer Engine's linears, which run the backward's TP collectives behind their "
        "GEMMs: each TP collective exposed where autograd meets it, as torch's TP runs them (tp_backward_overlap off)",
        "H100 SXM 80GB HBM3 at 700 W (catalog), 400 Gb/s RoCE per GPU",
    ]
    if cp > 1:
        assumptions.append(
            "context parallelism modelled as ring send/recv of K/V overlapped with attention; Llama 3 "
            "all-gathers K/V (2·CP load-balanced chunks)"
        )
    return [MappedRun(
        id=r["id"], run_id=r["id"], group="llama3", source=src, gpu="h100-sxm-80gb", gpus=n,
        model=model, cluster=cluster, plan=plan, published_step_s=step, formula=formula,
        assumptions=assumptions,
    )]


# ---- torchtitan benchmarks ----------------------------------------------------------------------

TORCHTITAN_MODELS = {"Llama 3.1 8B": "llama3-8b", "Llama 3.1 70B": "llama3-70b", "Llama 3.1 405B": "llama3-405b"}


#: Grand Teton's H100: 96 GB of HBM2e in six stacks. HBM2e runs at the H100 PCIe's per-stack rate
#: (2.0 TB/s over five stacks, NVIDIA H100 PCIe datasheet): 6 x 0.4 = 2.4 TB/s.
H100_HBM2E_BANDWIDTH = 2.4e12
GRAND_TETON_POWER_W = 500.0


def h100_96gb() -> GPUSpec:
    """Meta Grand Teton's H100 SXM: 96 GiB of HBM2e at 2.4 TB/s, power-limited to 500 W (Liang et
    al. 2024, torchtitan, arXiv 2410.06511, Sec. 4: "non-standard H100 ... 96 GB HBM2e ... TDP
    limited to 500 W; its peak lies between the SXM's and the NVL's"), the dense peaks scaled by
    the power-cap law of :func:`meshplan.cost.calibration.power_capped` (x 0.867: 858 TFLOP/s
    BF16, between the NVL's 835 and the SXM's 989)."""
    return power_capped(
        load_gpu("h100-sxm-80gb"), GRAND_TETON_POWER_W, name="h100-sxm-96gb-500w",
        hbm_bandwidth=H100_HBM2E_BANDWIDTH, hbm_bytes=96 * GiB,
    )


def _numbers(text: Any) -> list[float]:
    """The first number of each '/'-separated part: '10938 (4 nodes) / 10753 (8 nodes)' -> both."""
    out = []
    for part in str(text).split("/"):
        m = re.search(r"\d+(?:\.\d+)?", part)
        if m:
            out.append(float(m.group()))
    return out


def _fsdp_notes(pp: int) -> list[str]:
    return [
        "FSDP2 = ZeRO-3 over dp x cp; torchtitan's mixed precision (bf16 compute, fp32 reduce) as "
        "meshplan's bf16 + fp32 gradients + fp32 master + Adam, whose master copy FSDP2's fp32 parameter "
        "shards are (meshplan.cost.memory.state_bytes_per_param: 4 + 4 + 8 = 16 B/param sharded)",
        "reshard after forward: yes; torchtitan's FSDP2 units before pytorch/torchtitan#1094 (2025-07): every "
        "block and the root, which holds the embedding, final norm and LM head and which FSDP2 never "
        "reshards after forward, the last block kept gathered (meshplan fsdp_head_in_root)" if pp == 1 else
        "reshard after forward: no (torchtitan's default with pipeline parallelism), and torch's "
        "pipeline schedules keep weights gathered and gradients unsharded until the last "
        "micro-batch (meshplan's fsdp_accumulate_unsharded); the gradient reduce-scatters are "
        "issued only after the stage's last backward has run, not overlapped with it "
        "(torch/distributed/pipelining/stage.py, backward_maybe_with_nosync: 'Manually call post "
        "backward for FSDP', post_backward() of every FSDP state after perform_backward returns): "
        "overlap_grad_reduce off",
        "SDPA flash attention, causal; rank order tp, cp, dp, pp (torchtitan's mesh, innermost first)",
    ]


#: torchtitan's train.py at the December 2024 benchmarks (9dec370) ran the loss eager beside
#: compiled blocks; pytorch/torchtitan#1033 (merged 2025-04-01) compiles it under --training.compile
LOSS_EAGER_2024 = (
    "loss: torch's cross_entropy on fp32 logits, eager beside the compiled blocks (torchtitan's train.py "
    "of the benchmark: 'TODO: compiling loss function causes CUDA errors, turning off for now'; meshplan "
    "compile_loss off)"
)
LOSS_COMPILED_2025 = (
    "loss: torch.compile'd cross_entropy (torchtitan's build_cross_entropy_loss compiles it under "
    "--training.compile since pytorch/torchtitan#1033, 2025-04): it keeps only the bf16 logits, no fp32 copy "
    "(meshplan compile_loss on)"
)


def _torchtitan_common(r: dict[str, Any], recompute: str, fp8: bool, compiled: bool, compile_loss: bool = False,
                       fp8_gather: bool = False) -> list[str]:
    notes = []
    if recompute == "op":
        notes.append(
            "torchtitan's op-level selective AC (saves the outputs of every other matmul and of SDPA, "
            "recomputes the rest) as meshplan's recompute 'op'"
        )
    else:
        notes.append("full activation checkpointing of every layer")
    if fp8:
        notes.append(
            "Float8 linears (torchao, tensorwise dynamic scaling) as meshplan fp8: GEMMs at the FP8 peak, "
            "attention in bf16; torchao's scaling passes as HBM traffic (meshplan.cost.float8: amax, cast "
            "and column-major copy of input, weight and output gradient; under op-level AC the casts "
            "recomputed); " + ("the blocks' weights arrive cast from FSDP2's FP8 all-gather, so only the input and "
                               "output gradient are cast, and the weight's column-major copy remains" if fp8_gather else
                               "weights gathered in bf16 (enable_fsdp_float8_all_gather not stated: torchtitan's default, off)")
        )
    notes.append(
        "torch.compile'd transformer blocks: fused element-wise kernels (meshplan kernels 'compiled')"
        if compiled else
        "PyTorch eager: one kernel per element-wise op, fp32 upcasts in RMSNorm and RoPE (meshplan kernels 'eager')"
    )
    if not compiled:
        notes.append("loss: torch's cross_entropy on fp32 logits (eager)")
    else:
        notes.append(LOSS_COMPILED_2025 if compile_loss else LOSS_EAGER_2024)
    return notes


def map_torchtitan(r: dict[str, Any]) -> list[MappedRun]:
    src = "torchtitan benchmarks (Llama 3.1 on H100, 2024-12)"
    name = TORCHTITAN_MODELS.get(r["model"])
    if name is None:
        return [unsupported(r, "torchtitan", src, f"no catalog model for {r['model']}")]
    model = load_model(name)
    notes = str(r.get("notes") or "")
    tp, pp, cp, dp, n, s = r["tp"], r["pp"], r["cp"], r["dp"], r["gpu_count"], r["seq_len"]
    m_lbs = re.search(r"local batch (\d+)", notes)
    if r.get("global_batch_seqs"):
        global_batch = r["global_batch_seqs"]
        lbs = global_batch // dp
    elif m_lbs:
        lbs = int(m_lbs.group(1))
        global_batch = lbs * dp
    else:
        return [unsupported(r, "torchtitan", src, "no global or local batch size given")]
    recompute = "op" if str(r["activation_recompute"]).startswith("selective") else "full"
    fp8 = "Float8" in str(r["precision"])
    interleaved = "Interleaved" in notes
    compiled = "compile" in notes or interleaved  # the interleaved row: as the 1F1B row (assumption below)
    async_tp = tp > 1 and ("AsyncTP" in notes or interleaved)
    assumptions: list[str] = []
    if pp > 1:
        vpp = 2 if interleaved else 1
        m = pp * vpp  # torchtitan's default number of micro-batches: the total number of stages
        micro = lbs // m
        assumptions.append(
            f"{m} micro-batches of {micro} (torchtitan's default: as many micro-batches as pipeline "
            f"stages, pp x stages per rank; local batch {lbs}; pipelining_utils.py "
            "build_pipeline_schedule: 'if n_microbatches is None: n_microbatches = num_total_stages'), "
            + ("interleaved 1F1B with 2 stages per rank (not stated; generate_split_points' default "
               "for multi-stage schedules)" if interleaved else "1F1B")
            + "; layers split by generate_split_points (the remainder to the middle stages, the "
            "embedding on the first stage and norm, output and loss on the last), which is meshplan's "
            "default split"
        )
    else:
        micro, vpp = lbs, 1
        assumptions.append(f"local batch {lbs} as one micro-batch (no pipeline, no accumulation)")
    plan = TrainingPlan.build(
        where="plan", tp=tp, cp=cp, pp=pp, dp=dp, vpp=vpp, schedule="interleaved" if vpp > 1 else "1f1b",
        micro_batch=micro, global_batch=global_batch, seq_len=s, recompute=recompute,
        sequence_parallel=tp > 1, zero=3, precision=PrecisionRecipe(precision="fp8" if fp8 else "bf16", grad_dtype="fp32"),
        stack=load_stack("torchtitan-2024"), tp_comm_overlap=async_tp, kernels="compiled" if compiled else "eager",
    )
    cluster = ClusterSpec.of(h100_96gb(), n)
    if interleaved:
        assumptions.append("compile + Float8 + AsyncTP as in the 1F1B row (the interleaved row's note omits them)")
        assumptions.append(
            "pipeline run in lockstep (meshplan.pipeline.lockstep): torch 1963fc8's ScheduleInterleaved1F1B is a "
            "PipelineScheduleMulti, whose _step_microbatches walks the precomputed pipeline_order slot by slot and "
            "waits at every slot for the rank's sends and the receives its neighbours' actions imply "
            "(_batch_p2p(ops).wait())")
    elif pp > 1:
        assumptions.append("pipeline dependency-driven: torch's Schedule1F1B (a PipelineScheduleSingle) posts each "
                           "receive when its data is due")
    if pp > 1:
        assumptions.append(
            "the last stage keeps every micro-batch's logits to the step's end and concatenates them then "
            "(meshplan pp_return_outputs): torch 1963fc8's forward_one_chunk appends each output to output_chunks "
            "and step() returns their merge; schedule.step's return_outputs=False came in pytorch/pytorch#165822 (2025-10)")
    if tp > 1:
        assumptions.append("TP with sequence parallelism, the loss under torch's loss_parallel on the "
                           "vocabulary-sharded logits (torchtitan's default with TP)" + (
            " and AsyncTP as torch's micro-pipelined TP of 2024 (meshplan.cost.async_tp): forward all-gathers "
            "and reduce-scatters and the backward gradient all-gathers fused with their GEMMs in t chunks, "
            "the backward input-gradient reduce-scatters exposed" if async_tp else ""))
    if cp > 1:
        assumptions.append(
            "context parallelism as torch runs it (meshplan.cost.cp_exchange): K/V repeated to the query heads, "
            "all-gathered once per layer forward and again backward (rotate method allgather, hidden behind the "
            "step-0 call only), fp32 dK/dV passed one ring step at a time, the last transfer exposed")
    assumptions += _torchtitan_common(r, recompute, fp8, compiled) + _fsdp_notes(pp) + [
        "Grand Teton H100: 96 GiB HBM2e at 2.4 TB/s, 500 W power cap: dense peaks x "
        "((500 - 126)/(700 - 126))^(1/3) = 0.867 (858 TFLOP/s BF16; 126 W the static power, measured idle on an H200)",
        "Grand Teton: 8 GPUs per NVSwitch node, 400 Gb/s RDMA per GPU",
        "published memory is torchtitan's peak (reserved) memory; meshplan's is its allocated peak "
        "plus a 2 GiB runtime reserve",
    ]
    tps = float(r["tokens_per_s_per_gpu"])
    step = step_from_tokens_per_gpu(global_batch * s, n, tps)
    formula = f"global batch tokens / (tokens/s per GPU x GPUs) = {global_batch * s:,} / ({tps:g} x {n})"
    return [MappedRun(
        id=r["id"], run_id=r["id"], group="torchtitan", source=src, gpu="h100-sxm-96gb (500 W)", gpus=n,
        model=model, cluster=cluster, plan=plan, published_step_s=step, formula=formula,
        published_mem_gib=float(r["peak_memory_gib"]), assumptions=assumptions,
    )]


def map_trainy(r: dict[str, Any]) -> list[MappedRun]:
    """One row, two measurements (32 and 64 GPUs): two mapped runs."""
    src = "torchtitan benchmark (Trainy/WhiteFiber, H200, 2025-06)"
    gpus = [int(x) for x in _numbers(r["gpu_count"])]
    tps = _numbers(r["tokens_per_s_per_gpu"])
    mem = _numbers(r["peak_memory_gib"])
    if not (len(gpus) == len(tps) == len(mem)) or not gpus:
        return [unsupported(r, "trainy", src, "cannot pair GPU counts with throughputs")]
    model = load_model("llama3-8b")
    out = []
    for n, t, g in zip(gpus, tps, mem):
        b = r["micro_batch"]
        plan = TrainingPlan.build(
            where="plan", dp=n, micro_batch=b, global_batch=b * n, seq_len=r["seq_len"],
            recompute="op", sequence_parallel=False, zero=3,
            precision=PrecisionRecipe(precision="fp8", grad_dtype="fp32"),
            stack=load_stack("torchtitan"), fsdp_head_in_root=True, fsdp_fp8_all_gather=True,
        )
        cluster = ClusterSpec.of(load_gpu("h200-sxm-141gb"), n)
        assumptions = [
            f"FSDP over all {n} GPUs, local batch {b} as one micro-batch, global batch {b * n} sequences",
            "--float8.enable_fsdp_float8_all_gather with --float8.precompute_float8_dynamic_scale_for_fsdp (the run's "
            "command) as meshplan fsdp_fp8_all_gather: the blocks' linear weights all-gathered, copied out and held as "
            "FP8 bytes (meshplan.cost.fsdp_copies); the embedding and LM head in bf16",
            "--float8.force_recompute_fp8_weight_in_bwd: no FP8 weight saved for the backward, which meshplan "
            "does not count in any case (the weight is the gathered unit's)",
        ] + _torchtitan_common(r, "op", True, True, compile_loss=True, fp8_gather=True) + _fsdp_notes(1) + [
            "H200 SXM 141GB (catalog), 8 per node, 400 Gb/s ConnectX-7 per GPU",
            "published memory is torchtitan's peak (reserved) memory",
        ]
        step = step_from_tokens_per_gpu(b * n * r["seq_len"], n, t)
        out.append(MappedRun(
            id=f"{r['id']}@{n}gpu", run_id=r["id"], group="trainy", source=src, gpu="h200-sxm-141gb",
            gpus=n, model=model, cluster=cluster, plan=plan, published_step_s=step,
            formula=f"global batch tokens / (tokens/s per GPU x GPUs) = {b * n * r['seq_len']:,} / ({t:g} x {n})",
            published_mem_gib=g, assumptions=assumptions,
        ))
    return out
