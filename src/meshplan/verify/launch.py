"""The launcher of ``verify``'s runs on real process groups: :func:`launch` starts one spawned
process per rank (``multiprocessing`` with *spawn*), on CPU with gloo or with ``device="cuda"`` one
per GPU with NCCL (:mod:`meshplan.verify.device`), runs every job's task on each rank — ``comm``
(:func:`meshplan.verify.comm.run_rank`, or the ring attention of :mod:`meshplan.verify.ring` for
cp), ``memory`` (:func:`meshplan.verify.memory_trackers.run_rank`) or ``ring-memory``
(:func:`meshplan.verify.ring.torch_ring_backward_rank`) — and kills every worker it started after
a wall-clock timeout.

The rendezvous store is the parent's own ``TCPStore``, bound to a port the kernel picks and held
for the whole launch, so two launches at once (parallel tests) cannot meet on one port. When a
rank fails, the others fail after it only because their peer went away ("Connection closed by
peer"); :func:`launch` waits a moment for every rank's word and names the cause — the rank whose
error is its own, or the worker killed by a signal (SIGKILL: most often the kernel's out-of-memory
killer) — rather than the first consequence to arrive.
"""

from __future__ import annotations

import queue as queue_mod
import signal
import time
import traceback
import warnings
from typing import Any

from meshplan.errors import RunFailed
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.verify import comm, memory_trackers, ring

DEFAULT_TIMEOUT = 240.0
#: seconds :func:`launch` waits, after a first failure, for the other ranks' errors and exit codes
SETTLE_S = 5.0
#: what a rank's error says when it only lost its peer: a consequence of another rank's failure
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


class WorkersLost(RunFailed):
    """A launch failed without any rank failing on its own: a worker was killed by a signal (or
    exited without a word) and the others lost their peer. Nothing of meshplan's was checked."""


def _run_job(model: ModelSpec, plan: TrainingPlan, device: str, task: str) -> dict[str, Any]:
    """One job on this rank: ``comm`` (the counted step, or the ring attention for cp),
    ``memory`` (:func:`meshplan.verify.memory_trackers.run_rank`) or ``ring-memory`` (torch's ring
    attention backward, its buffers measured: :func:`meshplan.verify.ring.torch_ring_backward_rank`)."""
    if task == "memory":
        return memory_trackers.run_rank(model, plan, device)
    if task == "ring-memory":
        return ring.torch_ring_backward_rank(model, plan)
    if plan.cp > 1:
        return {**ring.run_rank(model, plan, comm.make_counter, device), "device": device}
    return {**comm.run_rank(model, plan, device), "device": device}


def _worker(rank: int, world: int, port: int, jobs: list[tuple[dict, dict, str]], out, device: str = "cpu") -> None:
    import torch
    import torch.distributed as dist

    from meshplan.verify.device import backend, bind

    torch.set_num_threads(1)
    try:
        bind(device, rank)
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False)
        dist.init_process_group(backend(device), store=store, rank=rank, world_size=world)
        for i, (model_d, plan_d, task) in enumerate(jobs):
            model, plan = ModelSpec.model_validate(model_d), TrainingPlan.model_validate(plan_d)
            res = _run_job(model, plan, device, task)
            out.put((i, rank, res, None))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent
        out.put((-1, rank, None, traceback.format_exc()))


TASKS = ("comm", "memory", "ring-memory")


def launch(jobs: list[tuple[ModelSpec, TrainingPlan]], timeout: float = DEFAULT_TIMEOUT, *, device: str = "cpu",
           task: str | list[str] = "comm", retries: int = 0) -> list[list[dict[str, Any]]]:
    """Run every (model, plan) job on one set of spawned workers, one per rank (all jobs need the
    same world size): CPU processes on gloo, or with ``device="cuda"`` one process per GPU on NCCL
    (:mod:`meshplan.verify.device`). ``task``, for all jobs or one per job, is ``comm`` (collectives
    counted), ``memory`` (the memory trackers on real tensors) or ``ring-memory`` (torch's ring
    attention backward measured, CPU only). Per job, the result of every rank in rank order.

    Raises :class:`~meshplan.errors.RunFailed` on a rank's error (the rank that failed first on
    its own, see the module docstring) or after ``timeout`` seconds, killing the workers it
    started; :class:`WorkersLost` when no rank failed on its own (a worker killed by a signal). Up
    to ``retries`` times, a launch that lost its workers so is started again whole, with a
    warning: a shared machine's out-of-memory killer is no verdict on the plan."""
    tasks = [task] * len(jobs) if isinstance(task, str) else list(task)
    if len(tasks) != len(jobs) or any(t not in TASKS for t in tasks):
        raise ValueError(f"task must be one of {TASKS}, or one of them per job (got {task!r})")
    worlds = {p.tp * p.pp * p.dp * p.cp for _, p in jobs}
    if len(worlds) != 1:
        raise ValueError("all jobs of one launch need the same world size")
    world = worlds.pop()
    for (m, p), task_i in zip(jobs, tasks):
        if task_i == "memory":
            memory_trackers.check_plan(m, p)
        elif task_i == "ring-memory":
            ring.check_ring_memory_plan(m, p)
        else:
            comm.check_plan(m, p)
    from meshplan.verify import device as device_mod

    device_mod.check(device, world)
    payload = [(m.model_dump(), p.model_dump(), t) for (m, p), t in zip(jobs, tasks)]
    what = "verify " + "/".join(sorted(set(tasks)))
    for attempt in range(retries):
        try:
            return _run_workers(payload, world, device, timeout, what)
        except WorkersLost as lost:
            warnings.warn(f"{lost} — starting the launch again ({attempt + 1} of {retries})", RuntimeWarning, stacklevel=2)
    return _run_workers(payload, world, device, timeout, what)


def _run_workers(payload: list[tuple[dict, dict, str]], world: int, device: str, timeout: float,
                 what: str) -> list[list[dict[str, Any]]]:
    """One launch: the store held here, ``world`` spawned workers, their results gathered until
    every rank of every job has answered, the first failure, or ``timeout``."""
    import multiprocessing as mp
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, timeout=timedelta(seconds=timeout),
                          wait_for_workers=False)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, world, store.port, payload, out, device), daemon=True)
             for r in range(world)]
    for proc in procs:
        proc.start()
    results: list[list[Any]] = [[None] * world for _ in payload]
    pending = len(payload) * world
    deadline = time.monotonic() + timeout
    try:
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RunFailed(f"{what}: workers did not finish within {timeout:g} s")
            try:
                i, rank, res, err = out.get(timeout=min(left, 1.0))
            except queue_mod.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    _raise_cause(what, {}, procs, out)
                continue
            if err is not None:
                _raise_cause(what, {rank: err}, procs, out)
            results[i][rank] = res
            pending -= 1
        for proc in procs:
            proc.join(timeout=30)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        del store  # the rendezvous closes once no worker is left to use it
    return results


def _raise_cause(what: str, errors: dict[int, str], procs: list, out) -> None:
    """Raise the failure's cause. For :data:`SETTLE_S` seconds (or until every worker has exited
    and said all it had to say) the other ranks' errors are gathered; then the cause is the lowest
    rank whose error is its own (not one of :data:`PEER_LOST`), else :class:`WorkersLost` naming
    the first worker that died by a signal or without a word, else :class:`WorkersLost` saying that
    every failing rank only lost its peer; each other rank's last line follows."""
    settle = time.monotonic() + SETTLE_S
    while time.monotonic() < settle:
        try:
            _, rank, _, err = out.get(timeout=0.2)
        except queue_mod.Empty:
            if all(p.exitcode is not None for p in procs):
                break
            continue
        if err is not None:
            errors.setdefault(rank, err)
    own = sorted(r for r, e in errors.items() if not any(m in e for m in PEER_LOST))
    if own:
        raise RunFailed(f"{what}: rank {own[0]} failed:\n{errors[own[0]]}")
    gone = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in errors]
    if gone or errors:
        told = "".join(f"\nrank {r} then failed: {e.strip().splitlines()[-1]}" for r, e in sorted(errors.items()))
        if gone:
            rank, code = gone[0]
            raise WorkersLost(f"{what}: rank {rank} {_death(code)}{told}")
        raise WorkersLost(f"{what}: every failing rank lost its peer{told}")
    raise AssertionError("a failure without an error or a dead worker")


def _death(exitcode: int) -> str:
    """How a worker ended, from :attr:`multiprocessing.Process.exitcode` (−N: killed by signal N)."""
    if exitcode < 0:
        name = signal.Signals(-exitcode).name
        hint = " (most often the kernel's out-of-memory killer)" if name == "SIGKILL" else ""
        return f"was killed by {name}{hint}"
    return f"exited with code {exitcode} without an error of its own"
