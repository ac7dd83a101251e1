"""GPU-to-GPU performance variability: a synchronous step waits for its slowest GPU.

GPUs of one SKU do not sustain the same throughput: under the same power limit their clocks
settle differently (silicon, cooling, power delivery). Sinha et al. (SC'22, "Not All GPUs Are
Created Equal: Characterizing Variability in Large-Scale, Accelerator-Rich Systems", arXiv
2208.11035) measured over 18,800 GPU-hours on more than 90 % of the GPUs of four clusters (V100
and RTX 5000 in Summit, Vortex, Frontera, Longhorn), SGEMM, ResNet-50, BERT, LAMMPS and PageRank:
an 8 % average performance variation between a cluster's GPUs, up to 22 %, persistent from run
to run. Read as the range of a normal spread over a cluster of N_c ≈ 4,000 GPUs, whose expected
range is 2·z(N_c)·σ ≈ 7σ, it is a coefficient of variation σ/μ ≈ 1.1 %; meshplan takes 1 %
(:data:`THROUGHPUT_CV`). No such study is published for A100 or H100, so the figure is applied to
every generation and stated as such (docs/model.md).

Every GPU of a training job meets the others at least once a step (the DP gradient reduction; the
pipeline and TP groups more often), and a slow GPU is slow in every kernel, so the step runs at the
pace of the slowest of the N GPUs. For per-GPU compute speeds spread N(μ, σ²), the expected
slowest of N is μ·(1 + (σ/μ)·z(N)) with z(N) the expected maximum of N standard normals, which
Blom's approximation (Blom 1958, "Statistical Estimates and Transformed Beta-Variables") gives as

    z(N) ≈ Φ⁻¹((N − 0.375) / (N + 0.25))        (z(1) = 0; z(8) = 1.43; z(512) = 3.03; z(16,384) = 3.96;
                                                   the exact means 1.42, 3.04, 3.97)

so the compute of a plan on N GPUs takes f(N) = 1 + (σ/μ)·z(N) times a single GPU's
(:func:`straggler_factor`). Communication is not slowed (the links' rates do not follow the SM
clock). What this leaves out: the heavier tail of faulty machines (MegaScale, NSDI'24, §6.3:
about 0.5 % of machines 10 % slower, found and removed in production) and software stragglers
(garbage collection, data loading), which production jobs work to remove.
"""

from __future__ import annotations

from functools import lru_cache
from statistics import NormalDist

#: σ/μ of the sustained compute throughput of GPUs of one SKU (module docstring: Sinha et al.
#: SC'22's 8 % average variation over ~4,000 GPUs, read as the range of a normal spread)
THROUGHPUT_CV = 0.01


@lru_cache(maxsize=None)
def expected_max_z(n: int) -> float:
    """z(N): the expected maximum of N independent standard normals, by Blom's approximation
    Φ⁻¹((N − 0.375)/(N + 0.25)) (module docstring); 0 for one GPU."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def straggler_factor(n_gpus: int, cv: float = THROUGHPUT_CV) -> float:
    """f(N) = 1 + cv·z(N): how much longer the compute of a step synchronized over ``n_gpus``
    GPUs takes than one GPU's, waiting for the slowest."""
    return 1.0 + cv * expected_max_z(n_gpus)
