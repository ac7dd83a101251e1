"""The workbook: every exercise, for the source's variant and 100 seeds, checked against an
independent computation (the simulated ring, closed forms against the pipeline simulator,
brute-force shard counting, torch's finfo, a numerical minimum for Young's interval, hand-written
loops); grading accepts answers inside the tolerance and rejects those outside; the planted line
of each faulty-line exercise is the one that makes the output wrong; a piped terminal session."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from functools import lru_cache

import numpy as np
import pytest
from typer.testing import CliRunner

from meshplan.calc.collective import simulate_ring_all_reduce
from meshplan.catalog import load_gpu, load_model
from meshplan.cli.app import app
from meshplan.learn import TOPICS, generate, grade, specs
from meshplan.learn.model import Choice, FaultyLine, Numeric
from meshplan.presets import get_preset

SEEDS = [None] + list(range(100))
H100_BF16 = load_gpu("h100-sxm-80gb").peak("bf16")


# ---- independent computations, in the exercise's display unit -----------------------------------


@lru_cache(maxsize=None)
def ring_sim(n: int):
    """The ring all-reduce run step by step on numpy arrays of 8·n values per rank."""
    sim = simulate_ring_all_reduce(n, 8 * n)
    assert sim.correct and len(set(sim.sent)) == 1
    return sim


def ring_sent(n: int, S: float) -> float:
    """Bytes each rank sends in the simulated ring, scaled to S."""
    sim = ring_sim(n)
    return sim.sent[0] / (8 * n * sim.itemsize) * S


def ring_time(S, n, bw, alpha=0.0):
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * S / bw


def layer_params_by_shapes(name: str, tp: int) -> int:
    """One layer's parameters on one TP rank, from its weight shapes."""
    m = load_model(name)
    h, hd, f = m.hidden, m.head_dim, m.ffn_hidden
    kv = m.n_kv_heads // tp if tp <= m.n_kv_heads else 1
    shapes = [(h, m.n_heads * hd // tp), (h, kv * hd), (h, kv * hd), (m.n_heads * hd // tp, h),
              (h, f // tp), (h, f // tp), (f // tp, h)]
    return sum(a * b for a, b in shapes) + 2 * h


def zero_bytes(P: int, stage: int, N: int) -> float:
    """Rank 0's model state, counting each shard's parameters (2 + 2 + 12 bytes per parameter)."""
    shards = [P // N + (r < P % N) for r in range(N)]
    assert sum(shards) == P
    mine = shards[0] if N > 1 else P
    return 2 * (mine if stage >= 3 else P) + 2 * (mine if stage >= 2 else P) + 12 * (mine if stage >= 1 else P)


def final_scale(flags, scale, interval):
    good = 0
    for bad in flags:
        if bad:
            scale, good = scale / 2, 0
        else:
            good += 1
            if good == interval:
                scale, good = scale * 2, 0
    return scale


def young_by_minimum(C: float, M: float) -> float:
    """τ minimizing the first-order waste C/τ + τ/(2M), found numerically."""
    lo, hi = math.log(C / 100), math.log(100 * M)
    for _ in range(200):  # golden-section search in log τ
        a, b = lo + (hi - lo) * 0.382, lo + (hi - lo) * 0.618
        fa, fb = (C / math.exp(a) + math.exp(a) / (2 * M)), (C / math.exp(b) + math.exp(b) / (2 * M))
        lo, hi = (lo, b) if fa < fb else (a, hi)
    return math.exp((lo + hi) / 2)


def finfo(name: str):
    torch = pytest.importorskip("torch")
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32,
          "fp8-e4m3": torch.float8_e4m3fn, "fp8-e5m2": torch.float8_e5m2}
    if name == "tf32":
        return {"max": (2 - 2**-10) * 2.0**127, "min_normal": 2.0**-126, "eps": 2.0**-10}
    fi = torch.finfo(dt[name])
    return {"max": fi.max, "min_normal": fi.tiny, "eps": fi.eps}


def bubble_fraction(p, m, v=1):
    return 100 * (p - 1) / (m * v + p - 1)


def stage_split_ok(split: list[int], L: int, p: int) -> bool:
    base, extra = divmod(L, p)
    ok = sum(split) == L and len(split) == p and set(split) <= {base, base + 1}
    if extra <= p - 2:
        ok = ok and split[0] == base and split[-1] == base
    return ok


def cp_sent(pr) -> float:
    m = load_model(pr["model"])
    return (pr["cp"] - 1) * 2 * (pr["seq_len"] / pr["cp"]) * m.n_kv_heads * m.head_dim * 2 / 1e6


def tp16_ratio(S):
    t8 = ring_time(S, 8, 450e9, 1e-6)
    intra = 7 / 8 * S / 450e9  # reduce-scatter, and the all-gather, inside each node
    # NCCL's flat ring through 16 GPUs: 2(n − g) = 28 steps inside the nodes, 2(g − 1) = 2 across
    t16 = 28 * 1e-6 + 2 * intra + 2 * 5e-6 + 2 * (1 / 2) * (S / 8) / 50e9  # all-reduce of S/8 across the 2 nodes
    return t16 / t8


def l3_stage_bytes(pr) -> float:
    from meshplan.pipeline.stages import default_layer_split

    layers = max(default_layer_split(126, pr["pp"]))
    assert layers == pr["layers"] if "layers" in pr else True
    return 2.0 * layers * layer_params_by_shapes("llama3-405b", pr["tp"])


NUMERIC = {
    "ring-volume": lambda p: ring_sent(p["n"], p["size_bytes"]) / 1e9,
    "ring-time": lambda p: ring_sent(p["n"], p["size_bytes"]) / p["bw"] * 1e3,
    "ring-latency": lambda p: ring_sim(p["n"]).steps * p["latency"] * 1e6,
    "ring-tree-crossover": lambda p: (p["n"] - 1 - math.ceil(math.log2(p["n"]))) * p["latency"] * p["n"] * p["bw"] / 1e6,
    "busbw": lambda p: p["size_bytes"] / ring_time(p["size_bytes"], p["n"], p["bw"], p["latency"]) * 2 * (p["n"] - 1) / p["n"] / 1e9,
    "hierarchical-allreduce": lambda p: (2 * 7 / 8 * p["size_bytes"] / p["intra_bw"]
                                         + ring_time(p["size_bytes"] / 8, p["nodes"], p["inter_bw"] / 8)) * 1e3,
    "dp-allreduce": lambda p: ring_time(p["size_bytes"], p["n"], p["bw"]) * 1e3,
    "tp-allreduce-bytes": lambda p: 2 * (p["tp"] - 1) / p["tp"] * 2 * p["micro_batch"] * p["seq_len"] * p["d"] / 1e6,
    "tp-overhead": lambda p: 100 * 4 * p["layers"] * ring_time(p["size_bytes"], 8, p["bw"]) / p["compute_s"],
    "tp-weights": lambda p: 2 * load_model(p["model"]).n_layers * layer_params_by_shapes(p["model"], p["tp"]) / 1e9,
    "tp-kv-heads": lambda p: len(np.array_split(np.arange(load_model(p["model"]).n_kv_heads), p["tp"])[0]) or 1,
    "tp16-vs-tp8": lambda p: tp16_ratio(p["size_bytes"]),
    "cp-kv-traffic": cp_sent,
    "zero-0": lambda p: zero_bytes(int(p["params"]), 0, p["dp"]) / 1e9,
    "zero-1": lambda p: zero_bytes(int(p["params"]), 1, p["dp"]) / 1e9,
    "zero-2": lambda p: zero_bytes(int(p["params"]), 2, p["dp"]) / 1e9,
    "zero-3": lambda p: zero_bytes(int(p["params"]), 3, p["dp"]) / 1e9,
    "zero3-comm": lambda p: 3 * (p["dp"] - 1) / p["dp"] * 2 * p["params"] / p["bw"] * 1e3,
    "mixed-vs-fp32": lambda p: (2 + {"fp16": 2, "bf16": 2, "fp32": 4}[p["grad_dtype"]] + 12) / 16,
    "format-figure": lambda p: finfo(p["format"])[p["quantity"]],
    "fp8-activations": lambda p: p["elements"] * (2 - 1) / 1e9,
    "loss-scale": lambda p: final_scale([c == "1" for c in p["flags"]], p["init_scale"], p["growth_interval"]),
    "accum-steps": lambda p: -(-p["target"] // (p["micro_batch"] * p["dp"])),
    "accum-comm-saved": lambda p: (-(-p["target"] // (p["micro_batch"] * p["dp"])) - 1) * p["allreduce_time"],
    "accum-step-time": lambda p: (-(-p["target"] // (p["micro_batch"] * p["dp"])) * p["micro_time"] + p["allreduce_time"]) * 1e3,
    "critical-batch": lambda p: 100 * p["batch_tokens"] / (p["batch_tokens"] + p["critical_tokens"]),
    "lr-linear": lambda p: p["base_lr"] * p["batch"] / p["base_batch"],
    "lr-sqrt": lambda p: p["base_lr"] * math.sqrt(p["batch"] / p["base_batch"]),
    "lr-warmup": lambda p: 1000 * p["batch"] / p["base_batch"],
    "lr-cosine": lambda p: (p["peak"] * (p["step"] + 1) / p["warmup"] if p["step"] < p["warmup"] else
                            p["floor"] + 0.5 * (p["peak"] - p["floor"]) * (1 + math.cos(math.pi * (p["step"] - p["warmup"]) / (p["total"] - p["warmup"])))),
    "overlap-buckets": lambda p: 100 * (1 - (p["comm_per_layer"] + (p["layers"] - 1) * max(0, p["comm_per_layer"] - p["compute_per_layer"]))
                                        / (p["layers"] * p["comm_per_layer"])),
    "overlap-mfu": lambda p: 100 * p["mfu"] * p["compute_s"] / (p["compute_s"] + p["comm_s"]),
    "fsdp-exposed": lambda p: fsdp_exposed(p),
    "ckpt-size": lambda p: (14 * p["params"] + 8) / 1e9,
    "ckpt-write": lambda p: (14 * p["params"] + 8) / p["write_bw"],
    "ckpt-young": lambda p: young_by_minimum((14 * p["params"] + 8) / p["write_bw"], p["mtbf"]) / 60,
    "ckpt-crash-cost": lambda p: crash_cost(p),
    "failure-restarts": lambda p: 100 * p["recovery_s"] * p["failures_per_day"] / 86400,
    "bubble-1f1b": lambda p: bubble_fraction(p["pp"], p["microbatches"]),
    "bubble-overhead": lambda p: 100 * (p["pp"] - 1) / p["microbatches"],
    "bubble-interleaved": lambda p: bubble_fraction(p["pp"], p["microbatches"], p["vpp"]),
    "inflight-activations": lambda p: (min(p["pp"], p["microbatches"]) if p["schedule"] == "1f1b" else p["microbatches"]) * p["act_bytes"] / 1e9,
    "p2p-volume": lambda p: 2 * p["microbatches"] * (p["pp"] * p["vpp"] - 1) * p["act_bytes"] / 1e9,
    "min-microbatches": lambda p: math.floor(Fraction(p["pp"] - 1) / Fraction(str(p["target"]))) + 1,  # (p−1)/m < t exactly
    "pp-tradeoff": lambda p: bubble_fraction(p["pp"], p["microbatches"]),
    "l3-dp": lambda p: p["gpus"] // (p["tp"] * p["cp"] * p["pp"]),
    "l3-weights": lambda p: l3_stage_bytes(p) / 1e9,
    "l3-pf-days": lambda p: 6 * p["params"] * p["tokens"] / (1e15 * 86400),
    "l3-days": lambda p: 6 * 405e9 * 15.6e12 / (p["gpus"] * H100_BF16 * p["mfu"]) / 86400,
    "l3-bubble": lambda p: bubble_fraction(p["pp"], p["microbatches"]),
    "l3-dp-allreduce": lambda p: ring_time(l3_stage_bytes(p), p["dp"], 50e9) * 1e3,
    "l3-electricity": lambda p: p["gpus"] * p["watts"] / 1000 * p["days"] * 24 * p["kwh_price"],
}


def fsdp_exposed(p):
    n = p["layers"]
    c = 2 * p["params"] * p["tokens"] / (p["gpus"] * H100_BF16 * 0.5) / n
    m = p["gather_bytes"] / p["bw"] / n
    return m + (n - 1) * max(0.0, m - c)


def crash_cost(p):
    C = (14 * p["params"] + 8) / p["write_bw"]
    return p["gpus"] * p["price"] * (math.sqrt(2 * C * p["mtbf"]) / 2 + C) / 3600


def check_choice_or_order(ex):
    p, a = ex.params, ex.answer
    if ex.id == "tp-shard-shape":
        cols = np.array_split(np.arange(p["d"]), p["tp"])[0].size
        return a.options[a.correct] == f"{p['d']} × {cols}"
    if ex.id == "zero-fit":
        fits = [z for z in range(4) if zero_bytes(int(p["params"]), z, p["dp"]) + p["activations_bytes"] <= p["memory_bytes"]]
        return a.correct == (fits[0] if fits else 4)
    if ex.id == "l3-layer-split":
        split = [int(x) for x in a.options[a.correct].split(", ")]
        others = [[int(x) for x in o.split(", ")] for i, o in enumerate(a.options) if i != a.correct]
        return stage_split_ok(split, p["layers"], p["pp"]) and not any(stage_split_ok(o, p["layers"], p["pp"]) for o in others)
    if ex.id == "formats-by-range":
        maxes = [finfo(a.items[i])["max"] for i in a.correct]
        return all(x > y for x, y in zip(maxes, maxes[1:]))
    if ex.id == "l3-axis-order":
        got = [a.items[i].lower() for i in a.correct]
        if p["who"] == "llama3":
            return got == ["tp", "cp", "pp", "dp"] == get_preset("llama3-405b-16k").values["rank_order"].split(",")
        return got == ["tp", "cp", "dp", "pp"]
    raise AssertionError(f"no check for {ex.id}")


FAULTY_EXPECTED = {
    "faulty-allreduce-time": lambda a: ring_time(a[0], a[1], a[2]),
    "faulty-bubble": lambda a: (a[0] - 1) / (a[1] * a[2]),
    "faulty-accumulation": lambda a: math.ceil(a[0] / (a[1] * a[2])),
    "faulty-loss-scale": lambda a: final_scale(a[0], a[1], a[2]),
    "faulty-young": lambda a: math.sqrt(2 * a[0] * a[1]),
}


# ---- the catalog --------------------------------------------------------------------------------


def test_catalog_covers_every_topic_and_kind():
    all_specs = specs()
    assert len(all_specs) >= 40
    assert {s.topic for s in all_specs} == set(TOPICS)
    kinds = {generate(s.id).kind for s in all_specs}
    assert kinds == {"numeric", "choice", "ordering", "faulty-line"}
    assert {s.difficulty for s in all_specs} == {"easy", "medium", "hard"}
    checked = set(NUMERIC) | set(FAULTY_EXPECTED) | {"tp-shard-shape", "zero-fit", "l3-layer-split", "formats-by-range", "l3-axis-order"}
    assert checked == {s.id for s in all_specs}


@pytest.mark.parametrize("spec", specs(), ids=lambda s: s.id)
def test_every_variant_against_an_independent_path(spec):
    seen = set()
    for seed in SEEDS:
        ex = generate(spec.id, seed)
        assert ex == generate(spec.id, seed)  # reproducible
        d = ex.to_dict()
        assert json.loads(json.dumps(d)) == d
        assert ex.hints and ex.solution and ex.command.startswith("meshplan ") and ex.url.startswith("/")
        seen.add(json.dumps(ex.params, sort_keys=True))
        a = ex.answer
        if isinstance(a, Numeric):
            want = NUMERIC[ex.id](ex.params)
            assert a.display == pytest.approx(want, rel=1e-6, abs=1e-12), (ex.id, seed, ex.params)
            if a.rtol == 0:
                assert a.display == round(a.display)
                assert grade(ex, round(a.display)).correct
                assert not grade(ex, round(a.display) + 1).correct and not grade(ex, round(a.display) - 1).correct
            else:
                for inside in (1 + a.rtol / 2, 1 - a.rtol / 2):
                    assert grade(ex, f"{a.display * inside!r}").correct
                for outside in (1 + 2 * a.rtol, 1 - 2 * a.rtol, 2.0, 0.5):
                    fb = grade(ex, a.display * outside)
                    assert fb.valid and not fb.correct and fb.error
        elif isinstance(a, FaultyLine):
            want = FAULTY_EXPECTED[ex.id](a.args)
            assert a.expected == pytest.approx(want, rel=1e-12)
            assert a.run(fixed=True) == pytest.approx(want, rel=1e-12)  # the corrected line fixes it
            assert a.run() != pytest.approx(want, rel=1e-9)  # the planted line breaks it
            assert grade(ex, str(a.bug)).correct
            assert not any(grade(ex, str(i)).correct for i in range(1, len(a.lines) + 1) if i != a.bug)
        else:
            assert check_choice_or_order(ex), (ex.id, seed)
            if isinstance(a, Choice):
                assert len(set(a.options)) == len(a.options) >= 2
                assert grade(ex, "abcdefgh"[a.correct]).correct and grade(ex, str(a.correct + 1)).correct
                assert not any(grade(ex, i).correct for i in range(len(a.options)) if i != a.correct)
            else:
                assert grade(ex, " ".join(a.items[i] for i in a.correct)).correct
                assert not grade(ex, list(reversed(a.correct))).correct
    assert len(seen) >= 3  # the seeds vary the problem


# ---- figures of the sources, and what the sources get wrong ------------------------------------


@pytest.mark.parametrize("id, value, said", [
    ("ring-volume", 1.75, None), ("zero-0", 112.0, None), ("zero-1", 29.3125, None), ("zero-2", 15.53125, None),
    ("zero-3", 1.75, None), ("accum-steps", 64, None), ("lr-warmup", 8000, None), ("min-microbatches", 141, None),
    ("hierarchical-allreduce", 408.33, "maybe 10 ms"), ("bubble-1f1b", 20.0, "25%"), ("bubble-interleaved", 5.882, "6.25%"),
    ("inflight-activations", 8.0, "6 GB"), ("tp-allreduce-bytes", 117.44, "56 MB"), ("tp-overhead", 20.88, "~10%"),
    ("fp8-activations", 21.47, "172 GB"), ("critical-batch", 66.67, "75%"), ("ckpt-crash-cost", 613.1, "$618"),
    ("accum-step-time", 7730, "7731"), ("cp-kv-traffic", 458.75, "7.35 GB"), ("l3-days", 67.67, "34 days"),
    ("l3-weights", 6.376, "7.4 GB"), ("fsdp-exposed", 3.90, "818 s"),
])
def test_fixed_variants_give_the_right_values(id, value, said):
    ex = generate(id)
    assert ex.answer.display == pytest.approx(value, rel=1e-3)
    if said is None:
        assert ex.source_note is None
    else:
        assert said in ex.source_note
    assert generate(id, 0).source_note is None  # random variants say nothing about the source


def test_faulty_bubble_says_the_source_blames_a_right_formula():
    ex = generate("faulty-bubble")
    assert ex.answer.bug == 5 and "bubble fraction" in ex.source_note
    assert ex.answer.run() == pytest.approx(3 / 15) and ex.answer.expected == pytest.approx(3 / 12)


def test_axis_order_corrects_the_source():
    ex = generate("l3-axis-order")
    fb = grade(ex, "TP PP CP DP")  # 001's answer
    assert not fb.correct and fb.expected == "TP → CP → PP → DP" and "positions 2, 3" in fb.error
    assert grade(ex, "1 3 2 4").correct


def test_grading_messages():
    ex = generate("ring-volume")
    assert grade(ex, "1.75 GB").correct and grade(ex, " 1.76 ").correct and not grade(ex, "1,75").correct
    fb = grade(ex, "3.5")
    assert not fb.correct and "100% too high" in fb.error and "factor 2" in fb.error
    bad = grade(ex, "lots")
    assert not bad.valid and "not a number" in bad.error
    assert not grade(ex, "1.75 MB").valid
    assert not grade(generate("tp-shard-shape"), "z").valid
    assert not grade(generate("formats-by-range"), "1 1 2 3").valid
    assert not grade(generate("faulty-young"), "9").valid
    for huge in ("1e999", "-1e999", "9" * 400, 10**400):  # past a float: unreadable, not graded as ∞
        fb = grade(ex, huge)
        assert not fb.valid and "is not a finite number; give it in GB" in fb.error
    assert grade(ex, "9" * 400).error == "'99999999999999999999…(400 characters)' is not a finite number; give it in GB"
    assert grade(ex, "1.75").to_dict()["url"] == "/calc?calc=collective&op=all-reduce&size=1GB&n=8&bw=50&latency=0us&algorithm=ring&base_latency=0us"


def test_unknown_ids_and_topics_name_the_field():
    from meshplan.errors import InputError

    with pytest.raises(InputError, match="exercise: unknown exercise 'nope'"):
        generate("nope")
    with pytest.raises(InputError, match="topic: unknown topic"):
        specs("nope")
    with pytest.raises(InputError, match="seed"):
        generate("ring-volume", -1)


# ---- the terminal -------------------------------------------------------------------------------

runner = CliRunner()


def test_piped_session():
    ids = ["ring-volume", "bubble-1f1b", "l3-axis-order", "faulty-allreduce-time", "zero-fit"]
    args = ["learn", "--fixed"] + [w for i in ids for w in ("--exercise", i)]
    answers = "1.75\nhint\n25\nTP CP PP DP\nseven\n6\nskip\n"
    r = runner.invoke(app, args, input=answers)
    assert r.exit_code == 0, r.output
    out = r.output
    assert "right: 1.75 GB" in out
    assert "wrong: 25 %: 25% too high" in out and "answer: 20 %" in out
    assert "hint: Warm-up and drain take p − 1 slots." in out
    assert "the source: 001 answers 25%" in out
    assert "right: TP → CP → PP → DP" in out
    assert "could not read that: 'seven' is not a line number" in out and "right: line 6" in out
    assert "answer: d) ZeRO-3" in out
    assert "meshplan pipeline --pp 4 --microbatches 12 --schedule 1f1b" in out and "explorer: /pipeline?pp=4" in out
    assert "bubble fraction (idle share of the step)" in out  # the worked solution
    assert "4 of 4 answered right" not in out and "3 of 4 answered right (5 of 5 exercises shown)" in out


def test_session_ends_at_end_of_input_and_seeds_reproduce():
    a = runner.invoke(app, ["learn", "--seed", "7", "--topic", "zero"], input="1\n")
    b = runner.invoke(app, ["learn", "--seed", "7", "--topic", "zero"], input="1\n")
    assert a.exit_code == 0 and a.output == b.output
    assert "seed 7 (rerun with --seed 7)" in a.output and "0 of 1 answered right (2 of 6 exercises shown)" in a.output


def test_list_and_json():
    r = runner.invoke(app, ["learn", "--list", "--topic", "pipeline"])
    assert r.exit_code == 0 and "bubble-1f1b" in r.output and "zero-1" not in r.output
    r = runner.invoke(app, ["learn", "--list", "--json", "--fixed", "--exercise", "zero-1"])
    assert r.exit_code == 0
    (d,) = json.loads(r.output)
    assert d["id"] == "zero-1" and d["answer"]["value"] == pytest.approx(29.3125) and d["fixed"] is True


@pytest.mark.parametrize("args, message", [
    (["--fixed", "--seed", "3"], "error: seed: --seed and --fixed exclude each other"),
    (["--topic", "cooking"], "error: topic: unknown topic 'cooking'"),
    (["--exercise", "nope"], "error: exercise: unknown exercise 'nope'"),
    (["--count", "0"], "error: count: must be a positive integer"),
    (["--json"], "error: json: applies to --list only"),
    (["--topic", "zero", "--exercise", "ring-volume"], "error: exercise: 'ring-volume' is not in topic 'zero'"),
])
def test_bad_flags_exit_2(args, message):
    r = runner.invoke(app, ["learn", *args])
    assert r.exit_code == 2
    assert message in r.output


# ---- mechanisms of the cost model: SM contention, the loss's memory, lockstep pipelines -----------


def contention_us(p) -> float:
    """Δ = T_h·16/n_SM with T_h a ring all-gather of one layer's bf16 weights inside one node."""
    from meshplan.cost.calibration import calibration_for

    gpu = load_gpu(p["gpu"])
    cal = calibration_for(gpu)
    n, S = p["n"], 2 * layer_params_by_shapes(p["model"], 1)
    t = cal.collective_base_latency + (n - 1) * cal.scale_up_latency + (n - 1) / n * S / (gpu.scale_up_bandwidth * cal.scale_up_efficiency)
    return t * 16 / gpu.sm_count * 1e6


def lockstep_by_slots(p) -> float:
    """torch's grid replayed slot by slot: a rank leaves a slot when its action and every send or
    receive it shares with the other rank in that slot are done."""
    from meshplan.pipeline.lockstep import inputs_precede, torch_grid

    P, v, m, tau = p["pp"], p["vpp"], p["microbatches"], p["transfer"]
    assert inputs_precede("interleaved", P, m, v)
    grid, S = torch_grid("interleaved", P, m, v), P * v
    dur = {"F": p["fwd"], "B": p["bwd"]}
    e = [0.0] * P
    for t in range(max(len(row) for row in grid)):
        cells = [row[t] if t < len(row) else None for row in grid]
        c = [e[r] + (dur[a.kind] if a else 0.0) for r, a in enumerate(cells)]
        e = list(c)
        for r, a in enumerate(cells):
            if a is None:
                continue
            to = a.stage + 1 if a.kind == "F" else a.stage - 1
            if 0 <= to < S and to % P != r:  # interleaved: stage k on rank k mod p
                done = max(c[r], c[to % P]) + tau
                e[r], e[to % P] = max(e[r], done), max(e[to % P], done)
    return max(e)


NUMERIC.update({
    "overlap-contention": contention_us,
    "loss-compiled": lambda p: 8 * p["micro_batch"] * p["seq_len"] * load_model(p["model"]).vocab_size / 2**30,
    "lockstep-runtime": lockstep_by_slots,
})


def test_overlap_contention_fixed_variant_by_hand():
    ex = generate("overlap-contention")
    assert ex.params["layer_params"] == 218_112_000 and ex.params["size_bytes"] == 436_224_000
    # NCCL's 8.4 µs per call and 3.4 µs per NVLink step (Simple protocol)
    t_h = 8.4e-6 + 7 * 3.4e-6 + 7 / 8 * 436_224_000 / (450e9 * 0.82)  # 1.066606 ms
    assert ex.answer.value == pytest.approx(t_h * 16 / 132, rel=1e-12)
    assert ex.answer.display == pytest.approx(129.2856, abs=1e-4)
    t_a100 = 8.4e-6 + 7 * 3.4e-6 + 7 / 8 * 436_224_000 / (300e9 * 0.75)  # fewer SMs, slower NVLink
    assert f"{t_a100 * 16 / 108 * 1e6:.1f}" == "256.1" and "delays the forward by 256.1 µs" in ex.explanation
    assert "the forward loses 4.137 ms" in ex.explanation  # 32 layers
    r = runner.invoke(app, ex.command.split()[1:-1] + ["--json"])  # the collective the prompt describes
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["time_s"] == pytest.approx(t_h, rel=1e-5)


def test_loss_compiled_fixed_variant_is_eight_bytes_per_logit():
    ex = generate("loss-compiled")
    n, V = 2 * 8192, 128_256
    assert ex.answer.value == 8 * n * V == 16_810_770_432 and ex.answer.display == 15.65625
    assert "23.48 GiB" in ex.solution_text() and "7.828 GiB" in ex.solution_text()  # 12·n·V against 4·n·V
    assert ex.command.endswith("--stack torchtitan-2024") and "stack=torchtitan-2024" in ex.url


def test_lockstep_runtime_fixed_variant_and_a_transfer():
    ex = generate("lockstep-runtime")
    assert (ex.params["microbatches"], ex.params["transfer"]) == (4, 0.0)
    assert ex.answer.display == 28 and ex.params["dependency"] == 27  # 2·4·3 + 3 dependency-driven
    assert "rank 1's 3F0 (slot 4) could start at 3" in ex.explanation and "receives rank 0's 2F1, which ends at 4" in ex.explanation
    assert "1 (3.70% longer)" in ex.solution_text()
    seen = {}
    for seed in range(30):
        e = generate("lockstep-runtime", seed)
        seen[(e.params["microbatches"], e.params["transfer"])] = (e.answer.display, e.params["dependency"])
    assert seen[(2, 0.25)] == (18, 16.5) and seen[(3, 0.0)] == (21, 21)  # lockstep can cost nothing, never less
    assert all(lock >= dep for lock, dep in seen.values())
    r = runner.invoke(app, ex.command.split()[1:] + ["--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["makespan"] == pytest.approx(28)
