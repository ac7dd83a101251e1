"""Exercises on collectives, tensor parallelism and context parallelism (seeds 000 and 001).

Every answer is a figure of :func:`meshplan.calc.collective.collective` (the ring, tree and
hierarchical model of :mod:`meshplan.cost.collectives`) or of the per-rank parameter counts of
:mod:`meshplan.cost.params`; the worked solution is those functions' derivations. The sources
ignore latency unless they state it, so these exercises set α = 0 unless they give one, and
take every bandwidth as per GPU per direction (DESIGN.md).
"""

from __future__ import annotations

from meshplan.calc.collective import Network, collective
from meshplan.calc.result import derive, num, pct, size
from meshplan.catalog import load_gpu, load_model
from meshplan.cost.calibration import calibration_for
from meshplan.cost.collectives import collective_time, placement
from meshplan.cost.comm import cp_kv_bytes
from meshplan.cost.contention import NCCL_CTAS, contention_time, sm_share
from meshplan.cost.params import kv_heads_per_rank, layer_params_per_rank
from meshplan.explain import Derivation
from meshplan.learn.model import Choice, Numeric
from meshplan.learn.registry import Problem, Variant, command, derivs, exercise, gb, url
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import AXES
from meshplan.units import GB, MB, MS, US

RING = "Patarasuk & Yuan 2009; meshplan.calc.collective"


def _ring(op: str, S: float, n: int, bw: float, latency: float = 0.0, algorithm: str = "ring", **net) -> object:
    return collective(op, S, n, Network(bw=bw, latency=latency, **net), algorithm)


def _calc_links(S: float, n: int, bw: float, latency: float = 0.0, op: str = "all-reduce", algorithm: str = "ring", **extra):
    lat = f"{latency / US:g}us"
    extra = {"base_latency": "0us"} | extra  # the α–β model the exercises state: no per-call latency
    cmd = command("calc", "collective", op=op, size=gb(S), n=n, bw=bw / GB, latency=lat, algorithm=algorithm, explain=True,
                  **extra)
    link = url("/calc/collective", op=op, size=gb(S), n=n, bw=bw / GB, latency=lat, algorithm=algorithm, **extra)
    return cmd, link


@exercise("ring-volume", "collectives", "Bytes each GPU sends in a ring all-reduce", "easy", "001, ring all-reduce, question 1")
def ring_volume(v: Variant) -> Problem:
    n = v.pick(8, [2, 4, 8, 16, 32, 64, 128])
    S = v.pick(1 * GB, [0.25 * GB, 0.5 * GB, 1 * GB, 2 * GB, 4 * GB, 10 * GB])
    r = _ring("all_reduce", S, n, 50 * GB)
    cmd, link = _calc_links(S, n, 50 * GB)
    return Problem(
        prompt=f"{n} GPUs each hold a gradient tensor of {num(S / GB)} GB. How many GB does each GPU send in total "
               f"during a ring all-reduce (reduce-scatter then all-gather)?",
        answer=Numeric(r.data["sent_bytes_per_gpu"], "GB", GB, 0.01),
        solution=derivs(r, "collective.sent", "collective.steps"),
        hints=("The ring splits the tensor into n chunks and runs n − 1 steps in each of its two phases.",
               "Each step sends one chunk of S/n bytes."),
        params={"n": n, "size_bytes": S}, command=cmd, url=link,
        explanation="Even with 1,000 GPUs each sends 2·999/1000·S: the per-GPU volume is almost independent of n.",
    )


@exercise("ring-time", "collectives", "Ring all-reduce time, bandwidth term", "easy", "001, ring all-reduce, question 2")
def ring_time(v: Variant) -> Problem:
    n = v.pick(8, [4, 8, 16, 32, 64])
    S = v.pick(2 * GB, [0.5 * GB, 1 * GB, 2 * GB, 4 * GB, 8 * GB])
    bw = v.pick(50 * GB, [25 * GB, 50 * GB, 100 * GB, 200 * GB, 450 * GB])
    r = _ring("all_reduce", S, n, bw)
    cmd, link = _calc_links(S, n, bw)
    return Problem(
        prompt=f"{n} GPUs in a ring, {num(bw / GB)} GB/s per GPU per direction, gradient of {num(S / GB)} GB. "
               f"How long does the ring all-reduce take, ignoring latency?",
        answer=Numeric(r.data["time_s"], "ms", MS, 0.01),
        solution=derivs(r, "collective.sent", "collective.time"),
        hints=("Time = bytes each GPU sends / bandwidth.", "The ring uses one direction of each link at a time."),
        params={"n": n, "size_bytes": S, "bw": bw}, command=cmd, url=link,
        source_note="001 calls the 50 GB/s 'bidirectional' and still divides by all of it: its 70 ms holds only if "
                    "50 GB/s is the bandwidth per direction; with 25 GB/s each way the all-reduce takes 140 ms.",
    )


@exercise("ring-latency", "collectives", "The latency term of a ring all-reduce", "easy", "001, ring all-reduce (latency)")
def ring_latency(v: Variant) -> Problem:
    n = v.pick(8, [4, 8, 16, 64, 128])
    alpha = v.pick(5 * US, [1 * US, 2 * US, 5 * US, 10 * US])
    S = 2 * GB
    r = _ring("all_reduce", S, n, 50 * GB, alpha)
    cmd, link = _calc_links(S, n, 50 * GB, alpha)
    return Problem(
        prompt=f"A ring all-reduce over {n} GPUs pays a latency of {num(alpha / US)} µs per step. "
               f"How much time do the latencies add in total, in µs?",
        answer=Numeric(r.data["latency_s"], "µs", US, 0.01),
        solution=derivs(r, "collective.steps", "collective.time"),
        hints=("Count the steps of both phases.",),
        params={"n": n, "latency": alpha, "size_bytes": S}, command=cmd, url=link,
        explanation="For large tensors the bandwidth term dominates; at thousands of GPUs the 2(n−1) steps do not.",
    )


@exercise("ring-tree-crossover", "collectives", "Where tree all-reduce stops beating the ring", "hard", "001 and 004, ring vs tree")
def ring_tree_crossover(v: Variant) -> Problem:
    n = v.pick(8, [8, 16, 32, 64, 128])
    alpha = v.pick(5 * US, [1 * US, 2 * US, 5 * US, 10 * US])
    bw = v.pick(50 * GB, [25 * GB, 50 * GB, 100 * GB, 450 * GB])
    S = 1 * GB
    r = _ring("all_reduce", S, n, bw, alpha, "auto")
    cmd, link = _calc_links(S, n, bw, alpha, algorithm="auto")
    return Problem(
        prompt=f"All-reduce over {n} GPUs, {num(bw / GB)} GB/s per GPU per direction, {num(alpha / US)} µs per step. "
               f"The ring takes 2(n−1) steps and sends 2(n−1)/n·S per GPU; NCCL's double binary tree takes "
               f"2⌈log₂ n⌉ steps and sends about 2·S. Above which buffer size S (in MB) is the ring faster?",
        answer=Numeric(r.data["ring_tree_crossover_bytes"], "MB", MB, 0.01),
        solution=derivs(r, "collective.crossover"),
        hints=("Write both times as L + c·S and set them equal.", "L_ring − L_tree = (2(n−1) − 2⌈log₂ n⌉)·α."),
        params={"n": n, "latency": alpha, "bw": bw}, command=cmd, url=link,
    )


@exercise("busbw", "collectives", "Bus bandwidth as nccl-tests reports it", "medium", "001, ring all-reduce (bus bandwidth)")
def busbw(v: Variant) -> Problem:
    n = v.pick(8, [4, 8, 16, 64])
    S = v.pick(2 * GB, [0.1 * GB, 1 * GB, 2 * GB, 8 * GB])
    bw = v.pick(50 * GB, [50 * GB, 100 * GB, 450 * GB])
    alpha = v.pick(5 * US, [1 * US, 5 * US, 20 * US])
    r = _ring("all_reduce", S, n, bw, alpha)
    cmd, link = _calc_links(S, n, bw, alpha)
    return Problem(
        prompt=f"A ring all-reduce of {num(S / GB)} GB over {n} GPUs at {num(bw / GB)} GB/s per direction with "
               f"{num(alpha / US)} µs per step. What bus bandwidth (busbw) does nccl-tests report, in GB/s?",
        answer=Numeric(r.data["busbw"], "GB/s", GB, 0.01),
        solution=derivs(r, "collective.time", "collective.algbw", "collective.busbw"),
        hints=("algbw = S / t.", "busbw = algbw × 2(n−1)/n for all-reduce: it undoes the ring's factor."),
        params={"n": n, "size_bytes": S, "bw": bw, "latency": alpha}, command=cmd, url=link,
        explanation="Without latency busbw equals the link bandwidth: busbw measures how close to the wire a collective runs.",
    )


@exercise("hierarchical-allreduce", "collectives", "Hierarchical all-reduce across nodes", "hard", "001, communication overlap (cross-node all-reduce)")
def hierarchical(v: Variant) -> Problem:
    params_b = v.pick(10e9, [1e9, 7e9, 10e9, 13e9, 70e9])
    S = 2 * params_b
    nodes = v.pick(8, [2, 4, 8, 16, 32])
    k = 8
    intra = v.pick(600 * GB, [300 * GB, 450 * GB, 600 * GB])
    inter = v.pick(100 * GB, [50 * GB, 100 * GB, 200 * GB, 400 * GB])
    n = nodes * k
    r = collective("all_reduce", S, n, Network(bw=intra, latency=0.0, gpus_per_node=k, inter_bw=inter / k, inter_latency=0.0), "ring")
    cmd, link = _calc_links(S, n, intra, 0.0, gpus_per_node=k, inter_bw=inter / k / GB, inter_latency="0us")
    return Problem(
        prompt=f"A {num(params_b / 1e9)}B-parameter model, fp16 gradients, {nodes} nodes of {k} GPUs: NVLink "
               f"{num(intra / GB)} GB/s per GPU inside a node, one {num(inter / GB)} GB/s link per node between nodes, "
               f"shared by its {k} GPUs (per direction). "
               f"The all-reduce is hierarchical: reduce-scatter inside the node, all-reduce of each GPU's shard "
               f"across nodes, all-gather inside the node. How long does it take, in ms (no latency)?",
        answer=Numeric(r.data["time_s"], "ms", MS, 0.01),
        solution=derivs(r, "collective.time", *[f"collective.phases[{i}]" for i in range(3)]),
        hints=("The three phases run one after another: add their times.",
               "Across nodes each GPU all-reduces only S/k bytes, on its 1/k share of the node's link."),
        params={"params": params_b, "size_bytes": S, "nodes": nodes, "gpus_per_node": k, "intra_bw": intra, "inter_bw": inter},
        command=cmd, url=link,
        source_note="001 counts only the cross-node step (350 ms) and puts the intra-node steps at 'maybe 10 ms': "
                    "the reduce-scatter and all-gather of 20 GB at 600 GB/s take 29.2 ms each, 408 ms in all.",
    )


@exercise("dp-allreduce", "collectives", "Data-parallel gradient all-reduce on NVLink", "easy", "001, communication overlap, question 1")
def dp_allreduce(v: Variant) -> Problem:
    params_b = v.pick(10e9, [1e9, 7e9, 10e9, 30e9, 70e9])
    n = v.pick(64, [8, 16, 64, 256])
    bw = v.pick(600 * GB, [300 * GB, 450 * GB, 600 * GB])
    S = 2 * params_b
    r = _ring("all_reduce", S, n, bw)
    cmd, link = _calc_links(S, n, bw)
    return Problem(
        prompt=f"{num(params_b / 1e9)}B parameters, fp16 gradients (2 bytes each), {n} GPUs, {num(bw / GB)} GB/s per GPU "
               f"per direction. How long does one ring all-reduce of the gradients take, in ms?",
        answer=Numeric(r.data["time_s"], "ms", MS, 0.01),
        solution=derivs(r, "collective.sent", "collective.time"),
        hints=("S = 2 bytes × parameters.", "t = 2(n−1)/n · S / B."),
        params={"params": params_b, "size_bytes": S, "n": n, "bw": bw}, command=cmd, url=link,
        source_note="001 says the 600 GB/s are bidirectional but divides by all of them (65.6 ms, '~66 ms'); "
                    "with 300 GB/s each way the all-reduce takes 131 ms.",
    )


# ---- tensor parallelism -------------------------------------------------------------------------


@exercise("tp-shard-shape", "tp", "Column-parallel shard of a weight", "easy", "001, tensor parallelism, question 1")
def tp_shard_shape(v: Variant) -> Problem:
    d = v.pick(8192, [4096, 5120, 8192, 12288, 16384])
    tp = v.pick(8, [2, 4, 8])
    model = load_model("llama3-70b")
    shard = d // tp
    options = v.shuffled([f"{d} × {shard}", f"{shard} × {d}", f"{d} × {d}", f"{shard} × {shard}"])
    right = options.index(f"{d} × {shard}")
    return Problem(
        prompt=f"Y = X·W with W of shape [{d}, {d}] (in, out), split column-parallel over TP = {tp}: each GPU computes "
               f"its slice of Y's columns. What shape of W does each GPU hold?",
        answer=Choice(tuple(options), right),
        solution=[derive("tp.shard", "column-parallel shard", "[d, d/t]", [("d", str(d)), ("t", str(tp))],
                         f"[{d}, {shard}]: {num(d * shard)} parameters instead of {num(d * d)}",
                         "Shoeybi et al. 2019 (Megatron-LM), Sec. 3")],
        hints=("Columns are the output features.",),
        params={"d": d, "tp": tp}, command=command("estimate", model=model.name, gpus=tp, tp=tp, explain=False),
        url=url("/plan", model=model.name, gpus=tp, tp=tp),
    )


def _tp_msg(b: int, s: int, d: int) -> float:
    return 2.0 * b * s * d  # fp16 activation [b·s, d]


@exercise("tp-allreduce-bytes", "tp", "Bytes per TP all-reduce", "medium", "001, tensor parallelism, question 2")
def tp_allreduce_bytes(v: Variant) -> Problem:
    tp = v.pick(8, [2, 4, 8])
    d = v.pick(8192, [4096, 8192, 16384])
    s = v.pick(4096, [2048, 4096, 8192])
    b = v.pick(1, [1, 2])
    S = _tp_msg(b, s, d)
    r = _ring("all_reduce", S, tp, 600 * GB)
    cmd, link = _calc_links(S, tp, 600 * GB)
    return Problem(
        prompt=f"TP = {tp}, d = {d}, sequence {s}, micro-batch {b}, fp16. Each layer all-reduces the activation "
               f"[b·s, d]. How many MB does each GPU send per all-reduce (ring)?",
        answer=Numeric(r.data["sent_bytes_per_gpu"], "MB", MB, 0.01),
        solution=[derive("tp.message", "activation size", "2 bytes · b · s · d", [("b", str(b)), ("s", str(s)), ("d", str(d))], size(S))]
                 + derivs(r, "collective.sent"),
        hints=("First the tensor's size in bytes.", "Then the ring's 2(t−1)/t."),
        params={"tp": tp, "d": d, "seq_len": s, "micro_batch": b, "size_bytes": S}, command=cmd, url=link,
        source_note="001 answers 56 MB (and 0.09 ms at 600 GB/s): it drops the ring's factor 2. Each GPU sends "
                    "2·7/8·64 MiB = 112 MiB (117.4 MB), 0.196 ms at 600 GB/s.",
    )


@exercise("tp-overhead", "tp", "TP communication overhead of a step", "hard", "001, tensor parallelism, question 5")
def tp_overhead(v: Variant) -> Problem:
    layers = v.pick(80, [32, 40, 80, 126])
    compute = v.pick(0.3, [0.2, 0.3, 0.5, 1.0])
    bw = v.pick(600 * GB, [300 * GB, 450 * GB, 600 * GB])
    S = _tp_msg(1, 4096, 8192)
    r = _ring("all_reduce", S, 8, bw)
    count = layers * 2 * 2
    t = count * r.data["time_s"]
    cmd, link = _calc_links(S, 8, bw)
    return Problem(
        prompt=f"TP = 8, activations [4096, 8192] in fp16, {layers} layers with 2 all-reduces each in the forward "
               f"and 2 in the backward, {num(bw / GB)} GB/s per direction, compute {num(compute * 1e3)} ms per step. "
               f"The all-reduces are on the critical path. What is their time as a share of the compute, in %?",
        answer=Numeric(t / compute, "%", 0.01, 0.02),
        solution=derivs(r, "collective.time") + [
            derive("tp.overhead", "TP communication / compute", "4·L·t_AR / t_compute",
                   [("L", str(layers)), ("t_AR", f"{num(r.data['time_s'] / MS)} ms"), ("t_compute", f"{num(compute * 1e3)} ms")],
                   pct(t / compute, 1), "Shoeybi et al. 2019 (Megatron-LM), Sec. 3: 2 all-reduces forward, 2 backward")],
        hints=("Count the all-reduces: layers × 2 × 2.", "Each one is a ring all-reduce over 8 GPUs."),
        params={"layers": layers, "compute_s": compute, "bw": bw, "size_bytes": S}, command=cmd, url=link,
        source_note="001 takes 0.09 ms per all-reduce (its 56 MB slip) and gets ~10%; the ring sends 117 MB per GPU, "
                    "0.196 ms at 600 GB/s, so 320 all-reduces take 62.6 ms: 20.9% of 300 ms.",
    )


def layer_params_derivation(m: ModelSpec, tp: int) -> tuple[int, Derivation]:
    """Parameters of one transformer layer held by each of ``tp`` tensor-parallel ranks
    (:func:`~meshplan.cost.params.layer_params_per_rank`), with its derivation: Q and O of h·q/t
    each, K and V of h·g_r·d_h each (g_r K/V heads per rank, replicated past their number), a
    gated FFN of 3·h·f/t, and the norms (Shoeybi et al. 2019, Sec. 3; GQA: Ainslie et al. 2023)."""
    per, g = layer_params_per_rank(m, tp), kv_heads_per_rank(m, tp)
    return per, derive(
        "tp.layer_params", "layer parameters per TP rank", "h·q/t + 2·h·g_r·d_h + q/t·h + 3·h·f/t + norms",
        [("h", f"{m.hidden:,}"), ("q", f"{m.n_heads * m.head_dim:,}"), ("g_r", f"{g} K/V head{'' if g == 1 else 's'}"),
         ("d_h", str(m.head_dim)), ("f", f"{m.ffn_hidden:,}"), ("t", str(tp))], num(per), "meshplan.cost.params.layer_params_per_rank")


@exercise("tp-weights", "tp", "Weight memory per GPU under TP", "medium", "001, tensor parallelism, question 3")
def tp_weights(v: Variant) -> Problem:
    name = v.pick("llama3-70b", ["llama3-8b", "llama3-70b", "llama3-405b", "llama2-70b"])
    tp = v.pick(8, [2, 4, 8])
    m = load_model(name)
    per, per_derivation = layer_params_derivation(m, tp)
    total = 2.0 * m.n_layers * per
    return Problem(
        prompt=f"{name}: {m.n_layers} layers, d = {m.hidden}, {m.n_heads} query heads, {m.n_kv_heads} K/V heads, "
               f"SwiGLU FFN of {m.ffn_hidden}. With TP = {tp}, how many GB of bf16 weights does each GPU hold for all "
               f"its transformer layers (no embedding, no head)?",
        answer=Numeric(total, "GB", GB, 0.01),
        solution=[per_derivation,
                  derive("tp.weights", "weights per GPU", "2 bytes · L · P_layer/t", [("L", str(m.n_layers)), ("P_layer/t", num(per))], size(total))],
        hints=("Count one layer exactly: Q and O are h×h, K and V are h×(kv heads × head dim), the FFN has 3 matrices.",
               "TP splits every matrix t ways; K/V heads are replicated when t exceeds their number."),
        params={"model": name, "tp": tp}, command=command("estimate", model=name, gpus=tp, tp=tp), url=url("/plan", model=name, gpus=tp, tp=tp),
        source_note="001 takes 12·d² = 805M parameters per layer (16.1 GB per GPU with TP = 8); Llama 3 70B's GQA "
                    "attention and 28,672-wide SwiGLU make it 855.6M: 17.1 GB per GPU.",
    )


@exercise("tp-kv-heads", "tp", "K/V heads per GPU under GQA", "easy", "001, tensor parallelism, question 4")
def tp_kv_heads(v: Variant) -> Problem:
    name = v.pick("llama3-70b", ["llama3-8b", "llama3-70b", "llama3-405b"])
    tp = v.pick(8, [1, 2, 4, 8, 16])
    m = load_model(name)
    g = kv_heads_per_rank(m, tp)
    return Problem(
        prompt=f"{name} has {m.n_heads} query heads and {m.n_kv_heads} K/V heads. With TP = {tp}, how many K/V heads "
               f"does each GPU hold (replicated heads count)?",
        answer=Numeric(g, "", 1.0, 0.0),
        solution=[derive("tp.kv_heads", "K/V heads per TP rank", "max(1, g/t)", [("g", str(m.n_kv_heads)), ("t", str(tp))],
                         str(g), "meshplan.cost.params.kv_heads_per_rank")],
        hints=("Heads split evenly; when t exceeds the K/V heads, each is replicated.",),
        params={"model": name, "tp": tp}, command=command("estimate", model=name, gpus=tp, tp=tp), url=url("/plan", model=name, gpus=tp, tp=tp),
    )


@exercise("tp16-vs-tp8", "tp", "TP = 16 across two nodes vs TP = 8 in one", "hard", "000, exercise 2")
def tp16_vs_tp8(v: Variant) -> Problem:
    h = v.pick(16384, [8192, 12288, 16384])
    s = v.pick(8192, [4096, 8192])
    S = _tp_msg(1, s, h)
    nv, ib = 450 * GB, 50 * GB
    t8 = _ring("all_reduce", S, 8, nv, 1 * US)
    t16 = collective("all_reduce", S, 16, Network(bw=nv, latency=1 * US, gpus_per_node=8, inter_bw=ib, inter_latency=5 * US), "ring")
    ratio = t16.data["time_s"] / t8.data["time_s"]
    cmd, link = _calc_links(S, 16, nv, 1 * US, gpus_per_node=8, inter_bw=50, inter_latency="5us")
    return Problem(
        prompt=f"A TP all-reduce of M = 2·s·h = {num(S / MB)} MB (s = {s}, h = {h}, bf16). TP = 8 stays on NVLink "
               f"(450 GB/s per direction, 1 µs per step); TP = 16 spans two nodes (hierarchical: NVLink inside, 50 GB/s "
               f"per GPU and 5 µs per step between nodes). How many times longer is the TP = 16 all-reduce?",
        answer=Numeric(ratio, "×", 1.0, 0.02),
        solution=derivs(t8, "collective.time") + derivs(t16, "collective.time"),
        hints=("TP = 16 all-reduces S/8 per GPU across the nodes at 50 GB/s.", "Both times are mostly bandwidth."),
        params={"hidden": h, "seq_len": s, "size_bytes": S}, command=cmd, url=link,
        explanation="Both times grow linearly with M, so the ratio tends to a constant: TP = 16 never wins on communication; "
                    "it would have to win on halved compute.",
        source_note="000 uses 900 GB/s for NVLink (the bidirectional total) and concludes TP = 16 wins above 2 GB: "
                    "with 450 GB/s per direction the ratio tends to a constant above 1, so no message size makes it win.",
    )


# ---- context parallelism ------------------------------------------------------------------------


@exercise("cp-kv-traffic", "cp", "Ring attention's K/V traffic per layer", "medium", "000, exercise 4")
def cp_kv(v: Variant) -> Problem:
    name = v.pick("llama3-405b", ["llama3-8b", "llama3-70b", "llama3-405b"])
    seq = v.pick(128000, [32768, 65536, 128000, 131072])
    cp = v.pick(8, [2, 4, 8, 16])
    m = load_model(name)
    block = cp_kv_bytes(m, seq / cp, 1, 2)
    total = (cp - 1) * block
    return Problem(
        prompt=f"{name} ({m.n_kv_heads} K/V heads of {m.head_dim}), a sequence of {seq:,} tokens over CP = {cp}, "
               f"bf16, TP = 1. Ring attention passes each rank's K and V block around the ring, cp − 1 times per "
               f"layer in the forward. How many MB does each rank send per layer?",
        answer=Numeric(total, "MB", MB, 0.01),
        solution=[derive("cp.block", "K and V of one rank", "2·(s/cp)·g·d_h·2 bytes",
                         [("s/cp", num(seq / cp)), ("g", str(m.n_kv_heads)), ("d_h", str(m.head_dim))], size(block), "meshplan.cost.comm.cp_kv_bytes"),
                  derive("cp.sent", "sent per layer (forward)", "(cp − 1) · block", [("cp", str(cp)), ("block", size(block))],
                         size(total), "Liu et al. 2023, Ring Attention")],
        hints=("With GQA only the K/V heads travel, not the full hidden size.",),
        params={"model": name, "seq_len": seq, "cp": cp}, command=command("estimate", model=name, gpus=cp, cp=cp, seq_len=seq),
        url=url("/plan", model=name, gpus=cp, cp=cp, seq_len=seq),
        source_note="000 sizes K and V with the full hidden size (2·2·16,000·16,384 = 1.05 GB per block, 7.35 GB per layer); "
                    "Llama 3 405B's K and V have 8 heads of 128 (GQA): 65.5 MB per block, 459 MB per layer.",
    )


# ---- communication hidden behind compute still costs SMs ----------------------------------------


def _node_all_gather(gpu_name: str, n: int, S: float) -> tuple[float, float, float, float, float]:
    """(T, B, η, α, α₀): meshplan's time of an all-gather of ``S`` bytes over ``n`` GPUs of one node of
    ``gpu_name`` (:func:`meshplan.cost.collectives.collective_time` on the group's placement in an
    HGX node), with the node's NVLink bandwidth B, its calibrated efficiency η, its latency α per
    step and NCCL's α₀ per call."""
    gpu = load_gpu(gpu_name)
    cluster, cal = ClusterSpec.of(gpu, n), calibration_for(gpu)
    group = placement(cluster, {a: 1 for a in AXES} | {"dp": n}, AXES, ("dp",))
    t = collective_time("all_gather", S, group, cluster, cal)
    return t, cluster.scale_up.bandwidth, cal.scale_up_efficiency, cluster.scale_up.latency, cal.collective_base_latency


@exercise("overlap-contention", "overlap", "Compute slowed by a hidden all-gather", "hard",
          "meshplan.cost.contention; Lee et al. 2025 (arXiv 2507.03114)")
def overlap_contention(v: Variant) -> Problem:
    name = v.pick("llama3-8b", ["llama3-8b", "llama3-70b", "llama2-7b", "llama2-13b"])
    gpu_name = v.pick("h100-sxm-80gb", ["h100-sxm-80gb", "a100-sxm-80gb", "h200-sxm-141gb", "b200"])
    n = v.pick(8, [4, 8])
    m, gpu = load_model(name), load_gpu(gpu_name)
    per, per_derivation = layer_params_derivation(m, 1)
    S = 2.0 * per  # bf16 weights of one layer, gathered whole
    t, bw, eta, alpha, alpha0 = _node_all_gather(gpu_name, n, S)
    share = sm_share(NCCL_CTAS, gpu.sm_count)
    delta = contention_time(t, share)
    other_name = "a100-sxm-80gb" if gpu_name != "a100-sxm-80gb" else "h100-sxm-80gb"
    other = load_gpu(other_name)
    t_o = _node_all_gather(other_name, n, S)[0]
    delta_o = contention_time(t_o, sm_share(NCCL_CTAS, other.sm_count))
    opts = dict(op="all-gather", size=gb(S), n=n, gpu=gpu_name, bw=bw / GB, latency=f"{alpha / US:g}us",
                base_latency=f"{alpha0 / US:g}us", algorithm="ring", efficiency=eta)
    return Problem(
        prompt=f"FSDP over {n} {gpu_name} GPUs of one node ({gpu.sm_count} SMs each) trains {name}: before each layer's "
               f"forward, its bf16 weights ({num(per)} parameters) are all-gathered, and the all-gather runs entirely "
               f"behind the previous layer's forward. NVLink gives {num(bw / GB)} GB/s per GPU per direction at an "
               f"efficiency of {eta:g}, with {num(alpha / US)} µs per ring step and {num(alpha0 / US)} µs per call; NCCL runs the all-gather as "
               f"{NCCL_CTAS} CTAs, each holding one SM for the collective's whole duration. By how many µs does the "
               f"layer's forward finish later than it would without the all-gather beside it?",
        answer=Numeric(delta, "µs", US, 0.01),
        solution=[
            per_derivation,
            derive("contention.bytes", "all-gather output", "S = 2 bytes · P_layer", [("P_layer", num(per))], size(S)),
            derive("contention.hidden", "all-gather time, all of it hidden", "T_h = α₀ + (n − 1)·α + (n − 1)/n · S / (B·η)",
                   [("n", str(n)), ("α₀", f"{num(alpha0 / US)} µs"), ("α", f"{num(alpha / US)} µs"), ("S", size(S)), ("B", f"{num(bw / GB)} GB/s"), ("η", f"{eta:g}")],
                   f"{num(t / MS)} ms", "Patarasuk & Yuan 2009; meshplan.cost.collectives.collective_time"),
            derive("contention.share", "share of the SMs the all-gather holds", "n_c / n_SM",
                   [("n_c", f"{NCCL_CTAS} CTAs (NCCL channels)"), ("n_SM", str(gpu.sm_count))], pct(share),
                   "meshplan.cost.contention.sm_share; NCCL src/transport/nvls.cc (NVLS_NCHANNELS = 16)"),
            derive("contention.delta", "forward delayed by", "Δ = T_h · n_c / n_SM", [("T_h", f"{num(t / MS)} ms"), ("n_c / n_SM", pct(share))],
                   f"{num(delta / US)} µs", "meshplan.cost.contention.contention_time, Eq. 1"),
        ],
        hints=("First the all-gather's time: it sends (n − 1)/n of the gathered layer per GPU.",
               "While it runs, the layer's kernels have n_c of the n_SM SMs fewer and progress at 1 − n_c/n_SM of their rate."),
        params={"model": name, "gpu": gpu_name, "n": n, "layer_params": per, "size_bytes": S, "bw": bw, "efficiency": eta,
                "latency": alpha, "base_latency": alpha0, "sm_count": gpu.sm_count, "ctas": NCCL_CTAS},
        command=command("calc", "collective", **opts, explain=True), url=url("/calc/collective", **opts),
        explanation=f"Hidden is not free: with every one of the {m.n_layers} layers' all-gathers hidden this way, the forward loses {num(m.n_layers * delta / MS)} ms. On "
                    f"{other_name} ({other.sm_count} SMs) the same all-gather takes {num(t_o / MS)} ms and delays the "
                    f"forward by {num(delta_o / US)} µs. Δ is a lower bound: the collective's HBM traffic also slows "
                    f"memory-bound kernels (Lee et al. 2025 measured 18.9% on average).",
    )
