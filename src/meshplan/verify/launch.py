"""The launcher of ``verify``'s runs on real process groups: :func:`launch` starts one spawned
process per rank (``multiprocessing`` with *spawn*, a free port on 127.0.0.1), on CPU with gloo or
with ``device="cuda"`` one per GPU with NCCL (:mod:`meshplan.verify.device`), runs every job's
task on each rank — ``comm`` (:func:`meshplan.verify.comm.run_rank`, or the ring attention of
:mod:`meshplan.verify.ring` for cp), ``memory`` (:func:`meshplan.verify.memory_trackers.run_rank`)
or ``ring-memory`` (:func:`meshplan.verify.ring.torch_ring_backward_rank`) — and kills every
worker it started after a wall-clock timeout.
"""

from __future__ import annotations

import os
import queue as queue_mod
import socket
import time
import traceback
from typing import Any

from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.verify import comm, memory_trackers, ring

DEFAULT_TIMEOUT = 240.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    try:
        bind(device, rank)
        dist.init_process_group(backend(device), rank=rank, world_size=world)
        for i, (model_d, plan_d, task) in enumerate(jobs):
            model, plan = ModelSpec.model_validate(model_d), TrainingPlan.model_validate(plan_d)
            res = _run_job(model, plan, device, task)
            out.put((i, rank, res, None))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent
        out.put((-1, rank, None, traceback.format_exc()))


TASKS = ("comm", "memory", "ring-memory")


def launch(jobs: list[tuple[ModelSpec, TrainingPlan]], timeout: float = DEFAULT_TIMEOUT, *, device: str = "cpu",
           task: str | list[str] = "comm") -> list[list[dict[str, Any]]]:
    """Run every (model, plan) job on one set of spawned workers, one per rank (all jobs need the
    same world size): CPU processes on gloo, or with ``device="cuda"`` one process per GPU on NCCL
    (:mod:`meshplan.verify.device`). ``task``, for all jobs or one per job, is ``comm`` (collectives
    counted), ``memory`` (the memory trackers on real tensors) or ``ring-memory`` (torch's ring
    attention backward measured, CPU only). Per job, the result of every rank
    in rank order. Raises RuntimeError on a worker error or after ``timeout`` seconds, killing the
    workers it started."""
    import multiprocessing as mp

    from meshplan.verify import device as device_mod

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
    device_mod.check(device, world)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    payload = [(m.model_dump(), p.model_dump(), t) for (m, p), t in zip(jobs, tasks)]
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, payload, out, device), daemon=True)
             for r in range(world)]
    what = "verify " + "/".join(sorted(set(tasks)))
    for proc in procs:
        proc.start()
    results: list[list[Any]] = [[None] * world for _ in jobs]
    pending = len(jobs) * world
    deadline = time.monotonic() + timeout
    try:
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"{what}: workers did not finish within {timeout:.0f} s")
            try:
                i, rank, res, err = out.get(timeout=min(left, 1.0))
            except queue_mod.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"{what}: worker exited with code {dead[0].exitcode}") from None
                continue
            if err is not None:
                raise RuntimeError(f"{what}: rank {rank} failed:\n{err}")
            results[i][rank] = res
            pending -= 1
        for proc in procs:
            proc.join(timeout=30)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
    return results
