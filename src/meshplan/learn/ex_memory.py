"""Exercises on ZeRO, mixed precision and number formats (seed 001).

Model state comes from :func:`meshplan.calc.checkpoint.zero_state` (which reads
:func:`meshplan.cost.memory.model_state_bytes` and the bytes per parameter of
:class:`~meshplan.specs.plan.PrecisionRecipe`), formats from :mod:`meshplan.calc.formats`, the
loss scale from :func:`meshplan.calc.loss_scale.loss_scale` (torch's GradScaler rule).
"""

from __future__ import annotations

from meshplan.calc.checkpoint import zero_state
from meshplan.calc.formats import FORMATS, formats, get_format
from meshplan.calc.loss_scale import ScalerConfig, loss_scale
from meshplan.calc.result import derive, num, size
from meshplan.catalog import load_gpu, load_model
from meshplan.cost.activations import head_activation_bytes, loss_grad_bytes
from meshplan.learn.model import Choice, Numeric, Ordering
from meshplan.learn.registry import Problem, Variant, command, derivs, exercise, url
from meshplan.specs.plan import PrecisionRecipe
from meshplan.units import GB, GiB, MS

# mixed-precision Adam as 001 counts it: fp16 weights and gradients, fp32 master copy and moments (2 + 2 + 12)
MIXED = PrecisionRecipe(precision="fp16", grad_dtype="fp16", master_weights=True)
PARAMS = [1.3e9, 7e9, 13e9, 30e9, 70e9]


def _zero_links(P: float, stage: int, dp: int, bw: float | None = None):
    opts = dict(params=f"{P / 1e9:g}B", zero=stage, dp=dp, precision="fp16", grad_dtype="fp16",
                bw=None if bw is None else bw / GB)
    return command("calc", "zero", **opts, explain=True), url("/calc/zero", **opts)


def _zero(stage: int):
    def build(v: Variant) -> Problem:
        P = v.pick(7e9, PARAMS)
        dp = 1 if stage == 0 else v.pick(64, [8, 16, 32, 64, 128, 256])
        r = zero_state(P, MIXED, stage, dp)
        cmd, link = _zero_links(P, stage, dp)
        where = "no ZeRO (plain data parallelism)" if stage == 0 else f"ZeRO stage {stage} over N = {dp} GPUs"
        return Problem(
            prompt=f"{num(P / 1e9)}B parameters, mixed-precision Adam (fp16 weights and gradients, fp32 master "
                   f"weights and two fp32 moments), {where}. How many GB of model state (weights + gradients + "
                   f"optimizer) does each GPU hold?",
            answer=Numeric(r.data["total_bytes"], "GB", GB, 0.01),
            solution=derivs(r, "zero.state"),
            hints=("Bytes per parameter: 2 (weights) + 2 (gradients) + 12 (master + two moments).",
                   "Stage 1 shards the optimizer, 2 also the gradients, 3 also the weights."),
            params={"params": P, "zero": stage, "dp": dp}, command=cmd, url=link,
        )
    return build


for _stage, _diff in ((0, "easy"), (1, "easy"), (2, "medium"), (3, "medium")):
    exercise(f"zero-{_stage}", "zero", f"Model state per GPU, ZeRO-{_stage}" if _stage else "Model state per GPU without ZeRO",
             _diff, f"001, ZeRO, question {_stage + 1}")(_zero(_stage))


@exercise("zero3-comm", "zero", "ZeRO-3's communication per step", "medium", "001, ZeRO, question 5")
def zero3_comm(v: Variant) -> Problem:
    P = v.pick(7e9, PARAMS)
    dp = v.pick(64, [8, 16, 64, 256])
    bw = v.pick(100 * GB, [50 * GB, 100 * GB, 200 * GB, 450 * GB])
    r = zero_state(P, MIXED, 3, dp, bw)
    cmd, link = _zero_links(P, 3, dp, bw)
    return Problem(
        prompt=f"ZeRO-3, {num(P / 1e9)}B parameters in fp16, N = {dp} GPUs, {num(bw / GB)} GB/s per GPU. Each step "
               f"all-gathers the weights in the forward and again in the backward, and reduce-scatters the gradients. "
               f"How long does that communication take per step (ring, bandwidth only), in ms?",
        answer=Numeric(r.data["comm_time_s"], "ms", MS, 0.01),
        solution=derivs(r, "zero.comm", "zero.comm_time"),
        hints=("Each all-gather or reduce-scatter sends (N−1)/N of the buffer per GPU.", "Three of them, of 2·P bytes each."),
        params={"params": P, "dp": dp, "bw": bw}, command=cmd, url=link,
        explanation="ZeRO-1/2 send 2(N−1)/N·2P (one all-reduce): ZeRO-3 costs 1.5× the communication.",
    )


@exercise("zero-fit", "zero", "The smallest ZeRO stage that fits", "medium", "001, ZeRO, question 6")
def zero_fit(v: Variant) -> Problem:
    P = v.pick(30e9, [7e9, 13e9, 30e9, 70e9])
    dp = v.pick(8, [8, 16, 64])
    act = v.pick(20e9, [10e9, 20e9, 30e9])
    gpu = load_gpu("a100-sxm-80gb")
    states = [zero_state(P, MIXED, z, dp) for z in range(4)]
    fits = [z for z in range(4) if states[z].data["total_bytes"] + act <= gpu.hbm_bytes]
    options = [f"ZeRO-{z}" for z in range(4)] + ["none of them"]
    right = fits[0] if fits else 4
    return Problem(
        prompt=f"{num(P / 1e9)}B parameters, mixed-precision Adam (2 + 2 + 12 bytes per parameter), {dp} A100 80GB "
               f"GPUs ({num(gpu.hbm_bytes / GiB)} GiB = {num(gpu.hbm_bytes / GB)} GB each), {num(act / GB)} GB of "
               f"activations per GPU. What is the smallest ZeRO stage with which model state + activations fit?",
        answer=Choice(tuple(options), right),
        solution=[d for r in states for d in derivs(r, "zero.state")]
                 + [derive("zero.fit", "fits when", "state + activations ≤ memory",
                           [("activations", size(act)), ("memory", size(gpu.hbm_bytes))], options[right])],
        hints=("Compute the state per GPU for each stage.", "An 80GB A100 holds 80 GiB."),
        params={"params": P, "dp": dp, "activations_bytes": act, "memory_bytes": gpu.hbm_bytes},
        command=_zero_links(P, 3, dp)[0], url=_zero_links(P, 3, dp)[1],
    )


@exercise("mixed-vs-fp32", "precision", "Does mixed precision save model-state memory?", "medium", "001, mixed precision, question 3")
def mixed_vs_fp32(v: Variant) -> Problem:
    P = v.pick(13e9, PARAMS)
    grad = v.pick("fp16", ["fp16", "bf16", "fp32"])
    mixed = PrecisionRecipe(precision="fp16" if grad == "fp16" else "bf16", grad_dtype=grad, master_weights=True)
    fp32 = PrecisionRecipe(precision="fp32", grad_dtype="fp32")
    a, b = zero_state(P, mixed, 0, 1), zero_state(P, fp32, 0, 1)
    ratio = a.data["total_bytes"] / b.data["total_bytes"]
    return Problem(
        prompt=f"{num(P / 1e9)}B parameters trained with Adam. Mixed precision keeps {mixed.precision} weights, {grad} "
               f"gradients, an fp32 master copy and two fp32 moments; pure fp32 keeps fp32 weights, gradients and "
               f"moments. What is the ratio of model-state memory, mixed / fp32?",
        answer=Numeric(ratio, "×", 1.0, 0.01),
        solution=derivs(a, "zero.state") + derivs(b, "zero.state"),
        hints=("Count the bytes per parameter of both recipes.",),
        params={"params": P, "grad_dtype": grad},
        command=command("calc", "zero", params=f"{P / 1e9:g}B", zero=0, dp=1, precision=mixed.precision, grad_dtype=grad),
        url=url("/calc/zero", params=f"{P / 1e9:g}B", zero=0, dp=1, precision=mixed.precision, grad_dtype=grad),
        explanation="The savings of mixed precision are in activations, communication and speed, not in model state.",
    )


QUANTITIES = {"min_normal": "smallest positive normal number", "max": "largest finite number",
              "eps": "machine epsilon (the gap between 1 and the next number)"}


@exercise("format-figure", "precision", "A figure of a floating-point format", "easy", "001, mixed precision, question 1")
def format_figure(v: Variant) -> Problem:
    name = v.pick("fp16", ["fp16", "bf16", "fp8-e4m3", "fp8-e5m2", "fp32"])
    what = v.pick("min_normal", list(QUANTITIES))
    r = formats([name])
    f = get_format(name)
    key = {"min_normal": "min", "max": "max", "eps": "eps"}[what]
    return Problem(
        prompt=f"{name} has {f.exp_bits} exponent bits (bias {f.bias}) and {f.man_bits} mantissa bits"
               + (" and no infinities (only S.1111.111 is NaN)" if f.finite_only else "")
               + f". What is its {QUANTITIES[what]}?",
        answer=Numeric(getattr(f, what), "", 1.0, 0.001),
        solution=derivs(r, f"formats.{name}.{key}"),
        hints=("Bias β = 2^(e−1) − 1; the smallest normal is 2^(1−β).", "Answer in scientific notation, e.g. 6.1e-5."),
        params={"format": name, "quantity": what}, command=command("calc", "formats", name, explain=True),
        url=url("/calc/formats", names=name),
    )


@exercise("fp8-activations", "precision", "Activation memory saved by FP8", "medium", "001, mixed precision, question 5")
def fp8_activations(v: Variant) -> Problem:
    b = v.pick(4, [1, 2, 4, 8])
    s = v.pick(4096, [2048, 4096, 8192])
    d = v.pick(8192, [4096, 8192, 16384])
    L = v.pick(80, [32, 80, 126])
    elements = 2.0 * b * s * d * L
    r = formats(["fp16", "fp8-e4m3"], elements)
    saved = r.data["formats"][0]["tensor_bytes"] - r.data["formats"][1]["tensor_bytes"]
    shape = f"2x{b}x{s}x{d}x{L}"
    return Problem(
        prompt=f"Each of {L} layers stores 2·b·s·d activation values (b = {b}, s = {s}, d = {d}). How many GB does "
               f"storing them in FP8 instead of FP16 save?",
        answer=Numeric(saved, "GB", GB, 0.01),
        solution=derivs(r, "formats.fp16.tensor", "formats.fp8-e4m3.tensor"),
        hints=("Count the elements first.", "FP16 takes 2 bytes per element, FP8 one."),
        params={"micro_batch": b, "seq_len": s, "hidden": d, "layers": L, "elements": elements},
        command=command("calc", "formats", "fp16 fp8-e4m3", elements=shape), url=url("/calc/formats", elements=shape),
        source_note="001 says 172 GB saved: it counts bits as bytes. 2·4·4096·8192·80 = 21.5 G elements, so FP8 saves 21.5 GB (20 GiB).",
    )


@exercise("formats-by-range", "precision", "Formats by their largest value", "medium", "001, mixed precision (FP8 formats)")
def formats_by_range(v: Variant) -> Problem:
    names = v.pick(["fp16", "bf16", "fp8-e4m3", "fp8-e5m2"], [list(c) for c in _subsets(list(FORMATS), 4)])
    shown = v.shuffled(names)
    order = sorted(range(len(shown)), key=lambda i: -get_format(shown[i]).max)
    r = formats(shown)
    return Problem(
        prompt="Order these formats from the largest finite value they can hold to the smallest.",
        answer=Ordering(tuple(shown), tuple(order), "largest", "smallest"),
        solution=derivs(r, *[f"formats.{n}.max" for n in (shown[i] for i in order)]),
        hints=("Range comes from the exponent bits; the mantissa only refines it.", "e4m3 has no infinities, which buys it 448."),
        params={"formats": shown}, command=command("calc", "formats", " ".join(shown), explain=True),
        url=url("/calc/formats", names=",".join(shown)),
        explanation="That is why gradients (outliers) use e5m2 and activations (precision) e4m3.",
    )


def _subsets(items: list, k: int) -> list[tuple]:
    from itertools import combinations

    return list(combinations(items, k))


@exercise("loss-scale", "precision", "Dynamic loss scaling", "medium", "001, mixed precision (dynamic loss scaling)")
def loss_scale_walk(v: Variant) -> Problem:
    if v.fixed:
        flags, cfg = [False, True, False, False, True, False], ScalerConfig(init_scale=65536.0, growth_interval=2000)
    else:
        n = v.rng.randint(8, 16)
        flags = [v.rng.random() < 0.3 for _ in range(n)]
        cfg = ScalerConfig(init_scale=2.0 ** v.rng.randint(10, 16), growth_interval=v.rng.choice([2, 3, 4]))
    r = loss_scale(flags, cfg)
    text = "".join("1" if f else "0" for f in flags)
    return Problem(
        prompt=f"GradScaler starts at S = {num(cfg.init_scale)}, halves S on every overflowing step and doubles it after "
               f"{cfg.growth_interval:,} good steps in a row (an overflow resets the count). Overflow flags per step: "
               f"{text} (1 = overflow). What is S after the last step?",
        answer=Numeric(r.data["final_scale"], "", 1.0, 0.001),
        solution=derivs(r, "loss_scale.final"),
        hints=("Walk the steps one by one, keeping the count of good steps.",),
        params={"flags": text, "init_scale": cfg.init_scale, "growth_interval": cfg.growth_interval},
        command=command("calc", "loss-scale", overflow=text, init_scale=cfg.init_scale, growth_interval=cfg.growth_interval),
        url=url("/calc/loss-scale", overflow=text, init_scale=cfg.init_scale, growth_interval=cfg.growth_interval),
    )


@exercise("loss-compiled", "precision", "The loss's memory, eager against compiled", "medium",
          "meshplan.cost.activations; docs/model.md, Memory")
def loss_compiled(v: Variant) -> Problem:
    name = v.pick("llama3-8b", ["llama3-8b", "llama3-70b", "llama2-7b", "gemma2-9b", "qwen3-30b-a3b"])
    b = v.pick(2, [1, 2, 4])
    s = v.pick(8192, [4096, 8192])
    m = load_model(name)
    n, V, e = b * s, m.vocab_size, 2
    kept = {k: head_activation_bytes(m, b, s, 1, 1, False, e, k) for k in ("eager", "compiled")}
    grad = {k: loss_grad_bytes(m, b, s, 1, 1, k, e) for k in ("eager", "compiled")}
    total = {k: kept[k] + grad[k] for k in kept}
    saved = total["eager"] - total["compiled"]
    inputs = 2 * n * m.hidden * e  # final-norm and LM-head inputs, the same in both
    sym = [("n", f"{b} × {s:,} = {n:,} tokens"), ("V", f"{V:,}")]
    opts = dict(model=name, gpus=1, micro_batch=b, seq_len=s, global_batch_tokens=n)
    return Problem(
        prompt=f"{name} (vocabulary V = {V:,}) on one GPU, micro-batch {b} × {s:,} tokens, bf16 logits, no tensor "
               f"parallelism. torch's eager cross-entropy upcasts the logits and keeps their fp32 log-softmax for its "
               f"backward, which then holds two more fp32 logits-sized buffers (the incoming and the outgoing gradient). "
               f"A torch.compile'd loss keeps only the bf16 logits and writes their bf16 gradient. At the start of the "
               f"backward, how many GiB does compiling the loss save?",
        answer=Numeric(saved, "GiB", GiB, 0.01),
        solution=[
            derive("loss.eager", "eager: kept log-softmax + backward buffers", "4·n·V + 8·n·V", sym,
                   size(total["eager"] - inputs), "meshplan.cost.activations.head_activation_bytes, loss_grad_bytes (eager)"),
            derive("loss.compiled", "compiled: kept bf16 logits + their bf16 gradient", "2·n·V + 2·n·V", sym,
                   size(total["compiled"] - inputs), "meshplan.cost.activations.head_activation_bytes, loss_grad_bytes (compiled)"),
            derive("loss.saved", "saved by compiling the loss", "(4 + 8 − 2 − 2)·n·V = 8·n·V", sym, size(saved),
                   "torch 2.13 on CPU, tests/test_compiled_loss.py; docs/model.md, Memory"),
        ],
        hints=("Count bytes per logit (one per token and vocabulary entry): 4 for each fp32 buffer, 2 for each bf16 one.",
               "The final norm's and the LM head's inputs are the same in both: they cancel."),
        params={"model": name, "micro_batch": b, "seq_len": s, "tokens": n, "vocab": V},
        command=command("estimate", **opts, stack="torchtitan-2024"), url=url("/plan", **opts, stack="torchtitan-2024"),
        explanation=f"Eager holds {num(total['eager'] / GiB)} GiB for the head and the loss, compiled "
                    f"{num(total['compiled'] / GiB)} GiB: with a {V:,}-entry vocabulary the loss, not the layers, can "
                    f"decide whether a micro-batch fits. Rerun the command with --stack torchtitan (its loss compiled) to compare.",
    )
