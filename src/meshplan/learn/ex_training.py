"""Exercises on gradient accumulation, batch size, learning rates, overlap and checkpointing
(seeds 000 and 001).

Answers come from :mod:`meshplan.calc.batch`, :mod:`meshplan.calc.lr`,
:mod:`meshplan.calc.overlap` (a two-stream simulation), :mod:`meshplan.calc.checkpoint`,
:mod:`meshplan.calc.failures` and :mod:`meshplan.calc.cost`.
"""

from __future__ import annotations

from meshplan.calc.batch import batch
from meshplan.calc.checkpoint import checkpoint
from meshplan.calc.cost import run_seconds
from meshplan.calc.failures import Component, cluster_mtbf
from meshplan.calc.lr import scaling, schedule
from meshplan.calc.overlap import overlap
from meshplan.calc.result import derive, num, pct, secs
from meshplan.catalog import load_gpu
from meshplan.learn.model import Numeric
from meshplan.learn.registry import Problem, Variant, command, derivs, dur, exercise, url
from meshplan.specs.plan import PrecisionRecipe
from meshplan.units import DAY, GB, MS

# ---- gradient accumulation and batch size ---------------------------------------------------------


def _batch_case(v: Variant):
    target = v.pick(2048, [512, 1024, 2048, 4096, 3000])
    micro = v.pick(4, [1, 2, 4, 8])
    dp = v.pick(8, [4, 8, 16, 32])
    tm = v.pick(0.120, [0.05, 0.08, 0.12, 0.2])
    tar = v.pick(0.050, [0.01, 0.03, 0.05, 0.1])
    r = batch(target, micro, dp, tm, tar)
    opts = dict(target=target, micro=micro, dp=dp, micro_time=dur(tm), allreduce_time=dur(tar))
    return r, opts, (target, micro, dp, tm, tar)


def _batch_problem(v: Variant, ask: str, answer, keys: tuple[str, ...], hints, note: str | None = None, explanation: str = "") -> Problem:
    r, opts, (target, micro, dp, tm, tar) = _batch_case(v)
    return Problem(
        prompt=f"Target global batch {target:,} sequences, micro-batch {micro} per GPU, data-parallel degree {dp}. "
               f"A micro-batch's forward + backward takes {num(tm * 1e3)} ms; the gradient all-reduce {num(tar * 1e3)} ms. {ask}",
        answer=answer(r), solution=derivs(r, *keys), hints=hints,
        params={"target": target, "micro_batch": micro, "dp": dp, "micro_time": tm, "allreduce_time": tar},
        command=command("calc", "batch", **opts, explain=True), url=url("/calc/batch", **opts), source_note=note, explanation=explanation)


@exercise("accum-steps", "batch", "Gradient accumulation steps", "easy", "001, gradient accumulation, question 1")
def accum_steps(v: Variant) -> Problem:
    return _batch_problem(v, "How many micro-batches does each GPU accumulate per optimizer step (the batch must reach the target)?",
                          lambda r: Numeric(r.data["grad_accum"], "", 1.0, 0.0), ("batch.grad_accum",),
                          ("global batch = micro-batch × accumulation × DP.", "Round up when it does not divide."))


@exercise("accum-comm-saved", "batch", "Communication saved by accumulation", "easy", "001, gradient accumulation, question 2")
def accum_saved(v: Variant) -> Problem:
    return _batch_problem(v, "Without accumulation every micro-batch would be its own optimizer step with its own all-reduce. "
                             "How many seconds of all-reduce does accumulation save per global batch?",
                          lambda r: Numeric(r.data["comm_saved_s"], "s", 1.0, 0.01), ("batch.grad_accum", "batch.no_accum"),
                          ("With accumulation: one all-reduce per m micro-batches.",))


@exercise("accum-step-time", "batch", "Step time with accumulation", "medium", "001, gradient accumulation, question 3")
def accum_step(v: Variant) -> Problem:
    return _batch_problem(v, "What is the optimizer step's wall-clock time, in ms, with the all-reduce once at the end?",
                          lambda r: Numeric(r.data["step_s"], "ms", MS, 0.005), ("batch.grad_accum", "batch.step", "batch.comm_share"),
                          ("m micro-batches one after another, then one all-reduce.",),
                          note="001 writes 64 × 120 + 50 = 7731 ms: it is 7,730 ms (264.9 sequences/s).")


@exercise("critical-batch", "batch", "Efficiency against the critical batch", "medium", "000, exercise 6")
def critical_batch(v: Variant) -> Problem:
    B = v.pick(4e6, [1e6, 2e6, 4e6, 8e6, 16e6])
    bc = v.pick(2e6, [1e6, 2e6, 5e6, 10e6])
    r = batch(B, 1, 1, critical=bc)
    return Problem(
        prompt=f"A batch of {num(B / 1e6)}M tokens with a critical batch of {num(bc / 1e6)}M tokens (McCandlish et al. 2018: "
               f"steps S = S_min·(1 + B_crit/B)). What is the step efficiency S_min/S, in %?",
        answer=Numeric(r.data["step_efficiency"], "%", 0.01, 0.005),
        solution=derivs(r, "batch.step_efficiency", "batch.compute_efficiency"),
        hints=("S_min/S = 1 / (1 + B_crit/B).",),
        params={"batch_tokens": B, "critical_tokens": bc},
        command=command("calc", "batch", target=f"{B / 1e6:g}M", critical_batch=f"{bc / 1e6:g}M", explain=True),
        url=url("/calc/batch", target=f"{B / 1e6:g}M", critical_batch=f"{bc / 1e6:g}M"),
        source_note="000 uses η = 1 − B_crit/(2B) above the critical batch and gets 75%, 69%, 69%: that formula has no basis. "
                    "McCandlish et al. give step efficiency B/(B + B_crit) = 66.7%, 61.5%, 61.5% (and compute efficiency "
                    "B_crit/(B + B_crit) = 33.3%, 38.5%, 38.5%).",
    )


# ---- learning rate -------------------------------------------------------------------------------


def _lr_case(v: Variant):
    lr0 = v.pick(3e-4, [1e-4, 3e-4, 6e-4, 1e-3])
    B0 = v.pick(256, [128, 256, 512])
    k = v.pick(8, [2, 4, 8, 16])
    steps = v.pick(100_000, [50_000, 100_000, 200_000])
    r = scaling(lr0, B0, B0 * k, 1000, steps)
    opts = dict(base_lr=lr0, base_batch=B0, batch=B0 * k, steps=steps)
    return r, opts, (lr0, B0, B0 * k, steps)


def _lr_problem(v: Variant, ask: str, field: str, keys: tuple[str, ...], hints, rtol: float = 0.01) -> Problem:
    r, opts, (lr0, B0, B, steps) = _lr_case(v)
    return Problem(
        prompt=f"The LR was tuned to {num(lr0)} at batch {B0}; the new batch is {B}. {ask}",
        answer=Numeric(r.data[field], "", 1.0, rtol), solution=derivs(r, *keys), hints=hints,
        params={"base_lr": lr0, "base_batch": B0, "batch": B, "steps": steps},
        command=command("calc", "lr", **opts, explain=True), url=url("/calc/lr", **opts))


@exercise("lr-linear", "lr", "Linear LR scaling", "easy", "001, LR scaling, question 1")
def lr_linear(v: Variant) -> Problem:
    return _lr_problem(v, "What LR does linear scaling give?", "linear_lr", ("lr.linear",), ("η = η₀·B/B₀ (Goyal et al. 2017).",))


@exercise("lr-sqrt", "lr", "Square-root LR scaling", "easy", "001, LR scaling, question 2")
def lr_sqrt(v: Variant) -> Problem:
    return _lr_problem(v, "What LR does square-root scaling give?", "sqrt_lr", ("lr.sqrt",), ("η = η₀·√(B/B₀).",))


@exercise("lr-warmup", "lr", "Warmup steps for a larger batch", "easy", "001, LR scaling, question 3")
def lr_warmup(v: Variant) -> Problem:
    return _lr_problem(v, "With the heuristic warmup = (B/B₀) × 1,000 steps, how many warmup steps?", "warmup_steps",
                       ("lr.warmup", "lr.warmup_fraction"), ("Scale the 1,000 steps by the batch ratio.",), rtol=0.0)


@exercise("lr-cosine", "lr", "LR on a warmup + cosine schedule", "medium", "001 (cosine schedule) and 003 (Llama 3 405B schedule)")
def lr_cosine(v: Variant) -> Problem:
    peak = v.pick(8e-5, [1e-4, 3e-4, 8e-5, 1.5e-4])
    warmup = v.pick(8000, [1000, 2000, 8000])
    total = v.pick(1_200_000, [100_000, 500_000, 1_200_000])
    floor = v.pick(8e-7, [0.0, peak / 100, peak / 10])
    t = v.pick(600_000, [warmup // 2, total // 4, total // 2, 3 * total // 4])
    r = schedule(peak, warmup, total, floor, "cosine", at=[t])
    lr = r.data["at"][0]["lr"]
    opts = dict(peak=peak, warmup=warmup, steps=total, floor=floor, at=t)
    return Problem(
        prompt=f"Linear warmup to η_max = {num(peak)} over {warmup:,} steps, then cosine decay to {num(floor)} at step "
               f"{total:,}. What is the LR at step {t:,}?",
        answer=Numeric(lr, "", 1.0, 0.01),
        solution=derivs(r, "lr.schedule") + [derive("lr.at", f"η at step {t:,}", "the schedule's formula at t",
                                                    [("t", f"{t:,}")], num(lr))],
        hints=("Find where t is: in the warmup, η = η_max·(t+1)/w.",
               "In the decay, x = (t − w)/(T − w) and η = η_min + ½(η_max − η_min)(1 + cos πx)."),
        params={"peak": peak, "warmup": warmup, "total": total, "floor": floor, "step": t},
        command=command("calc", "lr", **opts, explain=True), url=url("/calc/lr", **opts),
    )


# ---- overlap --------------------------------------------------------------------------------------


@exercise("overlap-buckets", "overlap", "Bucketed all-reduce behind the backward", "easy", "001, communication overlap, question 2")
def overlap_buckets(v: Variant) -> Problem:
    layers = v.pick(40, [20, 32, 40, 80])
    per = v.pick(5e-3, [2e-3, 5e-3, 8e-3])
    ar = v.pick(1.5e-3, [0.5e-3, 1.5e-3, 3e-3, 4e-3])
    r = overlap(layers * per, layers * ar, layers, "ddp")
    opts = dict(compute=dur(layers * per), comm=dur(layers * ar), buckets=layers, mode="ddp")
    return Problem(
        prompt=f"The backward takes {num(per * 1e3)} ms per layer over {layers} layers; each layer's gradient bucket "
               f"is all-reduced in {num(ar * 1e3)} ms as soon as it is ready (one all-reduce at a time). What fraction "
               f"of the communication is hidden behind the backward, in %?",
        answer=Numeric(r.data["overlap_fraction"], "%", 0.01, 0.005),
        solution=derivs(r, "overlap.exposed", "overlap.fraction"),
        hints=("The last bucket's all-reduce has nothing left to hide behind.",),
        params={"layers": layers, "compute_per_layer": per, "comm_per_layer": ar},
        command=command("calc", "overlap", **opts, explain=True), url=url("/calc/overlap", **opts),
    )


@exercise("overlap-mfu", "overlap", "MFU with exposed communication", "medium", "001, communication overlap, question 4")
def overlap_mfu(v: Variant) -> Problem:
    compute = v.pick(0.242, [0.1, 0.242, 0.4, 0.8])
    comm = v.pick(0.350, [0.05, 0.2, 0.35, 0.6])
    mfu = v.pick(0.5, [0.4, 0.5, 0.6])
    r = overlap(compute, comm, 1, "ddp", mfu)
    opts = dict(compute=dur(compute), comm=dur(comm), mfu=mfu)
    return Problem(
        prompt=f"A step computes for {num(compute * 1e3)} ms at {pct(mfu, 0)} MFU, then all-reduces for {num(comm * 1e3)} ms "
               f"with no overlap. What is the MFU of the whole step, in %?",
        answer=Numeric(r.data["effective_mfu"], "%", 0.01, 0.01),
        solution=derivs(r, "overlap.step", "overlap.mfu"),
        hints=("MFU scales with compute time / step time.",),
        params={"compute_s": compute, "comm_s": comm, "mfu": mfu},
        command=command("calc", "overlap", **opts, explain=True), url=url("/calc/overlap", **opts),
    )


@exercise("fsdp-exposed", "overlap", "FSDP all-gathers behind a short forward", "hard", "000, exercise 3")
def fsdp_exposed(v: Variant) -> Problem:
    params = v.pick(405e9, [70e9, 405e9])
    layers = 126 if params == 405e9 else 80
    tokens = v.pick(1e6, [1e6, 4e6, 16e6])
    gpus = v.pick(16384, [2048, 8192, 16384])
    gather = v.pick(200e9, [2 * params, params])
    bw = 50 * GB
    gpu = load_gpu("h100-sxm-80gb")
    compute = run_seconds(2 * params * tokens, gpus, gpu.peak("bf16"), 0.5)
    comm = gather / bw
    r = overlap(compute, comm, layers, "fsdp")
    opts = dict(compute=dur(compute), comm=dur(comm), buckets=layers, mode="fsdp")
    return Problem(
        prompt=f"A {num(params / 1e9)}B model of {layers} layers; a batch of {num(tokens / 1e6)}M tokens is spread over "
               f"{gpus:,} H100s at 50% MFU (989.4 TFLOP/s dense BF16), so the forward takes 2·N·tokens FLOPs shared by "
               f"all GPUs. FSDP all-gathers {num(gather / GB)} GB of weights per forward at 50 GB/s, layer by layer, one "
               f"layer ahead. How many seconds of all-gather stay exposed in the forward?",
        answer=Numeric(r.data["exposed_s"], "s", 1.0, 0.01),
        solution=[derive("fsdp.compute", "forward compute per GPU", "2·N·T / (G·P·u)",
                         [("N", num(params)), ("T", num(tokens)), ("G", f"{gpus:,}"), ("P", "989.4 TFLOP/s"), ("u", "50%")],
                         secs(compute), "meshplan.calc.cost.run_seconds")] + derivs(r, "overlap.exposed", "overlap.fraction"),
        hints=("Per layer: compute c = forward/L, all-gather m = gather/(L·B).", "When m > c every layer leaks m − c."),
        params={"params": params, "layers": layers, "tokens": tokens, "gpus": gpus, "gather_bytes": gather, "bw": bw},
        command=command("calc", "overlap", **opts, explain=True), url=url("/calc/overlap", **opts),
        source_note="000 puts the whole batch's forward on one GPU (818 s) and concludes that 0.5% overlap suffices. "
                    "Shared by 16,384 GPUs the forward takes 0.1 s, and the 4 s all-gather is communication-bound: "
                    "3.9 s stay exposed.",
    )


# ---- checkpointing and failures -------------------------------------------------------------------

MIXED = PrecisionRecipe(precision="fp16", grad_dtype="fp16", master_weights=True)


def _ckpt_case(v: Variant):
    P = v.pick(70e9, [7e9, 13e9, 70e9, 405e9])
    bw = v.pick(10 * GB, [2 * GB, 5 * GB, 10 * GB, 20 * GB])
    mtbf = v.pick(24 * 3600.0, [6 * 3600.0, 12 * 3600.0, 24 * 3600.0, 72 * 3600.0])
    gpus = v.pick(512, [256, 512, 1024, 4096])
    price = v.pick(2.0, [1.5, 2.0, 3.0])
    r = checkpoint(P, MIXED, bw, mtbf=mtbf, gpus=gpus, price=price)
    opts = dict(params=f"{P / 1e9:g}B", precision="fp16", grad_dtype="fp16", write_bw=bw / GB, mtbf=dur(mtbf), gpus=gpus, price=price,
                recovery="read-back")
    return r, opts, {"params": P, "write_bw": bw, "mtbf": mtbf, "gpus": gpus, "price": price}


def _ckpt_problem(v: Variant, ask: str, answer, keys: tuple[str, ...], hints, note: str | None = None) -> Problem:
    r, opts, params = _ckpt_case(v)
    return Problem(
        prompt=f"{num(params['params'] / 1e9)}B parameters, mixed-precision Adam (fp16 weights, fp32 master copy, two fp32 "
               f"moments; gradients are not saved), written at {num(params['write_bw'] / GB)} GB/s; MTBF "
               f"{num(params['mtbf'] / 3600)} h; {params['gpus']:,} GPUs at ${num(params['price'])} per GPU-hour. {ask}",
        answer=answer(r), solution=derivs(r, *keys), hints=hints, params=params,
        command=command("calc", "checkpoint", **opts, explain=True), url=url("/calc/checkpoint", **opts), source_note=note)


@exercise("ckpt-size", "checkpoint", "Checkpoint size", "easy", "001, checkpointing, question 1")
def ckpt_size(v: Variant) -> Problem:
    return _ckpt_problem(v, "How many GB is one checkpoint?", lambda r: Numeric(r.data["size_bytes"], "GB", GB, 0.01),
                         ("checkpoint.size",), ("2 + 4 + 4 + 4 bytes per parameter.",))


@exercise("ckpt-write", "checkpoint", "Checkpoint write time", "easy", "001, checkpointing, question 2")
def ckpt_write(v: Variant) -> Problem:
    return _ckpt_problem(v, "How many seconds does one writer take to write it?", lambda r: Numeric(r.data["write_time_s"], "s", 1.0, 0.01),
                         ("checkpoint.size", "checkpoint.write_time"), ("Size / bandwidth.",))


@exercise("ckpt-young", "checkpoint", "Young's optimal checkpoint interval", "medium", "001, checkpointing, question 3")
def ckpt_young(v: Variant) -> Problem:
    return _ckpt_problem(v, "What is Young's optimal checkpoint interval, in minutes?",
                         lambda r: Numeric(r.data["young_interval_s"], "min", 60.0, 0.01),
                         ("checkpoint.write_time", "checkpoint.young"), ("τ = √(2·C·M) with C the write time.",))


@exercise("ckpt-crash-cost", "checkpoint", "Money lost per crash", "hard", "001, checkpointing, question 4")
def ckpt_crash(v: Variant) -> Problem:
    return _ckpt_problem(v, "Checkpointing at Young's interval, a crash loses half an interval of work on average plus the "
                            "restart (reading the checkpoint back at the write bandwidth). How many dollars per crash?",
                         lambda r: Numeric(r.data["cost_per_crash"], "$", 1.0, 0.01),
                         ("checkpoint.young", "checkpoint.crash_cost"), ("N·p·(τ/2 + R).",),
                         note="001 says ~$618 per crash; its own inputs give $613 (34.3 min of lost work plus a 98 s "
                              "restart on 512 GPUs at $2).")


@exercise("failure-restarts", "checkpoint", "Time lost to restarts", "medium", "000, exercise 5")
def failure_restarts(v: Variant) -> Problem:
    per_day = v.pick(10, [2, 5, 10, 20, 40])
    R = v.pick(300.0, [30.0, 60.0, 300.0, 600.0])
    M = cluster_mtbf([Component("cluster", 1, DAY / per_day)])
    share = R / M
    return Problem(
        prompt=f"A cluster fails {per_day} times a day and each restart takes {num(R)} s. What fraction of the "
               f"time goes to restarts (first order, not counting the lost work), in %?",
        answer=Numeric(share, "%", 0.01, 0.01),
        solution=[derive("failures.mtbf", "cluster MTBF", "1 / Σ(count/mtbf)", [("failures", f"{per_day} per day")],
                         secs(M), "meshplan.calc.failures.cluster_mtbf"),
                  derive("failures.restarts", "time lost to restarts", "R / M", [("R", secs(R)), ("M", secs(M))], pct(share),
                         "Young 1974 (the restart term of the first-order waste)")],
        hints=("MTBF = 1 day / failures per day.",),
        params={"failures_per_day": per_day, "recovery_s": R},
        command=command("calc", "failures", work="54d", mtbf=dur(M), checkpoint_time="98s", recovery=dur(R)),
        url=url("/calc/failures", work="54d", mtbf=dur(M), checkpoint_time="98s", recovery=dur(R)),
        source_note="000 then applies the shares to '85 days for 2T tokens'; Llama 3 405B ran about 54 days for 15.6T "
                    "tokens: 1.88 days lost with 5-minute restarts, 0.19 with 30 s, 1.69 days saved.",
    )
