"""The derivations an estimate records: each headline figure with its formula, its symbols'
values and its source (:class:`~meshplan.explain.Derivation`; what ``meshplan explain`` shows).

:func:`derivations` reads a finished :class:`~meshplan.estimate.Estimate` and the per-layer terms
the composition computed for it, so the formula shown is the one that produced the number.
"""

from __future__ import annotations

from meshplan.catalog import stack_overrides
from meshplan.cost.calibration import Calibration
from meshplan.cost.compute import ATTENTION_KERNEL_NAMES, OpTimes, attention_kernel_of, attention_rates
from meshplan.cost.contention import NCCL_CTAS, tp_overlap_ctas
from meshplan.cost.fsdp_copies import fp8_gather_saving, runs_fsdp2
from meshplan.cost.grad_accumulation import grad_accumulation_bytes
from meshplan.cost.params import layer_params_per_rank, layer_tensors_per_rank
from meshplan.cost.partial_recompute import recomputed_fraction
from meshplan.cost.variability import THROUGHPUT_CV, expected_max_z, straggler_factor
from meshplan.explain import Derivation
from meshplan.pipeline.deepspeed_steps import runs_deepspeed
from meshplan.pipeline.lockstep import runs_lockstep, runtime_words
from meshplan.specs.plan import TrainingPlan
from meshplan.specs.stack import field_text, settings_text
from meshplan.units import TFLOPS, fmt_bytes, fmt_seconds


def _tp_overlap_words(p: TrainingPlan) -> str:
    """How a layer's TP collectives overlap, as the ``time.layer`` derivation names it."""
    if p.tp == 1:
        return "not overlapped"
    if not p.stack.tp_comm_overlap:
        if p.stack.tp_backward_overlap:
            return ("forward not overlapped; backward behind the column-parallel linears' GEMMs"
                    + (": the input's re-gather behind dX, the reduce-scatter behind dW, the output gradient's all-gather "
                       "exposed" if p.sequence_parallel else ": the all-reduce behind dW") + " (meshplan.cost.tp_backward)")
        return "not overlapped"
    if p.stack.tp_overlap_kind == "micro-pipeline":
        return "micro-pipelined, torch AsyncTP: fused all-gather/reduce-scatter matmuls in t chunks"
    return "userbuffers: behind the layer's GEMMs"


def _cp_rows(p: TrainingPlan, cp_comm: tuple[float, float], lt) -> tuple[tuple[str, str], ...]:
    """The ``time.layer`` rows of context parallelism's K/V exchange
    (:mod:`meshplan.cost.cp_exchange`): its two collectives before overlap and what stays exposed,
    as the plan's software stack runs it; none at c = 1."""
    if p.cp == 1:
        return ()
    kv, dkv = cp_comm
    recompute = ", recompute repeats the forward" if p.recompute == "full" else ""
    if p.stack.kernels == "fused":
        return (
            ("CP comm", f"{fmt_seconds(kv)} K|V send/recv, {fmt_seconds(dkv)} backward (K|V and dK|dV) per ring step"),
            ("CP exposed", f"{fmt_seconds(lt.cp_fwd)} / {fmt_seconds(lt.cp_bwd)} (Transformer Engine's ring: "
                           f"c − 1 = {p.cp - 1} step{'s' if p.cp > 2 else ''}, each behind 1/c of the attention{recompute})"),
        )
    return (
        ("CP comm", f"{fmt_seconds(kv)} K|V all-gather, {fmt_seconds(dkv)} fp32 dK|dV send/recv per ring step"),
        ("CP exposed", f"{fmt_seconds(lt.cp_fwd)} / {fmt_seconds(lt.cp_bwd)} (torch's ring: the all-gather behind "
                       f"the step-0 call forward and backward, c = {p.cp} dK|dV transfers, the last one exposed{recompute})"),
    )


def _fsdp_rows(est, lt, fsdp_terms: tuple | None) -> list[Derivation]:
    """The ``time.fsdp`` derivation of per-layer ZeRO-3: a layer's all-gather and reduce-scatter
    before overlap, FSDP2's copies on the torch stacks (:mod:`meshplan.cost.fsdp_copies`) and what
    is exposed; none when weights are not sharded per layer (``fsdp_terms`` None)."""
    if fsdp_terms is None:
        return []
    p = est.plan
    ag, rs, copies = fsdp_terms
    again = " (and again backward)" if p.stack.reshard_after_forward else ""
    symbols = [("P", f"{layer_params_per_rank(est.model, p.tp):,} parameters per layer and GPU (TP {p.tp})")]
    gathered = "P·w"
    if p.stack.fsdp_fp8_all_gather:
        gathered = "P·w − S"
        saving = fp8_gather_saving(est.model, p.tp, p.precision.weight_bytes, True)
        symbols.append(("S", f"{saving:,} bytes: the Float8Linear weights gathered as FP8, P_lin·(w − 1) (FSDP2's FP8 all-gather)"))
    blocking = p.stack.zero3_blocking
    calls = ""
    if blocking:
        k = len(layer_tensors_per_rank(est.model, p.tp))
        symbols.append(("k", f"{k} parameter tensors per layer, one collective each: Σᵢ T(Pᵢ·w), (k − 1) ring latencies "
                             "more than one call"))
        calls = " in k calls"
    symbols.append(("AG, RS", f"{fmt_seconds(ag)} all-gather of {gathered}{again}, {fmt_seconds(rs)} reduce-scatter of P·γ{calls}, "
                              f"over N = {p.shard_degree}"))
    ag_bwd = "AG + RS" if p.stack.reshard_after_forward else "RS"
    formula = f"max(AG − forward, 0) forward, max({ag_bwd} − backward, 0) backward: a layer's collectives behind a layer's compute"
    if blocking:
        formula = (f"AG forward, {ag_bwd} backward, all exposed: each gather follows a device-wide synchronize "
                   "(DeepSpeed ZeRO-3 of 2021, zero3_comm blocking-per-tensor)")
    if runs_fsdp2(p.zero, p.stack.kernels):
        symbols.append(("copies", f"{fmt_seconds(copies[0])} copy-out (2·({gathered})) per all-gather, {fmt_seconds(copies[1])} "
                                  "copy-in (P·(w + γ)) per reduce-scatter, on the compute stream"))
        formula += " + FSDP2's copies"
    symbols.append(("per layer", f"{fmt_seconds(lt.fsdp_fwd)} / {fmt_seconds(lt.fsdp_bwd)} forward / backward"))
    return [Derivation(
        "time.fsdp", "ZeRO-3 / FSDP time per layer and micro-batch", formula, tuple(symbols),
        f"{fmt_seconds(est.time.fsdp_comm_s)} per step on the critical rank (the embedding and head units included)",
        "Rajbhandari et al. 2020 Sec. 7.2.2" + ("; torch FSDP2's foreach_all_gather_copy_out and foreach_reduce_scatter_copy_in "
                                                 "(meshplan.cost.fsdp_copies)" if runs_fsdp2(p.zero, p.stack.kernels) else ""))]


def _stored_mode(p: TrainingPlan, split: tuple[int, ...]) -> str:
    """The recompute mode of the per-layer bytes a derivation quotes: with some layers recomputed,
    those of the layers that store everything (the recomputed ones hold their input only)."""
    if p.recompute_layers is not None and p.recompute_layers < max(split):
        return (f"the {1 - recomputed_fraction(split, p.recompute_layers):.0%} of the layers without recompute; the first "
                f"{p.recompute_layers} of each stage recomputed in full")
    return f"{p.recompute} recompute"


def _fp8_rows(p: TrainingPlan) -> tuple[tuple[str, str], ...]:
    """The FP8 linears' library and scaling recipe, whose casts the memory-bound time holds."""
    rec = p.precision
    if rec.precision != "fp8":
        return ()
    library = "Transformer Engine" if p.stack.fp8_library == "transformer-engine" else "torchao"
    casts = {"tensorwise": "one cast per operand", "rowwise": "six row-wise casts per linear, backward outputs rescaled",
             "rowwise_with_gw_hp": "four casts per linear, the weight-gradient GEMM in 16 bits"}[rec.fp8_scaling]
    where = "meshplan.cost.compute.fp8_cast_bytes" if library == "Transformer Engine" else "meshplan.cost.float8"
    return (("FP8", f"{library} linears, {rec.fp8_scaling} scaling: {casts} (in memory-bound; {where})"),)


def _attention_kernel_rows(p: TrainingPlan, cal: Calibration) -> tuple[tuple[str, str], ...]:
    """The flash attention's kernel and its rates, η(L) = η∞·L/(L + L₀) forward / backward."""
    if p.attention != "flash":
        return ()
    kernel = attention_kernel_of(p.stack.kernels, p.stack.attention_kernel, cal)
    fe, fl, be, bl = attention_rates(cal, kernel)
    return (("η_attn", f"{ATTENTION_KERNEL_NAMES[kernel]}: η∞ {fe:g} / {be:g}, L₀ {fl:g} / {bl:g} keys"),)


def _variability_row(n: int) -> Derivation:
    """The GPU-to-GPU spread the compute waits for: the slowest of the ``n`` GPUs that meet every
    step (:mod:`meshplan.cost.variability`)."""
    f = straggler_factor(n)
    return Derivation(
        "time.variability", "The slowest GPU sets the pace",
        "GEMM and attention efficiencies / f(N), f(N) = 1 + (σ/μ)·z(N), z(N) ≈ Φ⁻¹((N − 0.375)/(N + 0.25))",
        (("N", f"{n:,} GPUs, all of which meet every step"), ("σ/μ", f"{THROUGHPUT_CV:.1%} spread of one SKU's sustained throughput"),
         ("z(N)", f"{expected_max_z(n):.3f} (expected largest of N standard normals, Blom 1958)")),
        f"f = {f:.4f}: compute {100 * (f - 1):.2f} % slower than one GPU's",
        "meshplan.cost.variability; Sinha et al. SC'22 (8 % average variation between a cluster's GPUs)")


def grad_accumulation_rows(est, terms) -> list[Derivation]:
    """``time.grad_accumulation``: the pass that joins each micro-batch's weight gradients to the
    step's (:mod:`meshplan.cost.grad_accumulation`); none when the GEMMs fuse it or the rule set it
    aside."""
    p, rec = est.plan, est.plan.precision
    kind = terms.accumulation
    per = grad_accumulation_bytes(kind, rec.weight_bytes, rec.grad_bytes)
    if not per:
        return []
    dense, moe, _, _ = terms.grad_accumulation_passes(p.tp, p.pp, p.ep)
    m = p.num_microbatches
    share = terms.accumulation_share(m)
    how = {"buffer": f"w + 2·g = {rec.weight_bytes} + 2·{rec.grad_bytes} (main_grad.add_ after every micro-batch)",
           "fsdp2": f"w + 2·g = {rec.weight_bytes} + 2·{rec.grad_bytes} (FSDP2's unsharded accumulator in the reduce dtype; "
                    f"the first micro-batch copies up, w + g)",
           "autograd": f"3·w = 3·{rec.weight_bytes} (AccumulateGrad's in-place add, from the second micro-batch)"}[kind]
    model, n_moe = est.model, est.model.n_moe_layers
    parts = ([("P_layer", f"{layer_params_per_rank(model, p.tp):,} parameters a dense layer on a rank", dense, "a dense layer")]
             if model.n_layers > n_moe else [])
    if n_moe:
        parts.append(("P_moe", f"{layer_params_per_rank(model, p.tp, True, p.ep):,} parameters an MoE layer on a rank", moe,
                      "an MoE layer"))
    return [Derivation(
        "time.grad_accumulation", "Gradients joined to the step's, per micro-batch",
        "share × bytes per parameter × P_layer / (W·η_hbm), inside each layer's backward",
        (("kind", kind), ("bytes per parameter", f"{per}: {how}"), *((k, v) for k, v, _, _ in parts),
         ("share", f"{share:.4f} of m = {m} micro-batches")),
        "; ".join(f"{fmt_seconds(t * share)} {what} per micro-batch ({fmt_seconds(t)} a pass)" for _, _, t, what in parts),
        "meshplan.cost.grad_accumulation")]


def _stack_row(p: TrainingPlan) -> Derivation:
    """The software stack the figures assume: its profile, the fields set over it, and its
    behaviour as it applies to the plan."""
    s = p.stack
    set_ = stack_overrides(s, p)
    return Derivation(
        "plan.stack", "Software stack",
        "the profile, the fields set over it, each field as it applies to this plan (meshplan.specs.stack.RULES)",
        (("profile", s.name), ("set", settings_text(set_) or "nothing")) +
        tuple((k, field_text(v)) for k, v in s.behaviour().items()),
        s.name, "catalog/data/stacks.yaml; `meshplan stacks NAME` gives each value's source")


def derivations(est, ops: OpTimes, la, tp_one: float, p2p: float, lt,
                 cp_comm: tuple[float, float], fsdp_terms: tuple | None) -> list[Derivation]:
    """Formula, symbols and values of the headline figures of ``est`` (an
    :class:`~meshplan.estimate.Estimate`: what ``meshplan explain`` shows);
    ``fsdp_terms``: a layer's ZeRO-3 (all-gather, reduce-scatter, FSDP2 copies) when weights are
    sharded per layer, else None."""
    m, p, pc, f = est.model, est.plan, est.params, est.flops
    tok = p.tokens_per_step
    worst = max(est.stages, key=lambda st: st.total)
    rec = p.precision
    shard = p.shard_degree
    d: list[Derivation] = [_stack_row(p)]
    if pc.moe_layer is None:
        d.append(Derivation(
            "model.params_total", "Parameters",
            "L·(attention + MLP + norms) + V·h (embedding) + final norm + V·h (LM head unless tied)",
            (("L", f"{m.n_layers} layers"), ("per layer", f"{pc.layer.total:,}"), ("V·h", f"{pc.embedding:,}"),
             ("LM head", f"{pc.lm_head:,}")),
            f"{pc.total:,}", "meshplan.cost.params; exact against published totals"))
    else:
        d.append(Derivation(
            "model.params_total", "Parameters (mixture of experts)",
            "L_d·(dense layer) + L_m·(attention + router + E experts + shared expert + norms) + V·h + final norm + V·h",
            (("L_d, L_m", f"{m.n_layers - pc.n_moe_layers} dense, {pc.n_moe_layers} MoE layers"),
             ("per layer", f"{pc.layer.total:,} dense, {pc.moe_layer.total:,} MoE"),
             ("E, k", f"{m.n_experts} experts, {m.experts_per_token} per token"), ("V·h", f"{pc.embedding:,}"),
             ("LM head", f"{pc.lm_head:,}")),
            f"{pc.total:,} ({pc.active:,} active per token)",
            "meshplan.cost.params; exact against transformers; Fedus et al. 2022 Sec. 2"))
    d.append(Derivation(
        "flops.breakdown.dense", "Dense FLOPs per step", "6 · N_mm · T",
        (("N_mm", f"{pc.active_matmul:,} matmul parameters (LM head included"
                  + (f"; the router, shared expert and {m.experts_per_token} of {m.n_experts} experts)" if m.is_moe else ")")),
         ("T", f"{tok:,} tokens per step")),
        f"{f.dense:.4e} FLOP", "Kaplan et al. 2020 Sec. 2.1; Narayanan et al. 2021 Eq. 3"
        + ("; Fedus et al. 2022 (active experts only)" if m.is_moe else "")))
    per = 6 if p.attention_flops == "causal" else 12
    d.append(Derivation(
        "flops.breakdown.attention", "Attention FLOPs per step (QKᵀ and A·V)", f"{per} · L · a · d · s² · B  ({p.attention_flops})",
        (("L", str(m.n_layers)), ("a·d", str(m.q_dim) if not m.is_mla else f"{m.n_heads} x ({m.head_dim} + {m.value_head_dim}) / 2 (MLA: QKᵀ over d, A·V over d_v)"), ("s", str(p.seq_len)), ("B", f"{p.global_batch} sequences")),
        f"{f.attention:.4e} FLOP", "forward 4·s²·a·d per layer per sequence (half when causal), backward 2x forward"))
    d.append(Derivation(
        "flops.hardware_per_step", "Hardware FLOPs per step", "model FLOPs + recompute FLOPs",
        (("model", f"{f.model:.4e}"), ("recompute", f"{f.recompute:.4e} ({p.recompute})")),
        f"{f.hardware:.4e} FLOP", "HFU basis; " + {
            "none": "no recompute",
            "selective": "one extra attention-core forward (Korthikanti et al. 2022 Sec. 5)",
            "op": "every second layer matmul repeated (torchtitan's op-level checkpointing)",
            "full": "the layers' whole forward repeated (Narayanan et al. 2021 Eq. 3)" + (
                "" if p.recompute_layers is None else
                f", for the first {p.recompute_layers} layers of each stage: {recomputed_fraction(est.split, p.recompute_layers):.1%} "
                "of the layers (meshplan.cost.partial_recompute)"),
        }[p.recompute]))
    d.append(Derivation(
        f"memory.stages[{worst.rank}].weights", "Weights per GPU (worst stage)",
        "P · w" + (" / N" if p.zero >= 3 else ""),
        (("P", f"{worst.params:,} parameters on rank {worst.rank} ({worst.layers} layers, TP {p.tp})"),
         ("w", f"{rec.weight_bytes} bytes ({rec.precision})"), ("N", f"{shard} (ZeRO shard degree = dp_shard x cp)")),
        fmt_bytes(worst.weights), "Rajbhandari et al. 2020 Sec. 5"))
    d.append(Derivation(
        f"memory.stages[{worst.rank}].gradients", "Gradients per GPU", "P · γ" + (" / N" if p.zero >= 2 else ""),
        (("P", f"{worst.params:,}"), ("γ", f"{rec.grad_bytes} bytes ({rec.grad_dtype})"), ("N", str(shard))),
        fmt_bytes(worst.gradients), "Rajbhandari et al. 2020 Sec. 5"))
    d.append(Derivation(
        f"memory.stages[{worst.rank}].optimizer", "Optimizer state per GPU", "P · ω" + (" / N" if p.zero >= 1 else ""),
        (("P", f"{worst.params:,}"), ("ω", f"{rec.optimizer_bytes} bytes (master {rec.master_bytes} + fp32 grad copy {rec.grad_copy_bytes} + moments {rec.state_bytes})"),
         ("N", str(shard))),
        fmt_bytes(worst.optimizer), "Rajbhandari et al. 2020; Megatron-LM distributed optimizer"))
    d.append(Derivation(
        f"memory.stages[{worst.rank}].activations", "Activations per GPU (worst stage)",
        "Σ over in-flight micro-batches of (layers of the stage × per-layer bytes) + backward working set "
        "(what recompute rebuilds; torch's context-parallel ring buffers) + the MLP backward's gradients, "
        "less what the peak's moment has freed or not yet built (the negative items)",
        (("per layer", f"{fmt_bytes(la.stored)} per micro-batch ({_stored_mode(p, est.split)}, "
                       f"{'SP' if p.sequence_parallel and p.tp > 1 else 'no SP'}, {p.attention} attention)"),
         ("in flight", f"{worst.peak_inflight} micro-batch chunks at peak ({p.schedule})"),
         ("working", fmt_bytes(worst.activation_items.get('backward_working_set', 0.0))),
         ("gradients", fmt_bytes(worst.activation_items.get('backward_gradients', 0.0))),
         *((name, fmt_bytes(v)) for name, v in worst.activation_items.items() if v < 0)),
        fmt_bytes(worst.activations), "Korthikanti et al. 2022 Table 2, derived from the layer's tensor list"))
    at_end = "merged_outputs" in worst.other_items
    d.append(Derivation(
        f"memory.stages[{worst.rank}].other", "Buffers and reserves per GPU (worst stage)",
        "Σ of the items live at the peak's moment: " + (
            "the step's end, the last stage's kept outputs and their concatenation" if at_end else
            "the larger of the loss's backward and the top layer's (what that moment has freed or not yet built counts with the activations)"),
        tuple((name, fmt_bytes(v)) for name, v in worst.other_items.items() if v) or (("items", "none"),),
        fmt_bytes(worst.other),
        "meshplan.cost.compose.rank_other_items" + ("; merged_outputs_items" if at_end else "")
        + ("; reserved pools: meshplan.cost.allocator" if "all_gather_pool" in worst.other_items else "")))
    d.append(Derivation(
        "memory.peak_bytes", "Peak memory per GPU", "max over pipeline ranks of weights + gradients + optimizer + activations + other",
        tuple((f"rank {st.rank}", fmt_bytes(st.total)) for st in est.stages[:4]) + ((("...", f"{len(est.stages)} ranks"),) if len(est.stages) > 4 else ()),
        f"{fmt_bytes(est.peak_bytes)} of {fmt_bytes(est.capacity_bytes)} ({'fits' if est.fits else 'does not fit'})"))
    d.append(Derivation(
        "time.layer", "One layer, one micro-batch (forward / backward)",
        "Σ GEMM max(2MNK/(F·η), bytes/W) + attention FLOPs/(F·η_attn) + memory-bound bytes/W",
        (("GEMMs", f"{fmt_seconds(ops.fwd_gemm)} / {fmt_seconds(ops.bwd_gemm)}"),
         ("attention", f"{fmt_seconds(ops.fwd_attention)} / {fmt_seconds(ops.bwd_attention)}"),
         ("memory-bound", f"{fmt_seconds(ops.fwd_memory)} / {fmt_seconds(ops.bwd_memory)}"),)
        + _fp8_rows(p)
        + _attention_kernel_rows(p, est.calibration)
        + (("TP comm", f"{fmt_seconds(2 * tp_one)} per direction ({'AG+RS' if p.sequence_parallel else 'all-reduce'} x 2"
                       + ("; the backward also re-gathers the input projections' inputs"
                          if p.sequence_parallel and p.stack.tp_backward_overlap else "") + ")"),
         ("TP exposed", f"{fmt_seconds(lt.tp_fwd)} / {fmt_seconds(lt.tp_bwd)} "
                        f"({_tp_overlap_words(p)}{', recompute repeats the forward' if p.recompute == 'full' else ''})"))
        + _cp_rows(p, cp_comm, lt),
        f"{fmt_seconds(ops.fwd)} / {fmt_seconds(ops.bwd)}",
        "meshplan.cost.compute" + ("; meshplan.cost.cp_exchange" if p.cp > 1 else "")))
    d.append(_variability_row(est.cluster.num_gpus))
    d.extend(_fsdp_rows(est, lt, fsdp_terms))
    t = est.time
    gpu = est.cluster.gpu
    ctas = tp_overlap_ctas(p.stack.tp_overlap_kind)
    kinds = {"tp": "TP", "cp": "CP", "fsdp": "FSDP", "dp_grad": "DP grad", "param_gather": "weight AG"}
    d.append(Derivation(
        "time.contention", "Compute slowed by the communication it hides",
        "Σ over hidden collectives of T_h · n_c / n_SM",
        (("n_SM", f"{gpu.sm_count} SMs ({gpu.name})"),
         ("n_c", f"{NCCL_CTAS} NCCL CTAs (FSDP, CP, DP)" + (
             f"; TP {ctas:g} ({'copy engines' if p.stack.tp_overlap_kind == 'micro-pipeline' else 'userbuffers: all-gather 1, reduce-scatter 16'})"
             if p.stack.tp_comm_overlap and p.tp > 1 else "; TP's backward overlap runs on them too" if p.stack.tp_backward_overlap else "")),)
        + tuple((f"T_h {kinds[k]}", f"{fmt_seconds(v)} hidden → +{fmt_seconds(t.contention[k])}")
                for k, v in t.hidden_comm.items() if v > 0),
        f"{fmt_seconds(t.contention_s)} per step (the layers' in compute, the DP synchronization's in DP comm and weight all-gather)",
        "meshplan.cost.contention; NCCL channels (one CTA each), Transformer Engine userbuffers' num_sm"))
    d.append(Derivation(
        "time.step_s", "Step time", "pipeline makespan (critical rank) + exposed DP comm + optimizer + exposed weight all-gather"
        + (" + FP8 weight casts (first micro-batch)" if t.fp8_weight_cast_s else ""),
        (("makespan", f"{fmt_seconds(est.sim.finish[t.critical_rank])} on rank {t.critical_rank} ({p.schedule}, p={p.pp}, m={p.grad_accum}, v={p.vpp}, "
                      f"{runtime_words(p.schedule, p.pp, p.grad_accum, p.vpp, p.stack.pipeline_runtime)})"),
         ("p2p", f"{fmt_seconds(p2p)} per stage boundary"),
         ("bubble", f"{fmt_seconds(t.pipeline_bubble_s)} idle; fraction {t.bubble_fraction:.3f}, overhead {t.bubble_overhead:.3f}"),
         ("dp comm", fmt_seconds(t.dp_comm_s)), ("optimizer", fmt_seconds(t.optimizer_s)),
         ("param gather", fmt_seconds(t.param_gather_s)))
        + ((("FP8 casts", f"{fmt_seconds(t.fp8_weight_cast_s)}: the {est.model.n_layers} layers' weights cast and transposed "
                          "once per step (Megatron-Core's is_first_microbatch)"),) if t.fp8_weight_cast_s else ()),
        fmt_seconds(t.step_s), "event simulation of the schedule (meshplan.pipeline.simulate"
        + ("; lockstep over torch's grid: meshplan.pipeline.lockstep)" if runs_lockstep(p.schedule, p.pp, p.stack.pipeline_runtime)
           else "; DeepSpeed's steps: meshplan.pipeline.deepspeed_steps)" if runs_deepspeed(p.schedule, p.pp, p.stack.pipeline_runtime)
           else "; Megatron-LM's blocking exchanges: meshplan.pipeline.blocking)" if p.stack.pipeline_runtime == "blocking"
           else ")")))
    d.append(Derivation(
        "throughput.mfu", "Model FLOPs utilization", "model FLOPs per step / (GPUs × dense peak × step time)",
        (("model FLOPs", f"{f.model:.4e}"), ("GPUs", str(p.num_gpus)), ("peak", f"{est.mfu_peak / TFLOPS:.1f} TFLOP/s"),
         ("step", fmt_seconds(t.step_s))),
        f"{est.mfu:.4f} ({est.model_tflops_per_gpu:.1f} TFLOP/s per GPU)", "Chowdhery et al. 2022 (PaLM) App. B"))
    run = est.run_cost()
    if run:
        d.append(Derivation(
            "run.days", "Days for the token budget", "tokens / tokens per step × step time / 86400",
            (("tokens", f"{run['tokens']:.4e}"), ("per step", f"{tok:,}"), ("step", fmt_seconds(t.step_s))),
            f"{run['days']:.2f} days; {run['gpu_hours']:.4e} GPU-hours", ""))
    return d
