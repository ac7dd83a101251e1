"""What keeps a scalar estimate fast without changing a bit of it: the GEMM model
(``cost/compute.py``) on Python numbers and on numpy arrays (one formula, two sets of
``ceil``/``maximum``; bit for bit, and real values by hand), and group placements kept per mesh
(``cost/collectives.py``: the same placements, whichever cluster asks first)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from meshplan.catalog import gpu_names, load_gpu
from meshplan.specs import ClusterSpec
from meshplan.cost import collectives
from meshplan.cost.calibration import calibration_for
from meshplan.cost.kernel_time import gemm_efficiency, gemm_time


def test_square_gemm_efficiency_by_hand_on_h100():
    gpu = load_gpu("h100-sxm-80gb")
    cal = calibration_for(gpu)
    assert gpu.sm_count == 132
    # 8192² output: 128×256 tiles -> 2048 tiles in ceil(2048/132) = 16 waves, q = 8192²/(16·132·128·256) = 32/33;
    # 128×128: 32 waves, 0.95·32/33; 64×128: 63 waves, 0.85·8192²/(63·132·8192) = 0.8374
    eta = gemm_efficiency(8192, 8192, 8192, gpu, cal)
    assert type(eta) is float
    assert eta == pytest.approx(cal.gemm_efficiency * 32 / 33 * 8192 / (8192 + cal.gemm_k_half), rel=1e-15)
    # one token: at most 128 tiles of any shape, one wave, q = 1·8192/(132·T_m·T_n)
    tiny = gemm_efficiency(1, 8192, 8192, gpu, cal)
    best = max(rel * 8192 / (132 * tm * tn) for tm, tn, rel in ((128, 256, 1.0), (256, 128, 1.0), (128, 128, 0.95), (64, 128, 0.85)))
    assert tiny == pytest.approx(cal.gemm_efficiency * best * 8192 / (8192 + cal.gemm_k_half), rel=1e-15)
    t = gemm_time(8192, 8192, 8192, gpu, cal, gpu.peak("bf16"))
    assert t == pytest.approx(2 * 8192**3 / (gpu.peak("bf16") * eta) + cal.kernel_overhead, rel=1e-15)


@pytest.mark.parametrize("gpu_name", gpu_names())
def test_scalars_and_arrays_agree_bit_for_bit(gpu_name):
    gpu = load_gpu(gpu_name)
    cal = calibration_for(gpu)
    peak = gpu.peak("bf16")
    rng = random.Random(gpu_name)
    shapes = []
    for _ in range(400):  # ints and fractions (tokens = b·s/c), 1 to 2^20
        shapes.append(tuple(rng.randint(1, 2 ** rng.randint(1, 20)) / rng.choice((1, 1, 2, 3, 8)) for _ in range(3)))
        shapes.append(tuple(rng.randint(1, 2 ** rng.randint(1, 20)) for _ in range(3)))
    m, n, k = (np.array(c) for c in zip(*shapes))
    for as_int in (False, True):
        if as_int:
            shapes = shapes[1::2]
            m, n, k = (np.array(c, dtype=np.int64) for c in zip(*shapes))
        eff, tim = gemm_efficiency(m, n, k, gpu, cal), gemm_time(m, n, k, gpu, cal, peak, 2)
        for i, (a, b, c) in enumerate(shapes):
            e1, t1 = gemm_efficiency(a, b, c, gpu, cal), gemm_time(a, b, c, gpu, cal, peak, 2)
            assert type(e1) is float and type(t1) is float
            assert e1 == eff[i] and t1 == tim[i], (a, b, c)


def test_placements_are_kept_per_mesh_and_cluster_shape():
    h100 = load_gpu("h100-sxm-80gb")
    sizes = {"tp": 4, "cp": 1, "pp": 16, "dp": 256}
    order = ("tp", "cp", "pp", "dp")
    nodes8 = ClusterSpec.of(h100, 16384)
    pods = ClusterSpec.of(h100, 16384, pod_size=3072, oversubscription=7)
    nodes4 = ClusterSpec.of(h100, 16384, gpus_per_node=4)
    collectives._placement.cache_clear()
    # dp members are 64 ranks apart: 256 domains of 1, pods of 3,072 GPUs hold 48 of them
    assert collectives.placement(nodes8, sizes, order, ("dp",)) == collectives.GroupPlacement(256, 1, 256, 1)
    assert collectives.placement(pods, sizes, order, ("dp",)) == collectives.GroupPlacement(256, 1, 256, 6)
    assert collectives.placement(nodes8, sizes, order, ("tp",)) == collectives.GroupPlacement(4, 4, 1, 1)
    assert collectives.placement(nodes4, sizes, order, ("tp", "pp")) == collectives.GroupPlacement(64, 4, 16, 1)
    assert collectives.placement(nodes8, sizes, order, ("tp", "pp")) == collectives.GroupPlacement(64, 8, 8, 1)
    # HSDP-like arguments: every 8th dp index, and the first 32 dp indices
    assert collectives.placement(nodes8, sizes, order, ("dp",), every=8) == collectives.GroupPlacement(32, 1, 32, 1)
    assert collectives.placement(pods, sizes, order, ("dp", "cp"), span={"dp": 32}) == collectives.GroupPlacement(32, 1, 32, 1)
    assert collectives.placement(pods, sizes, order, ("dp", "cp"), every={"dp": 2}) == collectives.GroupPlacement(128, 1, 128, 6)
    info = collectives._placement.cache_info()
    assert (info.hits, info.misses) == (0, 8)
    assert collectives.placement(ClusterSpec.of(h100, 16384), dict(sizes), order, ("dp",)) == collectives.GroupPlacement(256, 1, 256, 1)
    assert collectives._placement.cache_info().hits == 1  # an equal cluster and mesh: kept
