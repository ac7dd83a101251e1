"""``calc collective``: the seeds' ring and hierarchical numbers, the phases adding up to
``collective_cost``, the ring/tree crossover, and the ring all-reduce run on numpy arrays.

Bandwidths follow DESIGN.md: per GPU, per direction. Where a seed calls a figure "bidirectional"
but computes with it as the one-way rate, the test reproduces the seed's arithmetic and states
what the per-direction reading gives."""

from __future__ import annotations

import math

import pytest

from meshplan.calc.collective import Network, collective, crossover, format_trace, ring_sim_result, simulate_ring_all_reduce
from meshplan.calc.checkpoint import zero_state
from meshplan.catalog import load_gpu
from meshplan.cost.calibration import HOPPER
from meshplan.cost.collectives import GroupPlacement, collective_cost, collective_phases, wire
from meshplan.errors import InputError
from meshplan.specs import ClusterSpec
from meshplan.specs.plan import PrecisionRecipe

GB = 1e9


def flat(bw_gbps: float, latency: float = 0.0) -> Network:
    """The seeds' α–β network: a bandwidth and a per-step latency, no per-call base latency."""
    return Network(bw=bw_gbps * GB, latency=latency)


# ---- seed 001: ring all-reduce -------------------------------------------------------------


@pytest.mark.parametrize("n,expected", [(8, 1.75), (1000, 1.998)])
def test_seed001_ring_volume_per_gpu(n, expected):
    """001: 'N=8, M=1 GB: each GPU sends 0.875 GB in the reduce-scatter and 0.875 GB in the
    all-gather'; 'with 1000 GPUs: 2 × 999/1000 = 1.998 GB'."""
    r = collective("all-reduce", 1 * GB, n, flat(50), "ring")
    assert r.data["sent_bytes_per_gpu"] == pytest.approx(expected * GB, rel=1e-12)
    assert r.data["steps"] == 2 * (n - 1)
    assert [p["sent_bytes_per_gpu"] for p in r.data["phases"]] == [pytest.approx(expected * GB, rel=1e-12)]


def test_seed001_ring_time_70ms_and_latency_70us():
    """001: N=8, M=2 GB, 50 GB/s: 2M(N−1)/N / BW = 70 ms; 14 steps × 5 µs = 70 µs on top.
    The seed calls the 50 GB/s 'bidirectional' but divides by it as the one-way rate; read
    literally (25 GB/s each way, DESIGN.md's convention) the ring takes 140 ms."""
    r = collective("all-reduce", 2 * GB, 8, flat(50, 5e-6), "ring")
    assert r.data["bandwidth_s"] == pytest.approx(0.070, rel=1e-12)
    assert r.data["latency_s"] == pytest.approx(70e-6, rel=1e-12)
    assert r.data["steps"] == 14
    literal = collective("all-reduce", 2 * GB, 8, flat(25), "ring")
    assert literal.data["time_s"] == pytest.approx(0.140, rel=1e-12)


def test_seed001_tree_has_6_steps_ring_14():
    """001: 'The tree has fewer steps (6 vs 14)'; for large messages the ring wins."""
    tree = collective("all-reduce", 2 * GB, 8, flat(50, 5e-6), "tree")
    ring = collective("all-reduce", 2 * GB, 8, flat(50, 5e-6), "ring")
    assert (tree.data["steps"], ring.data["steps"]) == (6, 14)
    assert ring.data["time_s"] < tree.data["time_s"]
    assert collective("all-reduce", 2 * GB, 8, flat(50, 5e-6)).data["algorithm"] == "ring"
    assert collective("all-reduce", 1e3, 8, flat(50, 5e-6)).data["algorithm"] == "tree"


def test_busbw_equals_link_rate_for_a_bandwidth_bound_ring():
    """nccl-tests: busbw = algbw·2(n−1)/n; for the ideal ring it is the link bandwidth."""
    r = collective("all-reduce", 2 * GB, 8, flat(50), "ring")
    assert r.data["algbw"] == pytest.approx(2 * GB / 0.070, rel=1e-12)
    assert r.data["busbw"] == pytest.approx(50 * GB, rel=1e-12)
    ag = collective("all-gather", 2 * GB, 8, flat(50))
    assert ag.data["busbw"] == pytest.approx(50 * GB, rel=1e-12)
    assert ag.data["bus_factor"] == pytest.approx(7 / 8)


@pytest.mark.parametrize("n,alpha,bw", [(8, 5e-6, 50), (8, 1e-6, 450), (64, 5e-6, 50), (5, 2e-6, 100)])
def test_crossover_closed_form(n, alpha, bw):
    """Ring = tree at S* = (n − 1 − ⌈log₂ n⌉)·α·n·B for all-reduce on one tier."""
    S = crossover("all_reduce", n, flat(bw, alpha))
    assert S == pytest.approx((n - 1 - math.ceil(math.log2(n))) * alpha * n * bw * GB, rel=1e-9)
    ring = collective("all-reduce", S, n, flat(bw, alpha), "ring").data["time_s"]
    tree = collective("all-reduce", S, n, flat(bw, alpha), "tree").data["time_s"]
    assert ring == pytest.approx(tree, rel=1e-9)
    assert crossover("all_reduce", 8, flat(50, 5e-6)) == pytest.approx(8e6, rel=1e-9)  # 8 MB for 001's ring


def test_seed001_tp_allreduce_volume_is_twice_the_seeds_56MB():
    """001: 'TP=8, d=8192, s=4096, b=1, FP16 … 56 MB per AllReduce per GPU'. The activation is
    4096·8192·2 B = 64 MiB; the ring sends 2(n−1)/n of it, 112 MiB (117.4 MB). 56 MiB is one
    phase (7/8 × 64 MiB) only: the seed dropped the factor 2 of reduce-scatter + all-gather, so
    its 0.09 ms at 600 GB/s is 0.196 ms."""
    S = 4096 * 8192 * 2
    r = collective("all-reduce", S, 8, flat(600), "ring")
    assert r.data["sent_bytes_per_gpu"] == 112 * 2**20
    assert r.data["sent_bytes_per_gpu"] == 2 * 56 * 2**20
    assert r.data["time_s"] == pytest.approx(112 * 2**20 / 600e9, rel=1e-12)
    assert r.data["time_s"] * 1e3 == pytest.approx(0.196, abs=5e-4)


def test_seed001_overlap_setup_66ms():
    """001: '10B parameter model, FP16 gradients, 64 GPUs, NVLink at 600 GB/s per GPU
    (bidirectional). Ring AllReduce time? ~66 ms': 2·20 GB·63/64 / 600 GB/s = 65.6 ms, using 600
    as the one-way rate. A100's NVLink 3 is 600 GB/s both ways = 300 per direction: 131 ms."""
    r = collective("all-reduce", 20 * GB, 64, flat(600), "ring")
    assert r.data["time_s"] == pytest.approx(2 * 20 * 63 / 64 / 600, rel=1e-12)
    assert r.data["time_s"] * 1e3 == pytest.approx(65.6, abs=0.05)
    a100 = collective("all-reduce", 20 * GB, 64, flat(load_gpu("a100-sxm-80gb").scale_up_bandwidth / GB), "ring")
    assert a100.data["time_s"] * 1e3 == pytest.approx(131.25, rel=1e-9)


def test_seed001_hierarchical_all_reduce_350ms():
    """001: 8 GPUs per node on NVLink (600 GB/s), 8 nodes on InfiniBand at 100 GB/s per link
    (one link per node: 12.5 GB/s per GPU), 10B-parameter FP16 all-reduce over 64 GPUs: 'the
    cross-node step dominates … 350 ms', '5x slower than the full NVLink AllReduce'. The
    hierarchical model reproduces 350 ms for the inter-node phase (all-reduce of S/k = 2.5 GB over
    8 nodes at 12.5 GB/s per GPU = 20 GB over the node's 100 GB/s). The seed's 'intra-node steps
    add maybe 10 ms total' is wrong: reduce-scatter and all-gather of 20 GB inside the node each
    move 7/8 × 20 GB at 600 GB/s, 29.2 ms apiece, 58.3 ms together; the whole all-reduce is
    408.3 ms, 6.2x (not 5x) the 65.6 ms flat NVLink ring."""
    net = Network(bw=600 * GB, latency=0.0, gpus_per_node=8, inter_bw=12.5 * GB, inter_latency=0.0)
    r = collective("all-reduce", 20 * GB, 64, net, "ring")
    assert r.data["hierarchical"] and (r.data["gpus_per_node"], r.data["domains"]) == (8, 8)
    names = [p["name"] for p in r.data["phases"]]
    assert names == ["intra-domain reduce-scatter", "inter-domain all-reduce", "intra-domain all-gather"]
    rs, inter, ag = (p["time_s"] for p in r.data["phases"])
    assert inter == pytest.approx(0.350, rel=1e-12)
    assert rs + ag == pytest.approx(2 * 7 / 8 * 20 / 600, rel=1e-12)
    assert (rs + ag) * 1e3 == pytest.approx(58.33, abs=0.01)
    assert r.data["time_s"] == pytest.approx(0.350 + 0.0583333333, rel=1e-9)
    nvlink = collective("all-reduce", 20 * GB, 64, flat(600), "ring").data["time_s"]
    assert inter / nvlink == pytest.approx(5.33, abs=0.01)
    assert r.data["time_s"] / nvlink == pytest.approx(6.22, abs=0.01)


# ---- seed 000: TP and FSDP ---------------------------------------------------------------------


def test_seed000_tp_allreduce_nvlink_vs_ib():
    """000: 537 MB per all-reduce, TP=8 over NVLink '900 GB/s' ≈ 1.0 ms, TP=16 over IB 50 GB/s
    ≈ 20 ms, 'the 20× slowdown'. The 1.0 ms divides by the bidirectional 900; per direction (450)
    the NVLink ring takes 2.09 ms and the slowdown is 9.6×, not 20×."""
    S = 4 * 8192 * 16384
    as_seed = collective("all-reduce", S, 8, flat(900), "ring").data["time_s"]
    assert as_seed * 1e3 == pytest.approx(1.044, abs=1e-3)
    ib = collective("all-reduce", S, 16, flat(50), "ring").data["time_s"]
    assert ib * 1e3 == pytest.approx(20.13, abs=0.01)
    right = collective("all-reduce", S, 8, flat(450), "ring").data["time_s"]
    assert right * 1e3 == pytest.approx(2.088, abs=1e-3)
    assert ib / right == pytest.approx(9.64, abs=0.01)


def test_seed000_fsdp_all_gather_15ms_per_layer():
    """000: 750 MB per layer all-gathered over 128 DP ranks at 50 GB/s: 127/128 × 750 MB / 50 GB/s
    ≈ 15 ms (14.9); × 126 layers = 1.89 s. The seed's latency term α·log₂ 128 is a tree's; the
    ring all-gather has 127 latency steps (0.64 ms at 5 µs)."""
    r = collective("all-gather", 750e6, 128, flat(50, 5e-6))
    assert r.data["bandwidth_s"] * 1e3 == pytest.approx(14.88, abs=0.01)
    assert r.data["steps"] == 127
    assert r.data["latency_s"] == pytest.approx(127 * 5e-6, rel=1e-12)
    assert 126 * r.data["bandwidth_s"] == pytest.approx(1.875, abs=1e-3)


def test_seed000_dp_volume_200GB():
    """000: V_DP = 2 × 127/128 × 810 GB / 8 ≈ 200 GB per rank (reduce-scatter + all-gather)."""
    S = 810 * GB / 8
    sent = wire("reduce_scatter", S, 128)[1] + wire("all_gather", S, 128)[1]
    assert sent / GB == pytest.approx(200.9, abs=0.05)
    assert sent / GB / 30 == pytest.approx(6.7, abs=0.01)  # 'required BW = 200 GB / 30 s'


def test_seed001_zero3_communication_420ms():
    """001: ZeRO-3, 7B (14 GB of FP16 weights), 64 GPUs, 100 GB/s: AG (forward) + AG (backward)
    + RS, each ≈ M(N−1)/N: 41.3 GB, '~420 ms' (413 ms); ZeRO-1/2 one all-reduce of ~28 GB
    (27.6), so ZeRO-3 moves 1.5× more."""
    z3 = zero_state(7e9, PrecisionRecipe(grad_dtype="bf16"), 3, 64, bw=100 * GB)
    z1 = zero_state(7e9, PrecisionRecipe(grad_dtype="bf16"), 1, 64, bw=100 * GB)
    assert z3.data["comm_sent_bytes_per_step"] == pytest.approx(3 * 14 * GB * 63 / 64, rel=1e-12)
    assert z3.data["comm_time_s"] * 1e3 == pytest.approx(413.4, abs=0.1)
    assert z1.data["comm_sent_bytes_per_step"] / GB == pytest.approx(27.56, abs=0.01)
    assert z3.data["comm_sent_bytes_per_step"] / z1.data["comm_sent_bytes_per_step"] == pytest.approx(1.5)


# ---- the phases are collective_cost's ------------------------------------------------------------


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "send_recv"])
@pytest.mark.parametrize("k,g,pods", [(8, 1, 1), (1, 16, 1), (8, 4, 1), (4, 16, 2)])
@pytest.mark.parametrize("alg", ["ring", "tree", "auto"])
def test_phases_add_up_to_collective_cost(op, k, g, pods, alg):
    if alg == "tree" and op not in ("all_reduce", "broadcast", "reduce"):
        return
    n = k * g
    if n < 2:
        return
    cluster = ClusterSpec.of(load_gpu("h100-sxm-80gb"), 1024, scale_up_latency=1e-6, scale_out_latency=5e-6,
                             pod_size=512 if pods > 1 else None, oversubscription=4.0)
    pl = GroupPlacement(n, k, g, pods)
    total = collective_cost(op, 3e8, pl, cluster, HOPPER, alg)
    phases = collective_phases(op, 3e8, pl, cluster, HOPPER, alg)
    assert sum(p.cost.time for p in phases) == pytest.approx(total.time, rel=1e-12)
    assert sum(p.cost.latency_time for p in phases) == pytest.approx(total.latency_time, rel=1e-12, abs=1e-18)
    if k > 1 and g > 1 and op not in ("all_to_all", "send_recv"):
        assert {p.tier for p in phases} == {"scale-up", "scale-out"}


def test_wire_matches_the_time_model():
    """wire() is the model read with α = 1 and B = 1: steps and bytes."""
    assert wire("all_reduce", 8.0, 8) == (14, 14.0)
    assert wire("all_reduce", 8.0, 8, "tree") == (6, 16.0)
    assert wire("all_gather", 8.0, 8) == (7, 7.0)
    assert wire("broadcast", 8.0, 8, "tree") == (3, 8.0)
    assert wire("send_recv", 8.0, 2) == (1, 8.0)


# ---- the ring all-reduce on numpy arrays -----------------------------------------------------------


@pytest.mark.parametrize("n,elements", [(2, 2), (4, 8), (8, 64), (7, 100), (16, 16 * 5), (3, 1)])
def test_ring_simulation_sums_and_counts_bytes(n, elements):
    sim = simulate_ring_all_reduce(n, elements, seed=n)
    assert sim.correct and sim.max_abs_error == 0.0
    assert sim.steps == 2 * (n - 1)
    S = elements * 4
    d = ring_sim_result(sim)
    assert d["model_steps"] == sim.steps
    assert sum(sim.sent) == sum(sim.received) == pytest.approx(n * d["model_sent_bytes"], rel=1e-12)
    if elements % n == 0:  # equal chunks: every rank sends exactly 2(n−1)/n·S
        assert set(sim.sent) == {2 * (n - 1) * S // n}


def test_ring_simulation_trace_moves_one_chunk_per_rank_per_step():
    sim = simulate_ring_all_reduce(4, 8)
    assert len(sim.trace) == 2 * 3 * 4
    rs0 = [t for t in sim.trace if t[0] == "reduce-scatter" and t[1] == 0]
    assert [(src, dst, c) for _, _, src, dst, c, _ in rs0] == [(0, 1, 0), (1, 2, 1), (2, 3, 2), (3, 0, 3)]
    lines = format_trace(sim)
    assert lines[0] == "reduce-scatter step 1/3: 0→1 c0, 1→2 c1, 2→3 c2, 3→0 c3"
    assert lines[3] == "after reduce-scatter, fully reduced: rank 0: c1, rank 1: c2, rank 2: c3, rank 3: c0"
    assert len(lines) == 7


@pytest.mark.parametrize("args,field", [
    (("all-reduce", 1e9, 1), "n"), (("all-reduce", 0, 8), "size"), (("all-reduce", -1e9, 8), "size"),
    (("nope", 1e9, 8), "op"), (("all-gather", 1e9, 8), "algorithm"),
])
def test_bad_input(args, field):
    with pytest.raises(InputError) as err:
        collective(*args, flat(50), "tree" if field == "algorithm" else "auto")
    assert err.value.field == field
    with pytest.raises(InputError) as err:
        simulate_ring_all_reduce(1, 8)
    assert err.value.field == "n"
