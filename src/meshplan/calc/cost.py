"""``calc cost``: GPU-hours, dollars and energy of a run, given its length or a token budget.

* Training compute for a token budget: ``C = 6·N·D`` FLOPs for ``N`` parameters and ``D`` tokens
  (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", Sec. 2.1: 2 FLOPs per parameter
  per token forward, 4 backward; attention FLOPs not included). In petaFLOP/s-days:
  ``C / (10^15 · 86,400)``.
* Days at a model FLOP utilization ``u`` on ``G`` GPUs of dense peak ``P``: ``T = C / (G·P·u)``;
  conversely a run that took ``T`` implies ``u = C / (G·P·T)``. Peaks are dense (DESIGN.md: H100
  BF16 989.4 TFLOP/s; 1,979 is the 2:4-sparse figure).
* GPU-hours ``G·T``; dollars ``G·T·p`` at ``p`` per GPU-hour.
* Energy: ``E = G·W·T·PUE`` (board power ``W`` from the catalog unless given; PUE is the data
  centre's total / IT power, The Green Grid 2012, WP#49), electricity cost ``E·c`` at ``c`` per kWh.
"""

from __future__ import annotations

from meshplan.calc.inputs import choice, count, fraction, positive
from meshplan.calc.result import CalcResult, derive, num, pct
from meshplan.catalog import load_gpu
from meshplan.errors import InputError
from meshplan.specs.hardware import DTYPES
from meshplan.units import DAY, HOUR, PFLOPS, TFLOPS

KAPLAN = "Kaplan et al. 2020, Scaling Laws for Neural Language Models, Sec. 2.1 (C = 6ND)"
BILL = "GPU-hours × price; energy × tariff (source 001, the electricity exercise)"
PUE = "The Green Grid 2012, WP#49 (PUE = total facility power / IT power)"


def training_flops(params: float, tokens: float) -> float:
    return 6.0 * params * tokens


def run_seconds(flops: float, gpus: int, peak: float, mfu: float) -> float:
    return flops / (gpus * peak * mfu)


def implied_mfu(flops: float, gpus: int, peak: float, seconds: float) -> float:
    return flops / (gpus * peak * seconds)


def _bill(data: dict, derivs: list, name: str, key: str, title: str, formula: str, qty_symbol: tuple[str, str], qty: float,
          field: str, price: float | None, per: str) -> None:
    """quantity × price, when a price is given."""
    if price is None:
        return
    p = positive(field, price, allow_zero=True)
    data[name] = qty * p
    derivs.append(derive(key, title, formula, [qty_symbol, (formula[-1], f"${num(p)} {per}")], f"${num(qty * p)}", BILL))


def cost(gpus: int, gpu: str = "h100-sxm-80gb", dtype: str = "bf16", seconds: float | None = None,
         params: float | None = None, tokens: float | None = None, mfu: float | None = None,
         price: float | None = None, watts: float | None = None, pue: float = 1.0, kwh_price: float | None = None) -> CalcResult:
    """Give ``seconds`` (the run's length), or ``params`` and ``tokens`` with ``mfu``; with all of
    seconds, params and tokens the implied MFU is reported instead."""
    G = count("gpus", gpus, 1, 100_000_000)
    spec = load_gpu(gpu)
    P = spec.peak(choice("dtype", dtype, DTYPES))
    W = spec.tdp_watts if watts is None else positive("watts", watts)
    pue = positive("pue", pue)
    if pue < 1:
        raise InputError("pue", f"must be at least 1 (got {pue})")
    data: dict = {"gpus": G, "gpu": spec.name, "dtype": dtype, "peak_flops": P, "watts": W, "pue": pue}
    derivs = []
    C = None
    if params is not None or tokens is not None:
        if params is None or tokens is None:
            raise InputError("tokens" if tokens is None else "params", "give both --params and --tokens for a token budget")
        N, D = positive("params", params), positive("tokens", tokens)
        C = training_flops(N, D)
        data.update({"params": N, "tokens": D, "flops": C, "pf_days": C / (PFLOPS * DAY)})
        derivs.append(derive("cost.flops", "training compute", "6·N·D", [("N", f"{num(N)} parameters"), ("D", f"{num(D)} tokens")],
                             f"{C:.4g} FLOP = {num(C / (PFLOPS * DAY))} PF-days", KAPLAN))
    if seconds is None:
        if C is None or mfu is None:
            raise InputError("days", "give the run's length (--days/--hours), or --params, --tokens and --mfu")
        u = fraction("mfu", mfu)
        seconds = run_seconds(C, G, P, u)
        data["mfu"] = u
        derivs.append(derive("cost.time", "run time", "6ND / (G·P·u)",
                             [("6ND", f"{C:.4g} FLOP"), ("G", f"{G:,} GPUs"), ("P", f"{num(P / TFLOPS)} TFLOP/s dense {dtype}"), ("u", pct(u, 1))],
                             f"{num(seconds / DAY)} days", KAPLAN))
    else:
        T = positive("days", seconds)
        if C is not None:
            u = implied_mfu(C, G, P, T)
            data["implied_mfu"] = u
            derivs.append(derive("cost.implied_mfu", "implied MFU", "6ND / (G·P·T)",
                                 [("6ND", f"{C:.4g} FLOP"), ("G", f"{G:,}"), ("P", f"{num(P / TFLOPS)} TFLOP/s dense {dtype}"), ("T", f"{num(T / DAY)} days")],
                                 pct(u, 1), KAPLAN))
    hours = seconds / HOUR
    gpu_hours = G * hours
    kwh = G * W * hours * pue / 1000
    data.update({"seconds": seconds, "days": seconds / DAY, "gpu_hours": gpu_hours, "energy_kwh": kwh})
    derivs.append(derive("cost.gpu_hours", "GPU-hours", "G·T", [("G", f"{G:,}"), ("T", f"{num(hours)} h")], num(gpu_hours), BILL))
    _bill(data, derivs, "gpu_dollars", "cost.dollars", "GPU cost", "G·T·p", ("G·T", f"{num(gpu_hours)} GPU-hours"),
          gpu_hours, "price", price, "per GPU-hour")
    derivs.append(derive("cost.energy", "energy", "G·W·T·PUE", [("G", f"{G:,}"), ("W", f"{num(W)} W per GPU"), ("T", f"{num(hours)} h"), ("PUE", num(pue))],
                         f"{num(kwh)} kWh ({num(kwh / 1e6)} GWh)", PUE))
    _bill(data, derivs, "energy_dollars", "cost.electricity", "electricity cost", "E·c", ("E", f"{num(kwh)} kWh"),
          kwh, "kwh_price", kwh_price, "per kWh")
    return CalcResult("cost", data, tuple(derivs))
