"""``calc overlap``: how much communication hides behind compute.

One compute stream and one communication stream, each running its pieces in order:

* **bucketed gradient all-reduce** (DDP, ZeRO-1/2; Li et al. 2020, "PyTorch Distributed", Sec. 3.2):
  the backward produces bucket i after compute piece i; its all-reduce starts when the bucket is
  ready and the previous all-reduce is done. Only what runs past the end of the backward is
  exposed.
* **FSDP prefetch** (Zhao et al. 2023, "PyTorch FSDP", prefetching): layer i's parameter all-gather
  must finish before layer i computes; it may be issued once layer i − d starts (prefetch depth d,
  1 in FSDP2) and after the previous all-gather.

For ``n`` equal pieces of compute ``c`` and communication ``m`` both give the closed form
``exposed = m + (n − 1)·max(0, m − c)``: the last all-reduce (or the first all-gather) is always
exposed; the rest hide as long as ``m ≤ c``, else the stream is communication-bound and every
piece leaks ``m − c``. Overlap fraction = hidden / total communication = ``1 − exposed/(n·m)``.

The communication-to-compute ratio is ``n·m / (n·c)``; with MFU ``u`` when communication is
free, the exposed part lowers it to ``u · compute / (compute + exposed)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from meshplan.calc.inputs import choice, count, fraction, positive
from meshplan.calc.result import CalcResult, derive, num, pct, secs
from meshplan.errors import InputError

MODES = {"ddp": "ddp", "bucketed": "ddp", "allreduce": "ddp", "zero1": "ddp", "zero2": "ddp",
         "fsdp": "fsdp", "zero3": "fsdp", "prefetch": "fsdp"}
MAX_PIECES = 1_000_000
SOURCES = {
    "ddp": "Li et al. 2020, PyTorch Distributed: Experiences on Accelerating Data Parallel Training, Sec. 3.2 (gradient bucketing)",
    "fsdp": "Zhao et al. 2023, PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel (forward/backward prefetching)",
}


@dataclass(frozen=True)
class Streams:
    compute: tuple[tuple[float, float], ...]  # (start, end) of each compute piece
    comm: tuple[tuple[float, float], ...]  # (start, end) of each communication piece
    makespan: float

    @property
    def compute_total(self) -> float:
        return sum(e - s for s, e in self.compute)

    @property
    def comm_total(self) -> float:
        return sum(e - s for s, e in self.comm)

    @property
    def exposed(self) -> float:
        """Time the step is longer than its compute: communication not hidden."""
        return max(0.0, self.makespan - self.compute_total)

    @property
    def overlap_fraction(self) -> float:
        total = self.comm_total
        return min(1.0, max(0.0, 1.0 - self.exposed / total)) if total > 0 else 1.0


def two_streams(compute: Sequence[float], comm: Sequence[float], comm_first: bool, prefetch: int = 1) -> Streams:
    """Run the pieces on a compute and a communication stream (module docstring). ``comm_first``
    False: piece i's communication follows its compute (gradient buckets); True: it precedes it
    (FSDP all-gathers), issued no earlier than compute piece i − ``prefetch`` starts."""
    if len(compute) != len(comm) or not compute:
        raise InputError("buckets", "needs as many communication pieces as compute pieces, at least one")
    cs, ms = [], []
    c_end = m_end = 0.0
    for i, (c, m) in enumerate(zip(compute, comm)):
        if comm_first:
            gate = cs[i - prefetch][0] if i - prefetch >= 0 else 0.0
            m_start = max(m_end, gate)
            m_end = m_start + m
            c_start = max(c_end, m_end)
            c_end = c_start + c
        else:
            c_start, c_end = c_end, c_end + c
            m_start = max(m_end, c_end)
            m_end = m_start + m
        cs.append((c_start, c_end))
        ms.append((m_start, m_end))
    return Streams(tuple(cs), tuple(ms), max(c_end, m_end))


def exposed_closed_form(n: int, compute_piece: float, comm_piece: float) -> float:
    """``m + (n − 1)·max(0, m − c)`` for n equal pieces."""
    return comm_piece + (n - 1) * max(0.0, comm_piece - compute_piece)


def effective_mfu(mfu: float, compute: float, exposed: float) -> float:
    """MFU once the exposed communication is added to the step: ``u·compute/(compute + exposed)``."""
    return mfu * compute / (compute + exposed)


def overlap(compute: float, comm: float, pieces: int, mode: str = "ddp", mfu: float | None = None,
            prefetch: int = 1) -> CalcResult:
    """``compute``: the compute the communication can hide behind (the backward for gradient
    all-reduce, the forward for FSDP all-gathers); ``comm``: all of that communication; split into
    ``pieces`` equal buckets or layers."""
    mode = choice("mode", mode, MODES)
    compute = positive("compute", compute)
    comm = positive("comm", comm, allow_zero=True)
    n = count("buckets", pieces, 1, MAX_PIECES)
    prefetch = count("prefetch", prefetch, 1, MAX_PIECES)
    c, m = compute / n, comm / n
    st = two_streams([c] * n, [m] * n, comm_first=(mode == "fsdp"), prefetch=prefetch)
    exposed = st.exposed
    ratio = comm / compute
    bound = "communication-bound: each piece leaks m − c" if m > c else "compute-bound: all but one piece hidden"
    what = "gradient all-reduce after each bucket's backward" if mode == "ddp" else "parameter all-gather before each layer"
    data = {
        "mode": mode, "pieces": n, "compute_s": compute, "comm_s": comm, "compute_per_piece_s": c,
        "comm_per_piece_s": m, "exposed_s": exposed, "hidden_s": max(0.0, comm - exposed),
        "overlap_fraction": st.overlap_fraction, "comm_compute_ratio": ratio, "step_s": st.makespan,
        "overhead_fraction": exposed / compute, "comm_bound": m > c,
    }
    syms = [("n", f"{n} pieces ({what})"), ("c", f"{secs(c)} compute per piece"), ("m", f"{secs(m)} communication per piece")]
    derivs = [
        derive("overlap.exposed", "exposed communication", "m + (n − 1)·max(0, m − c)  (two-stream simulation)",
               syms, f"{secs(exposed)} ({bound})", SOURCES[mode]),
        derive("overlap.fraction", "overlap fraction (communication hidden)", "1 − exposed / (n·m)",
               [("exposed", secs(exposed)), ("n·m", secs(comm))], pct(st.overlap_fraction), SOURCES[mode]),
        derive("overlap.ratio", "communication / compute", "n·m / (n·c)", [("n·m", secs(comm)), ("n·c", secs(compute))],
               num(ratio), "source 001 (commComputeRatio)"),
        derive("overlap.step", "compute + exposed communication", "n·c + exposed",
               [("n·c", secs(compute)), ("exposed", secs(exposed))],
               f"{secs(st.makespan)} ({pct(exposed / compute)} over the compute)", SOURCES[mode]),
    ]
    if mfu is not None:
        u = fraction("mfu", mfu)
        eff = effective_mfu(u, compute, exposed)
        data["mfu"], data["effective_mfu"] = u, eff
        derivs.append(derive("overlap.mfu", "MFU with the exposed communication", "u · n·c / (n·c + exposed)",
                             [("u", pct(u, 1) + " (no communication)"), ("n·c", secs(compute)), ("exposed", secs(exposed))],
                             pct(eff, 1), "MFU scales with compute / step time (source 001: 50% × 242/(242+350))"))
    return CalcResult("overlap", data, tuple(derivs))
