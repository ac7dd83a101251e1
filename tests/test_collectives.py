"""Collective communication: nccl-tests' bus factors, ring/tree/hierarchical times, group
placement under the rank order, cross-pod oversubscription, and the seeds' worked numbers.

Most tests use an ideal calibration (efficiency 1) and zero latency, so the times are the
textbook bandwidth terms and can be checked exactly."""

from __future__ import annotations

import dataclasses
import pytest

from meshplan.catalog import load_gpu
from meshplan.cost.calibration import HOPPER
from meshplan.cost.collectives import GroupPlacement, bus_factor, collective_cost, collective_time, placement
from meshplan.specs import ClusterSpec

H100 = load_gpu("h100-sxm-80gb")
A100 = load_gpu("a100-sxm-80gb")
IDEAL = dataclasses.replace(HOPPER, scale_up_efficiency=1.0, scale_out_efficiency=1.0, collective_base_latency=0.0)
NO_BASE = dataclasses.replace(HOPPER, collective_base_latency=0.0)  # the α–β model: no per-call latency
MEGATRON_ORDER = ("tp", "cp", "dp", "pp")
LLAMA3_ORDER = ("tp", "cp", "pp", "dp")


def cluster(gpu=H100, n=8, latency=0.0, **kw) -> ClusterSpec:
    return ClusterSpec.of(gpu, n, scale_up_latency=latency, scale_out_latency=latency, **kw)


def node_with(bandwidth: float, latency: float = 0.0) -> ClusterSpec:
    """One 8-GPU scale-up domain whose links run at ``bandwidth`` per direction."""
    base = cluster(n=8)
    up = base.scale_up.model_copy(update={"bandwidth": bandwidth, "latency": latency})
    return ClusterSpec.build(gpu=H100, num_gpus=8, scale_up=up, scale_out=base.scale_out)


def one_node(n: int) -> GroupPlacement:
    return GroupPlacement(n, n, 1, 1)


# ---- bus factors ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 8, 64, 1000])
def test_bus_factors(n):
    assert bus_factor("all_reduce", n) == 2 * (n - 1) / n
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert bus_factor(op, n) == (n - 1) / n
    for op in ("broadcast", "reduce", "send_recv"):
        assert bus_factor(op, n) == 1.0


def test_busbw_of_a_ring_all_reduce_is_the_link_bandwidth():
    """nccl-tests: busbw = algbw × 2(n−1)/n; for a bandwidth-bound ring it equals B·η."""
    c = cluster()
    cost = collective_cost("all_reduce", 2**30, one_node(8), c, IDEAL, "ring")
    assert cost.busbw == pytest.approx(450e9, rel=1e-12)
    assert cost.algbw == pytest.approx(450e9 / 1.75, rel=1e-12)


# ---- single tier --------------------------------------------------------------------------


@pytest.mark.parametrize("n,S", [(2, 1e6), (4, 2**30), (8, 1e9), (8, 536_870_912)])
def test_ring_single_tier_exact(n, S):
    c = cluster()
    B, eta = c.scale_up.bandwidth, HOPPER.scale_up_efficiency
    ar = collective_cost("all_reduce", S, one_node(n), c, NO_BASE, "ring")
    assert ar.time == 2 * (n - 1) / n * S / (B * eta)
    assert ar.latency_time == 0.0
    ag = collective_cost("all_gather", S, one_node(n), c, NO_BASE)
    assert ag.time == (n - 1) / n * S / (B * eta)
    rs = collective_cost("reduce_scatter", S, one_node(n), c, NO_BASE)
    assert rs.time == ag.time
    assert ar.time == pytest.approx(ag.time + rs.time, rel=1e-15)  # all-reduce = RS + AG


def test_ring_latency_steps():
    c = cluster(latency=1e-6)
    ar = collective_cost("all_reduce", 1e6, one_node(8), c, IDEAL, "ring")
    assert ar.latency_time == pytest.approx(14e-6, rel=1e-12)  # 2(n−1) steps
    ag = collective_cost("all_gather", 1e6, one_node(8), c, IDEAL)
    assert ag.latency_time == pytest.approx(7e-6, rel=1e-12)  # n−1 steps
    tree = collective_cost("all_reduce", 1e6, one_node(8), c, IDEAL, "tree")
    assert tree.latency_time == pytest.approx(6e-6, rel=1e-12)  # 2⌈log2 8⌉ steps


def test_trivial_groups_cost_nothing():
    c = cluster()
    assert collective_time("all_reduce", 1e9, GroupPlacement(1, 1, 1, 1), c, HOPPER) == 0.0
    assert collective_time("all_reduce", 0.0, one_node(8), c, HOPPER) == 0.0


def test_collective_time_is_the_cost_of_the_faster_algorithm():
    """``collective_time`` computes the time without building the cost: the same bits as
    ``collective_cost(...).time`` for every op, on one tier, across tiers (hierarchical) and across
    oversubscribed pods, where the tree wins (small buffers) and where the ring does."""
    c = ClusterSpec.of(H100, 16384, pod_size=3072, oversubscription=7)
    groups = [one_node(8), GroupPlacement(16, 1, 16, 1), GroupPlacement(64, 8, 8, 1), GroupPlacement(4096, 8, 512, 2),
              GroupPlacement(3, 2, 2, 1)]
    picked = set()
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "send_recv"):
        for pl in groups:
            for nbytes in (64.0, 3e4, 1e6, 7.5e8, 4e10):
                cost = collective_cost(op, nbytes, pl, c, HOPPER)
                assert collective_time(op, nbytes, pl, c, HOPPER) == cost.time, (op, pl, nbytes)
                picked.add(cost.algorithm)
    assert picked == {"ring", "tree"}


def test_tree_for_tiny_ring_for_big():
    """Ring: 14α + 1.75·S/B; tree: 6α + 2·S/B over 8 GPUs. They cross at S = 32·α·B; auto picks
    the faster (NCCL's tuner does the same)."""
    alpha = 5e-6
    c = cluster(latency=alpha)
    B = c.scale_up.bandwidth
    cross = 32 * alpha * B  # 72 MB
    assert collective_cost("all_reduce", 1e3, one_node(8), c, IDEAL).algorithm == "tree"
    assert collective_cost("all_reduce", 0.5 * cross, one_node(8), c, IDEAL).algorithm == "tree"
    assert collective_cost("all_reduce", 2 * cross, one_node(8), c, IDEAL).algorithm == "ring"
    assert collective_cost("all_reduce", 1e10, one_node(8), c, IDEAL).algorithm == "ring"
    ring = collective_cost("all_reduce", cross, one_node(8), c, IDEAL, "ring").time
    tree = collective_cost("all_reduce", cross, one_node(8), c, IDEAL, "tree").time
    assert ring == pytest.approx(tree, rel=1e-12)
    for S in (1e3, 1e6, cross, 1e9):
        auto = collective_time("all_reduce", S, one_node(8), c, IDEAL)
        assert auto == min(
            collective_cost("all_reduce", S, one_node(8), c, IDEAL, "ring").time,
            collective_cost("all_reduce", S, one_node(8), c, IDEAL, "tree").time,
        )


# ---- placement ---------------------------------------------------------------------------------


def test_placement_megatron_order():
    c = cluster(n=16384)
    sizes = {"tp": 8, "cp": 1, "dp": 128, "pp": 16}
    assert placement(c, sizes, MEGATRON_ORDER, ("tp",)) == GroupPlacement(8, 8, 1, 1)
    assert placement(c, sizes, MEGATRON_ORDER, ("dp",)) == GroupPlacement(128, 1, 128, 1)
    assert placement(c, sizes, MEGATRON_ORDER, ("pp",)) == GroupPlacement(16, 1, 16, 1)
    assert not placement(c, sizes, MEGATRON_ORDER, ("tp",)).crosses_nodes
    assert placement(c, sizes, MEGATRON_ORDER, ("dp",)).crosses_nodes


def test_placement_tp2_leaves_four_dp_members_per_node():
    c = cluster(n=64)
    sizes = {"tp": 2, "cp": 1, "dp": 32, "pp": 1}
    assert placement(c, sizes, MEGATRON_ORDER, ("dp",)) == GroupPlacement(32, 4, 8, 1)
    assert placement(c, {"tp": 2, "cp": 1, "dp": 4, "pp": 1}, MEGATRON_ORDER, ("dp",)) == GroupPlacement(4, 4, 1, 1)
    # cp inside tp: the (dp, cp) group of tp=2, cp=2, dp=16 is strided by 2: 4 per node
    pl = placement(c, {"tp": 2, "cp": 2, "dp": 16, "pp": 1}, MEGATRON_ORDER, ("dp", "cp"))
    assert pl == GroupPlacement(32, 4, 8, 1)


def test_placement_pods_llama3():
    """Llama 3 405B: 16,384 GPUs in pods of 3,072. Megatron order: the pp group (stride 1,024)
    spans ⌈…⌉ 6 pods; Llama 3's order (tp, cp, pp, dp) keeps pp within a pod and stretches dp
    (stride 128 × 128 members = all 16,384 GPUs) over all 6 pods."""
    c = cluster(n=16384, pod_size=3072, oversubscription=7)
    sizes = {"tp": 8, "cp": 1, "dp": 128, "pp": 16}
    assert placement(c, sizes, MEGATRON_ORDER, ("pp",)).pods == 6
    assert placement(c, sizes, MEGATRON_ORDER, ("dp",)).pods == 1  # 1,024 GPUs: inside pod 0
    assert placement(c, sizes, LLAMA3_ORDER, ("pp",)).pods == 1
    assert placement(c, sizes, LLAMA3_ORDER, ("dp",)) == GroupPlacement(128, 1, 128, 6)
    assert placement(c, sizes, LLAMA3_ORDER, ("tp",)).pods == 1


def test_placement_uneven_straddle_counts_every_node():
    """tp = 3 on 8-GPU nodes: the dp group {0, 3, 6, …, 21} touches nodes 0, 1 and 2 (3, 3 and 2
    members). Before the fix, placement reported nodes = 8 // 3 = 2."""
    c = cluster(n=24)
    pl = placement(c, {"tp": 3, "cp": 1, "dp": 8, "pp": 1}, MEGATRON_ORDER, ("dp",))
    assert pl.nodes == 3
    assert pl.per_node == 3
    assert placement(c, {"tp": 3, "cp": 1, "dp": 8, "pp": 1}, MEGATRON_ORDER, ("tp",)) == GroupPlacement(3, 3, 1, 1)


# ---- hierarchical and oversubscribed -----------------------------------------------------------


@pytest.mark.parametrize("latency", [0.0, 2e-6])
@pytest.mark.parametrize("k,g", [(8, 2), (8, 16), (4, 8), (2, 64)])
def test_hierarchical_all_reduce(latency, k, g):
    """All-reduce across g domains of k members: bandwidth of intra RS(S) + inter AR(S/k) + intra
    AG(S); latency of NCCL's flat ring through all n = k·g members, α₀ + 2((n − g)·α + (g − 1)·α_out)."""
    c = cluster(n=1024, latency=latency)
    S, n = 3e8, k * g
    pl = GroupPlacement(n, k, g, 1)
    total = collective_cost("all_reduce", S, pl, c, HOPPER, "ring")
    rs = collective_cost("reduce_scatter", S, one_node(k), c, NO_BASE)
    ag = collective_cost("all_gather", S, one_node(k), c, NO_BASE)
    inter = collective_cost("all_reduce", S / k, GroupPlacement(g, 1, g, 1), c, NO_BASE, "ring")
    bandwidth = [x.time - x.latency_time for x in (total, rs, inter, ag)]
    assert bandwidth[0] == pytest.approx(sum(bandwidth[1:]), rel=1e-12)
    steps = 2 * (n - g) + 2 * (g - 1)
    assert steps == 2 * (n - 1)  # a ring's step count, whatever the domains
    assert total.latency_time == pytest.approx(HOPPER.collective_base_latency + steps * latency, rel=1e-12)


def test_hierarchical_all_gather():
    c = cluster(n=128)
    S = 1e9
    pl = GroupPlacement(64, 8, 8, 1)
    total = collective_cost("all_gather", S, pl, c, NO_BASE)
    intra = collective_cost("all_gather", S, one_node(8), c, NO_BASE)
    inter = collective_cost("all_gather", S / 8, GroupPlacement(8, 1, 8, 1), c, NO_BASE)
    # bandwidth of the two phases; the in-domain steps repeat in each of the 8 domains (flat ring)
    assert total.time == pytest.approx(intra.time + inter.time + 7 * intra.latency_time, rel=1e-12)


def test_flat_ring_latency_at_a_thousand_gpus_is_nccls():
    """NCCL's cost model (src/graph/tuning.cc) for an all-gather over 1,024 H100 in 128 nodes of 8,
    Simple protocol: baseLat 8.4 µs + (1024 − 128) NVLink steps × 3.4 µs + 127 network steps × 14 µs
    = 4,832.8 µs, which meshplan's Hopper calibration reproduces; the domain-by-domain count of
    the textbook (7 + 127 steps) would give 1,810.2 µs."""
    c = ClusterSpec.of(H100, 1024)  # the calibration's latencies
    assert (c.scale_up.latency, c.scale_out.latency, HOPPER.collective_base_latency) == pytest.approx((3.4e-6, 14e-6, 8.4e-6), rel=1e-12)
    ag = collective_cost("all_gather", 1e9, GroupPlacement(1024, 8, 128, 1), c, HOPPER)
    assert ag.latency_time == pytest.approx(4832.8e-6, rel=1e-12)
    rs = collective_cost("reduce_scatter", 1e9, GroupPlacement(1024, 8, 128, 1), c, HOPPER)
    assert rs.latency_time == ag.latency_time
    one_per_node = collective_cost("all_gather", 1e9, GroupPlacement(128, 1, 128, 1), c, HOPPER)
    assert one_per_node.latency_time == pytest.approx((8.4 + 127 * 14) * 1e-6, rel=1e-12)


def test_point_to_point_pays_no_base_latency():
    c = ClusterSpec.of(H100, 16)
    assert collective_cost("send_recv", 1e6, GroupPlacement(2, 2, 1, 1), c, HOPPER).latency_time == pytest.approx(3.4e-6, rel=1e-12)
    a2a = collective_cost("all_to_all", 1e6, one_node(8), c, HOPPER)
    assert a2a.latency_time == pytest.approx(7 * 3.4e-6, rel=1e-12)


def test_oversubscription_only_when_rings_exceed_uplinks():
    """Across P pods with o:1 oversubscription a group of g domains gets min(1, g/(o·P)) of the
    NIC bandwidth."""
    S = 1e9
    flat = cluster(n=16384, pod_size=3072, oversubscription=1)
    over = cluster(n=16384, pod_size=3072, oversubscription=7)
    # pp group of Megatron's order: g = 16 nodes over P = 6 pods: 16/42 < 1 → slowed by 42/16
    pp = placement(over, {"tp": 8, "cp": 1, "dp": 128, "pp": 16}, MEGATRON_ORDER, ("pp",))
    assert (pp.nodes, pp.pods) == (16, 6)
    slow = collective_cost("all_gather", S, pp, over, IDEAL).time
    fast = collective_cost("all_gather", S, pp, flat, IDEAL).time
    assert slow == pytest.approx(fast * 42 / 16, rel=1e-12)
    # dp group of Llama 3's order: g = 128 over P = 6: 128/42 ≥ 1 → full NIC bandwidth
    dp = placement(over, {"tp": 8, "cp": 1, "dp": 128, "pp": 16}, LLAMA3_ORDER, ("dp",))
    assert dp.nodes / (7 * dp.pods) > 1
    assert collective_cost("all_reduce", S, dp, over, IDEAL).time == collective_cost("all_reduce", S, dp, flat, IDEAL).time
    # inside one pod nothing changes however oversubscribed
    one_pod = GroupPlacement(16, 1, 16, 1)
    assert collective_cost("all_gather", S, one_pod, over, IDEAL).time == collective_cost("all_gather", S, one_pod, flat, IDEAL).time


def test_send_recv_uses_the_tier_it_crosses():
    c = cluster(n=16)
    S = 1e8
    assert collective_cost("send_recv", S, GroupPlacement(2, 2, 1, 1), c, IDEAL).time == S / 450e9
    assert collective_cost("send_recv", S, GroupPlacement(2, 1, 2, 1), c, IDEAL).time == S / 50e9


def test_slower_nic_never_faster():
    S = 5e8
    pl = GroupPlacement(64, 8, 8, 1)
    times = [collective_time("all_reduce", S, pl, cluster(n=64, nic_bandwidth=bw), HOPPER) for bw in (100e9, 50e9, 25e9, 12.5e9)]
    assert times == sorted(times)
    assert times[0] < times[-1]


# ---- seeds -------------------------------------------------------------------------------------


def test_seed_001_ring_bytes_per_gpu():
    """Seed 001 ("Ring AllReduce"): N = 8, M = 1 GB → each GPU sends 2 × 0.875 = 1.75 GB;
    N = 1000 → 1.998 GB. Both right: wire bytes per GPU = busbw factor × S."""
    assert bus_factor("all_reduce", 8) * 1.0 == 1.75
    assert bus_factor("all_reduce", 8) / 2 == 0.875
    assert bus_factor("all_reduce", 1000) == pytest.approx(1.998, abs=1e-12)


def test_seed_001_ring_time_8_gpus_2gb():
    """Seed 001: N = 8 at "50 GB/s bidirectional per link", M = 2 GB → 70 ms (bandwidth only);
    with 14 steps × 5 µs the latency adds 70 µs. The seed divides by 50 GB/s, i.e. it uses 50 as
    the per-direction rate (a ring sends one way on each link); were 50 the two directions
    added (meshplan's specs take per-direction rates), the answer would be 140 ms."""
    c = node_with(50e9)
    t = collective_cost("all_reduce", 2e9, one_node(8), c, IDEAL, "ring")
    assert t.time == pytest.approx(0.070, rel=1e-12)
    t_lat = collective_cost("all_reduce", 2e9, one_node(8), node_with(50e9, latency=5e-6), IDEAL, "ring")
    assert t_lat.latency_time == pytest.approx(70e-6, rel=1e-12)
    assert t_lat.time == pytest.approx(0.070 + 70e-6, rel=1e-12)
    half = node_with(25e9)
    assert collective_cost("all_reduce", 2e9, one_node(8), half, IDEAL, "ring").time == pytest.approx(0.140, rel=1e-12)


def test_seed_001_10b_grads_64_gpus():
    """Seed 001 ("Communication vs computation"): 10B fp16 gradients (20 GB), 64 GPUs, "NVLink
    at 600 GB/s per GPU (bidirectional)" → "~66 ms". 2·63/64·20 GB / 600 GB/s = 65.6 ms: the seed
    uses 600 as the per-direction rate. If 600 is the bidirectional total (it is: A100 NVLink 3
    is 300 GB/s each way), the flat ring takes 131.25 ms. And 64 A100s are 8 nodes, not one
    NVLink domain: hierarchically (NVLink 300, one 25 GB/s HDR NIC per GPU, ideal efficiency) the
    all-reduce takes 2 × 58.3 ms intra + 175 ms inter = 291.7 ms."""
    S = 20e9
    flat = 2 * 63 / 64 * S
    assert flat / 600e9 == pytest.approx(0.065625, rel=1e-12)  # the seed's ~66 ms
    assert flat / 300e9 == pytest.approx(0.13125, rel=1e-12)  # 600 read as both directions
    c = ClusterSpec.of(A100, 64, scale_up_latency=0.0, scale_out_latency=0.0)
    pl = placement(c, {"tp": 1, "cp": 1, "dp": 64, "pp": 1}, MEGATRON_ORDER, ("dp",))
    assert pl == GroupPlacement(64, 8, 8, 1)
    t = collective_cost("all_reduce", S, pl, c, IDEAL, "ring").time
    intra = 2 * (7 / 8 * S / 300e9)
    inter = 2 * 7 / 8 * (S / 8) / 25e9
    assert intra == pytest.approx(0.116667, rel=1e-5)
    assert inter == pytest.approx(0.175, rel=1e-12)
    assert t == pytest.approx(intra + inter, rel=1e-12)


def test_seed_001_tp_all_reduce_bytes():
    """Seed 001 ("Tensor parallelism"): TP = 8, d = 8192, s = 4096, b = 1, fp16: the seed says
    "56 MB per AllReduce per GPU". The tensor is b·s·d·2 = 67,108,864 bytes (64 MiB); the ring
    all-reduce formula the question names sends 2·(7/8)·64 MiB = 112 MiB = 117.4 MB per GPU. The
    seed's 56 is (7/8)·64 MiB: one of the two phases (reduce-scatter only), half the bytes."""
    S = 1 * 4096 * 8192 * 2
    assert S == 64 * 2**20
    wire = bus_factor("all_reduce", 8) * S
    assert wire == 117_440_512 == 112 * 2**20
    assert (7 / 8) * S == 56 * 2**20  # the seed's figure: a single phase


def test_seed_000_tp8_all_reduce_on_nvlink():
    """Seed 000 ("Tensor Parallelism: 8-way"): all-reduce of 537 MB (4·b·s·d, b = 1, s = 8192,
    d = 16384) over TP = 8 "at 900 GB/s" → "≈ 1.0 ms". 900 GB/s is NVLink 4's two directions
    added; a ring sends 2·(7/8)·S out of each GPU at the 450 GB/s per-direction rate, so the
    bandwidth term is 2.09 ms, twice the seed's. (With HOPPER's measured 0.82 efficiency, 2.55 ms.)"""
    S = 4 * 1 * 8192 * 16384
    assert S == 536_870_912
    c = cluster(n=8)
    t = collective_cost("all_reduce", S, one_node(8), c, IDEAL, "ring").time
    assert t == pytest.approx(2 * 7 / 8 * S / 450e9, rel=1e-15)
    assert round(t * 1e3, 2) == 2.09
    assert round(2 * 7 / 8 * S / 900e9 * 1e3, 2) == 1.04  # the seed's division by 900
    real = collective_cost("all_reduce", S, one_node(8), c, HOPPER, "ring").time
    assert round(real * 1e3, 2) == 2.55
