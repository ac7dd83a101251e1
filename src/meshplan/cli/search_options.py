"""The options of a search, declared once and shared by ``meshplan search``, ``meshplan export
--from-search`` and the web explorer's ``POST /api/search``.

Each option is a field of :class:`SearchArgs`: its type, its default and, in the field's metadata,
its typer option (flag and help). :func:`search_options` puts the options into a command's
signature where the command's ``search: SearchArgs`` parameter stands and hands the command one
:class:`SearchArgs`; :meth:`SearchArgs.check`, :meth:`SearchArgs.limits` and
:meth:`SearchArgs.global_batches` turn the values into what :func:`meshplan.search.run.search`
takes. A new search option is one new field here (and its use in :meth:`SearchArgs.limits`).
"""

from __future__ import annotations

import functools
import inspect
import typing
from dataclasses import dataclass, field, fields
from typing import Annotated, Any, Callable, Optional

import typer

from meshplan.cli.options import PlanArgs, parse_batch_tokens
from meshplan.errors import InputError
from meshplan.search.run import OBJECTIVES
from meshplan.pipeline.schedules import UNMODELLED_SCHEDULES
from meshplan.search.space import RECOMPUTE, SCHEDULE_NAMES, SearchLimits


def _option(default: Any, decl: str, help: str, **kw: Any) -> Any:
    return field(default=default, metadata={"option": typer.Option(decl, help=help, **kw)})


@dataclass(frozen=True)
class SearchArgs:
    """The search's own options (the plan's are :class:`~meshplan.cli.options.PlanArgs`)."""

    objective: str = _option("throughput", "--objective", f"Rank by {', '.join(OBJECTIVES)} (time-to-train needs --tokens, cost --tokens and --price).")
    top: int = _option(10, "--top", "How many plans to show.")
    headroom: float = _option(0.0, "--headroom", "Fraction of HBM kept free: plans must fit in HBM x (1 - headroom).")
    max_tp: Optional[int] = _option(None, "--max-tp", "Largest TP degree. (default: GPUs per node)", show_default=False)
    max_cp: Optional[int] = _option(None, "--max-cp", "Largest CP degree. (default: 16)", show_default=False)
    max_pp: Optional[int] = _option(None, "--max-pp", "Largest PP degree. (default: 128)", show_default=False)
    max_vpp: Optional[int] = _option(None, "--max-vpp", "Most virtual stages per rank. (default: 8)", show_default=False)
    max_micro_batch: Optional[int] = _option(None, "--max-micro-batch", "Largest micro-batch. (default: 8)", show_default=False)
    max_ep: Optional[int] = _option(None, "--max-ep", "Largest expert-parallel degree (mixture-of-experts models). (default: the expert count)", show_default=False)
    schedules: Optional[str] = _option(None, "--schedules", "Comma-separated schedules to consider. (default: all)", show_default=False)
    hsdp: bool = _option(False, "--hsdp", "Also try HSDP shard groups (1 < dp_shard < dp).")
    batch_range: Optional[str] = _option(None, "--batch-range", "Let the global batch vary: MIN,MAX tokens (e.g. 4M,16M), doubling from MIN.", show_default=False)

    def given(self) -> list[str]:
        """The options set to something other than their default, as flags (``--max-tp``)."""
        return [_flag(f.name) for f in fields(self) if getattr(self, f.name) != f.default]

    def check(self, max_top: int = 1000) -> None:
        """InputError naming the option when the objective is unknown, ``top`` is outside
        1..``max_top`` or the headroom is not a fraction in [0, 1)."""
        if self.objective not in OBJECTIVES:
            raise InputError("objective", f"must be one of {', '.join(OBJECTIVES)} (got '{self.objective}')")
        if not 1 <= self.top <= max_top:
            raise InputError("top", f"must be between 1 and {max_top} (got {self.top})")
        if not 0.0 <= self.headroom < 1.0:
            raise InputError("headroom", f"must be a fraction in [0, 1) (got {self.headroom})")

    def limits(self, plan: PlanArgs) -> SearchLimits:
        """The search space: the ``--max-*`` limits and ``--schedules``, with every layout flag of
        ``plan`` that is set fixing its axis."""
        sched = tuple(s.strip() for s in self.schedules.split(",")) if self.schedules else SCHEDULE_NAMES
        for s in sched:
            if s in UNMODELLED_SCHEDULES:
                raise InputError("schedules", UNMODELLED_SCHEDULES[s])
            if s not in SCHEDULE_NAMES:
                raise InputError("schedules", f"unknown schedule '{s}' ({', '.join(SCHEDULE_NAMES)})")
        if plan.schedule is not None:
            sched = (plan.schedule,)
        for name in ("max_tp", "max_cp", "max_pp", "max_vpp", "max_micro_batch", "max_ep"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InputError(name, f"must be at least 1 (got {value})")
        return SearchLimits(
            max_tp=self.max_tp,
            max_cp=self.max_cp if self.max_cp is not None else 16,
            max_pp=self.max_pp if self.max_pp is not None else 128,
            max_vpp=self.max_vpp if self.max_vpp is not None else 8,
            max_micro_batch=self.max_micro_batch if self.max_micro_batch is not None else 8,
            max_ep=self.max_ep,
            tp=plan.tp, cp=plan.cp, pp=plan.pp, dp=plan.dp, ep=plan.ep, vpp=plan.vpp, micro_batch=plan.micro_batch,
            schedules=sched,
            recompute=(plan.recompute,) if plan.recompute else RECOMPUTE,
            zero=(int(plan.zero),) if plan.zero is not None else (0, 1, 2, 3),
            sequence_parallel=(plan.sequence_parallel,) if plan.sequence_parallel is not None else (True, False),
            tp_comm_overlap=(bool(plan.tp_comm_overlap),),
            hsdp=self.hsdp,
        )

    def global_batches(self, seq_len: int) -> Optional[tuple[int, ...]]:
        """``--batch-range MIN,MAX`` (tokens) → the global batches (sequences) tried: MIN, then
        doubling, up to MAX (MAX itself last); None without ``--batch-range``."""
        if self.batch_range is None:
            return None
        parts = self.batch_range.split(",")
        if len(parts) != 2:
            raise InputError("batch_range", f"expected MIN,MAX tokens such as 4M,16M (got '{self.batch_range}')")
        try:
            lo, hi = (int(parse_batch_tokens(p.strip())) // seq_len for p in parts)
        except InputError as err:  # the bound is --batch-range's, not --global-batch-tokens'
            raise InputError("batch_range", f"MIN and MAX {err.rule}") from None
        if lo < 1 or hi < lo:
            raise InputError("batch_range", f"needs 1 sequence <= MIN <= MAX (got {lo:,} and {hi:,} sequences of {seq_len:,} tokens)")
        out, b = [], lo
        while b <= hi:
            out.append(b)
            b *= 2
        if out[-1] != hi:
            out.append(hi)
        return tuple(out)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def option_types() -> dict[str, tuple[Any, Any, str]]:
    """name → (type, default, help) of every search option, in declaration order."""
    hints = typing.get_type_hints(SearchArgs)
    return {f.name: (hints[f.name], f.default, f.metadata["option"].help) for f in fields(SearchArgs)}


def search_options(omit: tuple[str, ...] = ()) -> Callable:
    """Give command ``fn(..., search: SearchArgs, ...)`` every search option but those in ``omit``
    (which keep their defaults), in ``search``'s place in the signature."""
    unknown = set(omit) - {f.name for f in fields(SearchArgs)}
    assert not unknown, f"not search options: {sorted(unknown)}"
    hints = typing.get_type_hints(SearchArgs)
    shared = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                          annotation=Annotated[hints[f.name], f.metadata["option"]])
        for f in fields(SearchArgs) if f.name not in omit
    ]

    def decorate(fn: Callable) -> Callable:
        fn_hints = typing.get_type_hints(fn, include_extras=True)
        params: list[inspect.Parameter] = []
        for p in inspect.signature(fn).parameters.values():
            if p.name == "search":
                params += shared
            else:
                params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=fn_hints.get(p.name, p.annotation)))
        assert len(params) == len(inspect.signature(fn).parameters) - 1 + len(shared), f"{fn.__name__} has no search parameter"

        @functools.wraps(fn)
        def wrapper(**kw: Any):
            return fn(search=SearchArgs(**{p.name: kw.pop(p.name) for p in shared}), **kw)

        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return decorate
