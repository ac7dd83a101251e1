"""The capstone of seed 001: Llama 3 405B on 16,384 H100s (with seed 003's published layout).

The fixed variants use the ``llama3-405b-16k`` preset's layout (TP 8, CP 1, PP 16, DP 128, Llama
3's rank order); the random ones vary the cluster, the layout or the model. Answers come from
:mod:`meshplan.pipeline.stages` (layer split), :mod:`meshplan.cost.params` (exact parameters per
rank), :mod:`meshplan.calc.cost` (6·N·D, days, dollars, energy),
:mod:`meshplan.calc.collective` and the pipeline simulator.
"""

from __future__ import annotations

from meshplan.calc.collective import Network, collective
from meshplan.calc.cost import cost
from meshplan.calc.result import derive, num, size
from meshplan.catalog import load_model
from meshplan.cost.params import layer_params_per_rank
from meshplan.learn.ex_comm import layer_params_derivation
from meshplan.learn.ex_pipeline import _bubble_derivs, run
from meshplan.learn.model import Choice, Numeric, Ordering
from meshplan.learn.registry import Problem, Variant, command, derivs, exercise, gb, url
from meshplan.pipeline.stages import default_layer_split
from meshplan.presets import get_preset
from meshplan.specs.plan import AXES
from meshplan.units import DAY, GB, MS

PRESET = get_preset("llama3-405b-16k").values
LLAMA3 = "Grattafiori et al. 2024, The Llama 3 Herd of Models, Sec. 3.3 (source 003)"


def _layout(v: Variant) -> dict:
    """The preset's layout, or a random one of the same model on a power-of-two cluster."""
    if v.fixed:
        return {k: PRESET[k] for k in ("gpus", "tp", "cp", "pp")}
    tp = v.pick(8, [4, 8])
    pp = v.pick(16, [8, 16, 32])
    cp = v.pick(1, [1, 2])
    dp = v.pick(128, [16, 32, 64, 128])
    return {"gpus": tp * pp * cp * dp, "tp": tp, "cp": cp, "pp": pp}


def _plan_links(lay: dict, **extra):
    opts = dict(model="llama3-405b", gpus=lay["gpus"], tp=lay["tp"], cp=lay["cp"], pp=lay["pp"], **extra)
    return command("estimate", **opts), url("/plan", **opts)


@exercise("l3-dp", "llama3", "The data-parallel degree", "easy", "001, Llama 3 capstone, question 1")
def l3_dp(v: Variant) -> Problem:
    lay = _layout(v)
    inner = lay["tp"] * lay["cp"] * lay["pp"]
    dp = lay["gpus"] // inner
    cmd, link = _plan_links(lay)
    return Problem(
        prompt=f"{lay['gpus']:,} GPUs with TP = {lay['tp']}, CP = {lay['cp']}, PP = {lay['pp']}. What is the DP degree?",
        answer=Numeric(dp, "", 1.0, 0.0),
        solution=[derive("plan.dp", "data-parallel degree", "G / (tp·cp·pp)",
                         [("G", f"{lay['gpus']:,}"), ("tp·cp·pp", str(inner))], str(dp), "DESIGN.md: the mesh is tp × cp × pp × dp")],
        hints=("The four axes multiply to the number of GPUs.",), params=lay, command=cmd, url=link,
    )


@exercise("l3-layer-split", "llama3", "Layers per pipeline stage", "medium", "001, Llama 3 capstone, question 2")
def l3_layer_split(v: Variant) -> Problem:
    L = v.pick(126, [80, 100, 126, 30])
    p = v.pick(16, [6, 12, 16, 7])
    split = default_layer_split(L, p)
    base, extra = divmod(L, p)

    def text(s) -> str:
        return ", ".join(str(x) for x in s)

    naive = [base + 1] * extra + [base] * (p - extra)
    last_heavy = [base] * (p - extra) + [base + 1] * extra
    options = [text(split)]
    lopsided = [base - 1] + [base] * (p - 2) + [base + 1 + extra]
    for alt in (naive, last_heavy, lopsided, [L // p] * (p - 1) + [L - (L // p) * (p - 1)]):
        if text(alt) not in options:
            options.append(text(alt))
    shown = v.shuffled(options)
    return Problem(
        prompt=f"{L} layers over PP = {p} stages. The first stage also holds the embedding and the last the LM head, "
               f"so when the layers do not divide evenly they get one layer fewer (Llama 3). Which split, stage 0 first?",
        answer=Choice(tuple(shown), shown.index(text(split))),
        solution=[derive("pipeline.split", "layers per stage", "⌊L/p⌋ each; the L mod p extra layers to the inner stages first",
                         [("L", str(L)), ("p", str(p)), ("L mod p", str(extra))], text(split), LLAMA3 + "; meshplan.pipeline.stages")],
        hints=(f"{L} = {p}·{base} + {extra}.",),
        params={"layers": L, "pp": p}, command=command("estimate", model="llama3-405b", gpus=8 * p, tp=8, pp=p),
        url=url("/plan", model="llama3-405b", gpus=8 * p, tp=8, pp=p),
    )


@exercise("l3-weights", "llama3", "Weight memory of one pipeline rank", "medium", "001, Llama 3 capstone, question 3")
def l3_weights(v: Variant) -> Problem:
    lay = _layout(v)
    m = load_model("llama3-405b")
    layers = max(default_layer_split(m.n_layers, lay["pp"]))
    per, per_derivation = layer_params_derivation(m, lay["tp"])
    w = 2.0 * layers * per
    cmd, link = _plan_links(lay)
    return Problem(
        prompt=f"Llama 3 405B (d = 16,384, 128 query heads and 8 K/V heads of 128, SwiGLU FFN of 53,248) with "
               f"TP = {lay['tp']} and PP = {lay['pp']}. A middle stage holds {layers} layers. How many GB of bf16 "
               f"weights does one of its GPUs hold?",
        answer=Numeric(w, "GB", GB, 0.01),
        solution=[per_derivation,
                  derive("l3.weights", "weights per GPU", "2 bytes · layers · P_layer/t", [("layers", str(layers))], size(w), LLAMA3)],
        hints=("K and V are 16,384 × 1,024 each (GQA), not 16,384².",), params={**lay, "layers": layers}, command=cmd, url=link,
        source_note="001 counts attention as 4·d² = 1.07B parameters per layer (3.69B per layer, 7.4 GB per GPU); with "
                    "GQA's 8 K/V heads it is 570M (3.19B per layer): 6.38 GB (5.94 GiB) per GPU.",
    )


@exercise("l3-pf-days", "llama3", "Training compute in petaFLOP-days", "easy", "001, Llama 3 capstone, question 4")
def l3_pfdays(v: Variant) -> Problem:
    N = v.pick(405e9, [8e9, 70e9, 405e9])
    D = v.pick(15.6e12, [2e12, 15e12, 15.6e12])
    r = cost(16384, params=N, tokens=D, mfu=0.4)
    opts = dict(gpus=16384, params=f"{N / 1e9:g}B", tokens=f"{D / 1e12:g}T", mfu=0.4)
    return Problem(
        prompt=f"Training compute 6·N·D for N = {num(N / 1e9)}B parameters and D = {num(D / 1e12)}T tokens. How many "
               f"petaFLOP/s-days (10^15 FLOP/s for a day) is that?",
        answer=Numeric(r.data["pf_days"], "PF-days", 1.0, 0.01),
        solution=derivs(r, "cost.flops"), hints=("1 PF-day = 10^15 × 86,400 FLOP.",),
        params={"params": N, "tokens": D}, command=command("calc", "cost", **opts, explain=True), url=url("/calc/cost", **opts),
    )


@exercise("l3-days", "llama3", "Days of training at an MFU", "medium", "001, Llama 3 capstone, question 5")
def l3_days(v: Variant) -> Problem:
    gpus = v.pick(16384, [4096, 8192, 16384])
    mfu = v.pick(0.4, [0.3, 0.4, 0.5])
    r = cost(gpus, params=405e9, tokens=15.6e12, mfu=mfu)
    opts = dict(gpus=gpus, params="405B", tokens="15.6T", mfu=mfu)
    return Problem(
        prompt=f"6·N·D FLOPs for 405B parameters and 15.6T tokens on {gpus:,} H100s (989.4 TFLOP/s dense BF16) at "
               f"{num(mfu * 100)}% MFU. How many days?",
        answer=Numeric(r.data["seconds"], "days", DAY, 0.01),
        solution=derivs(r, "cost.flops", "cost.time"), hints=("T = 6ND / (G·P·u).",),
        params={"gpus": gpus, "mfu": mfu}, command=command("calc", "cost", **opts, explain=True), url=url("/calc/cost", **opts),
        source_note="000 gets 34 days at 40% MFU by using 1,979 TFLOP/s, the 2:4-sparse peak; with the dense 989.4 it is "
                    "67.7 days. 001's 67.7 is right, but its '~48% MFU' for 54 days is 50.1%.",
    )


@exercise("l3-bubble", "llama3", "The bubble of PP = 16 with few micro-batches", "medium", "001, Llama 3 capstone, question 6")
def l3_bubble(v: Variant) -> Problem:
    p = v.pick(16, [8, 16])
    m = v.pick(4, [4, 8, 16, 32])
    sim = run("1f1b", p, m)
    return Problem(
        prompt=f"PP = {p}, m = {m} micro-batches per step per DP rank, 1F1B, equal stages. What is the bubble fraction "
               f"(idle share of the step), in %?",
        answer=Numeric(sim.bubble_fraction, "%", 0.01, 0.005),
        solution=_bubble_derivs(sim, p, m), hints=("(p−1)/(m+p−1).",), params={"pp": p, "microbatches": m},
        command=command("pipeline", pp=p, microbatches=m, schedule="1f1b"), url=url("/pipeline", pp=p, microbatches=m, schedule="1f1b"),
        explanation="With m < p most of the step is bubble: Llama 3 ran 16 or more micro-batches and interleaving.",
    )


@exercise("l3-dp-allreduce", "llama3", "The DP gradient all-reduce of one stage", "hard", "001, Llama 3 capstone, question 7")
def l3_dp_allreduce(v: Variant) -> Problem:
    lay = _layout(v)
    dp = lay["gpus"] // (lay["tp"] * lay["cp"] * lay["pp"])
    m = load_model("llama3-405b")
    layers = max(default_layer_split(m.n_layers, lay["pp"]))
    S = 2.0 * layers * layer_params_per_rank(m, lay["tp"])
    bw = 50 * GB
    r = collective("all_reduce", S, dp, Network(bw=bw, latency=0.0), "ring")
    return Problem(
        prompt=f"Llama 3 405B, TP = {lay['tp']}, PP = {lay['pp']}, DP = {dp}: a middle stage's GPU holds {layers} layers' "
               f"TP shard, whose bf16 gradients ({num(S / GB)} GB) it all-reduces over DP with a ring at 50 GB/s per "
               f"direction. How long does it take, in ms (bandwidth only)?",
        answer=Numeric(r.data["time_s"], "ms", MS, 0.01),
        solution=derivs(r, "collective.sent", "collective.time"), hints=("2(n−1)/n · S / B.",),
        params={**lay, "dp": dp, "size_bytes": S},
        command=command("calc", "collective", size=gb(S), n=dp, bw=50, latency="0us", algorithm="ring", explain=True),
        url=url("/calc/collective", size=gb(S), n=dp, bw=50, latency="0us", algorithm="ring"),
        source_note="001 takes 7.38 GB per stage (attention as 4·d²) and gets 293 ms; with GQA the shard is 6.38 GB: 253 ms.",
    )


@exercise("l3-axis-order", "llama3", "Parallelism axes from innermost to outermost", "medium", "001, Llama 3 capstone, question 8")
def l3_axis_order(v: Variant) -> Problem:
    who = v.pick("llama3", ["llama3", "megatron"])
    if who == "llama3":
        order = tuple(PRESET["rank_order"].split(","))
        what = "Llama 3 405B's training (Llama 3 paper, Sec. 3.3.2)"
    else:
        from meshplan.specs.plan import TrainingPlan

        order = tuple(TrainingPlan.model_fields["rank_order"].default)
        what = "Megatron-LM's default rank order"
    items = v.shuffled([a.upper() for a in AXES]) if not v.fixed else ["TP", "PP", "CP", "DP"]
    correct = tuple(items.index(a.upper()) for a in order)
    return Problem(
        prompt=f"Order the parallelism axes of {what} from innermost (neighbouring ranks, the fastest links) to outermost.",
        answer=Ordering(tuple(items), correct, "innermost", "outermost"),
        solution=[derive("plan.rank_order", "rank order, innermost first", "the order of the device mesh's axes",
                         [(a.upper(), "") for a in order], " → ".join(a.upper() for a in order),
                         LLAMA3 if who == "llama3" else "Megatron-LM (meshplan's default)")],
        hints=("TP all-reduces on every layer: it needs NVLink.", "DP's gradient sync overlaps the backward: it tolerates the slowest links."),
        params={"who": who, "items": items}, command=command("estimate", preset="llama3-405b-16k", rank_order=",".join(order)),
        url=url("/plan", preset="llama3-405b-16k", rank_order=",".join(order)),
        explanation="CP sits inside PP: ring attention moves K/V on every layer, PP only sends activations between stages.",
        source_note="001 answers TP → PP → CP → DP. Llama 3 ordered the axes [TP, CP, PP, DP] (paper Sec. 3.3.2): CP's "
                    "per-layer K/V exchange needs faster links than PP's point-to-point sends." if v.fixed else None,
    )


@exercise("l3-electricity", "llama3", "The electricity bill", "easy", "001, Llama 3 capstone, question 9")
def l3_electricity(v: Variant) -> Problem:
    gpus = v.pick(16384, [4096, 8192, 16384])
    days = v.pick(77.0, [54.0, 77.0, 90.0])
    watts = v.pick(700.0, [700.0, 1000.0])
    kwh = v.pick(0.05, [0.05, 0.08, 0.12])
    r = cost(gpus, seconds=days * DAY, watts=watts, kwh_price=kwh, price=2.0)
    opts = dict(gpus=gpus, days=days, watts=watts, kwh_price=kwh, price=2.0)
    return Problem(
        prompt=f"{gpus:,} GPUs drawing {num(watts)} W each for {num(days)} days at ${num(kwh)} per kWh (GPU power only, "
               f"PUE 1). What is the electricity cost, in dollars?",
        answer=Numeric(r.data["energy_dollars"], "$", 1.0, 0.01),
        solution=derivs(r, "cost.energy", "cost.electricity", "cost.dollars"), hints=("kWh = GPUs × kW × hours.",),
        params={"gpus": gpus, "days": days, "watts": watts, "kwh_price": kwh},
        command=command("calc", "cost", **opts, explain=True), url=url("/calc/cost", **opts),
        explanation="The GPU rental ($2 per GPU-hour) dwarfs the electricity.",
    )
