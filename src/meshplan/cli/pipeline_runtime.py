"""The pipeline runtime of ``meshplan pipeline``: which runtime runs a schedule, and in what words.

Two runtimes (:mod:`meshplan.pipeline.lockstep`, module docstring):

* dependency-driven (Megatron-LM, torch's single-stage ``Schedule1F1B`` and ``ScheduleGPipe``,
  torch's later ``_PipelineScheduleRuntime``): an action waits only for its rank and its input;
* lockstep (torch's 2024 ``PipelineScheduleMulti``): slot by slot over torch's ``pipeline_order``
  grid, each rank leaving slot t only after its neighbours' sends and receives of slot t,
  e_r(t) = max(c_r(t), max over q in L_r(t) of max(c_r(t), c_q(t)) + τ).

Lockstep applies to torch's multi-stage schedules (interleaved, interleaved-zb, zbh1, zbv) on
p > 1 ranks (:func:`~meshplan.pipeline.lockstep.runs_lockstep`); GPipe, 1F1B and p = 1 run
dependency-driven whatever is asked, and the output says so. Lockstep needs the grid of slots,
which an action list alone does not give (the same order fits many grids): a schedule read from
``--actions-file`` runs in lockstep only when its actions are, rank by rank, those of one of
meshplan's built schedules — torch's order, whose grid is torch's — and is refused otherwise.

The cost of lockstep is reported against the dependency-driven run of the same actions and times:
extra = T_lockstep − T_dependency ≥ 0, and extra / T_dependency.
"""

from __future__ import annotations

from meshplan.errors import InputError
from meshplan.pipeline import schedules as sched
from meshplan.pipeline.blocking import runs_blocking
from meshplan.pipeline.deepspeed_steps import runs_deepspeed
from meshplan.pipeline.lockstep import LOCKSTEP_SCHEDULES, runs_lockstep, runtime_words
from meshplan.pipeline.simulate import RUNTIMES

#: the help of ``--pipeline-runtime`` (the stack field of the same name, :class:`meshplan.specs.stack.Stack`)
RUNTIME_HELP: str = (
    "How pipeline ranks advance: dependency (Megatron-LM, torch's 1F1B and GPipe: an action waits only for its "
    "rank and its input) or lockstep (torch's multi-stage schedules as torchtitan's 2024 runs ran them, "
    "PipelineScheduleMulti: slot by slot over the schedule's grid, each rank waiting for its neighbours' sends and "
    "receives of the slot; changes interleaved, interleaved-zb, zbh1 and zbv only), deepspeed (DeepSpeed's "
    "pipeline engine: 1F1B in steps that each begin with a blocking exchange with one neighbour) or blocking "
    "(Megatron-LM's 1F1B and interleaved loops of 2021-22: a blocking exchange with the neighbours after each action). "
    "(default: the --stack's, dependency for megatron-core)")

#: the torch class that runs each single-stage schedule (dependency-driven)
SINGLE_STAGE_CLASS = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}


def check_runtime(runtime: str | None) -> str:
    """The runtime asked for: ``None`` is the default, dependency; anything else but the
    runtimes' names is refused naming the field."""
    if runtime is None:
        return "dependency"
    value = str(runtime).strip()
    if value not in RUNTIMES:
        raise InputError("pipeline_runtime", f"must be {', '.join(RUNTIMES[:-1])} or {RUNTIMES[-1]} (got '{runtime}')")
    return value


def matching_schedule(ranks, pp: int, m: int, v: int) -> str | None:
    """The built schedule whose action lists equal ``ranks`` rank for rank (p ranks, m
    micro-batches, v virtual stages per rank), or ``None`` when none does."""
    for name in sched.SCHEDULES:
        try:
            built = sched.build_schedule(name, pp, m, v)
        except (InputError, ValueError):
            continue  # this schedule does not take p, m, v
        if built == tuple(tuple(acts) for acts in ranks):
            return name
    return None


def resolve_runtime(asked: str, name: str, pp: int, m: int, v: int, ranks, from_file: bool) -> tuple[str, str | None, str]:
    """(runtime that runs, schedule whose torch grid lockstep replays or ``None``, words for the
    output). ``name`` is the schedule's name (``from-file`` for ``--actions-file``)."""
    if asked == "dependency":
        return "dependency", None, "dependency-driven (an action waits only for its rank and its input)"
    if asked in ENGINE_RUNTIMES:
        return _engine_runtime(asked, name, pp, m, v, ranks, from_file)
    if pp == 1:
        return "dependency", None, ("dependency-driven: one pipeline rank sends and receives nothing, "
                                    "so --pipeline-runtime lockstep changes nothing")
    grid = name
    if from_file:
        grid = matching_schedule(ranks, pp, m, v)
        if grid is None:
            raise InputError("pipeline_runtime", (
                f"lockstep replays torch's slot grid of a built schedule ({', '.join(LOCKSTEP_SCHEDULES)}), and the "
                f"actions of --actions-file are none of them for p = {pp}, m = {m}, v = {v}: an action order alone "
                f"does not fix the slots; drop --pipeline-runtime lockstep (dependency-driven) or give --schedule"))
    if not runs_lockstep(grid, pp, asked):
        source = f"the file's actions are the {grid} schedule, which " if from_file else ""
        return "dependency", None, (f"dependency-driven: {source}torch runs {grid} with a single-stage class "
                                    f"({SINGLE_STAGE_CLASS.get(grid, grid)}), so --pipeline-runtime lockstep changes nothing")
    words = runtime_words(grid, pp, m, v, asked) + \
        " (PipelineScheduleMulti: a rank leaves each slot after its neighbours' sends and receives of it)"
    if from_file:
        words += f"; the file's actions are those of the {grid} schedule, whose grid this is"
    return "lockstep", grid, words


#: the runtimes that replay one engine's own loop: (the test that a schedule runs it, the schedules
#: it runs, what the output says it does)
ENGINE_RUNTIMES = {
    "deepspeed": (runs_deepspeed, "DeepSpeed's pipeline engine runs 1f1b only",
                  "DeepSpeed's TrainSchedule: 2(m + p − 1) steps, each beginning with a blocking exchange with one "
                  "neighbour, so a stage waits for that neighbour's step"),
    "blocking": (runs_blocking, "Megatron-LM's loops run 1f1b and interleaved only",
                 "Megatron-LM's 2021–22 loops: after each action a blocking exchange with the neighbours "
                 "(batch_isend_irecv, wait, torch.cuda.synchronize), so a rank waits for the neighbours it exchanges with"),
}


def _engine_runtime(asked: str, name: str, pp: int, m: int, v: int, ranks, from_file: bool) -> tuple[str, str | None, str]:
    """:func:`resolve_runtime` for an engine's own loop (:data:`ENGINE_RUNTIMES`), which runs only
    the schedules it has (:mod:`meshplan.pipeline.deepspeed_steps`, :mod:`meshplan.pipeline.blocking`)."""
    runs, only, words = ENGINE_RUNTIMES[asked]
    grid = matching_schedule(ranks, pp, m, v) if from_file else name
    if not runs(grid or name, pp, asked, m):
        why = "one pipeline rank sends and receives nothing" if pp == 1 else f"{only}, not {grid or name}"
        if pp > 1 and asked == "blocking" and (grid or name) == "interleaved":
            why = f"Megatron-LM interleaves only with the micro-batches a multiple of p (m = {m}, p = {pp})"
        return "dependency", None, f"dependency-driven: {why}, so --pipeline-runtime {asked} changes nothing"
    return asked, grid, words


def lockstep_cost(makespan: float, dependency: float) -> tuple[float, float]:
    """(extra, extra / T_dependency): what lockstep adds to the dependency-driven makespan."""
    extra = makespan - dependency
    return extra, (extra / dependency if dependency > 0 else 0.0)


__all__ = ["RUNTIMES", "RUNTIME_HELP", "check_runtime", "matching_schedule", "resolve_runtime", "lockstep_cost"]
