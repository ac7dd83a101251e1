"""``meshplan verify comm``: one real training step per rank on a gloo CPU process group, every
collective counted.

How it runs: :func:`meshplan.verify.launch.launch` starts ``tp·pp·dp`` processes (``cp`` processes for context
parallelism, which runs alone: :mod:`meshplan.verify.ring`), ``multiprocessing`` with *spawn*,
meeting at a store the launcher holds on 127.0.0.1, a wall-clock timeout after which every worker
it started is killed. The
processes run on CPU with gloo (the default), or with ``device="cuda"`` one per GPU with NCCL, rank
r on GPU r (:mod:`meshplan.verify.device`): the same functions below run either way, the device
threaded through them. Each worker builds the Hugging Face model of the spec for real on its device
(fp32, fixed seed), lays it out as the plan says, with torch's own APIs only:

* pipeline (pp > 1): meshplan's own layer split and stage-to-rank assignment
  (:func:`meshplan.pipeline.stages.layer_split`, ``stages_of_rank``), each stage a module holding the
  model's own embedding / decoder layers / norm / head, driven by ``torch.distributed.pipelining``'s
  schedule of the same name (GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble);
* tensor parallel (tp > 1): ``parallelize_module`` with torchtitan's Llama plan (column-parallel
  q, k, v, gate, up; row-parallel o, down; vocab-parallel embedding; column-parallel LM head with
  ``loss_parallel``), plus ``SequenceParallel`` norms and ``PrepareModuleInput`` gathers with SP;
* data parallel (dp > 1): ZeRO-0 = ``DistributedDataParallel`` (one bucket holding every gradient,
  ``no_sync`` on all but the last micro-batch); ZeRO-1 = the same DDP with torch's
  ``ZeroRedundancyOptimizer``; ZeRO-3 = FSDP2 ``fully_shard`` per decoder layer, on the embedding,
  on the final norm + LM head, and on the root (:func:`shard_units`); ZeRO-2 = the same FSDP2 units
  with ``reshard_after_forward=False`` (:func:`torch_plan`); HSDP (``dp_shard`` < dp) = FSDP2 on a
  (replicate, shard) mesh, replicas all-reducing on the last micro-batch only.

It then runs one step to warm up (lazy initialisation, DDP's parameter broadcast, the pipeline's
shape exchange) and one counted step of ``m`` micro-batches, forward, backward and optimizer.

How it counts: :class:`CollectiveCounter`, a ``TorchDispatchMode`` that sees every ``c10d`` and
``_c10d_functional`` op (DDP's C++ reducer, FSDP2, DTensor redistributions, pipeline send/recv),
records the op, its process group (mapped to a mesh axis) and its bytes in nccl-tests' convention
(all-reduce buffer, all-gather output, reduce-scatter input, send buffer), and whether it ran in
backward (an autograd graph task is active). It returns ``NotImplemented`` when a DTensor is among
the argument types, so DTensor unwraps itself and its internal collectives reach the mode as plain
tensors (otherwise they are missed). Counting is at the op level: gloo implements reduce-scatter
with an all-reduce underneath, which is not what NCCL would put on the wire.
"""

from __future__ import annotations

import inspect
from typing import Any

from meshplan.errors import InputError
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.verify.layout import (
    check_tp_divisible,
    dp_mesh,
    hsdp,
    lm_loss,
    make_optimizer,
    plan_mesh,
    shard_units,
    stage_module_class,
    tp_plan,
)

#: aten op name (namespace.op) -> meshplan collective kind
OP_KIND = {
    "c10d.allreduce_": "all_reduce",
    "_c10d_functional.all_reduce": "all_reduce",
    "_c10d_functional.all_reduce_": "all_reduce",
    "c10d._allgather_base_": "all_gather",
    "c10d.allgather_": "all_gather",
    "c10d.allgather_into_tensor_coalesced_": "all_gather",
    "_c10d_functional.all_gather_into_tensor": "all_gather",
    "_c10d_functional.all_gather_into_tensor_out": "all_gather",
    "c10d._reduce_scatter_base_": "reduce_scatter",
    "c10d.reduce_scatter_": "reduce_scatter",
    "c10d.reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "_c10d_functional.reduce_scatter_tensor": "reduce_scatter",
    "c10d.alltoall_": "all_to_all",
    "c10d.alltoall_base_": "all_to_all",
    "_c10d_functional.all_to_all_single": "all_to_all",
    "c10d.broadcast_": "broadcast",
    "_c10d_functional.broadcast": "broadcast",
    "c10d.send": "send",
    "c10d.recv_": "recv",
}
#: FSDP2's copies beside its collectives (:mod:`meshplan.cost.fsdp_copies`): aten op name -> kind,
#: counted under the axis ``fsdp2`` with the bytes they read and write
COPY_KIND = {
    "fsdp.split_with_sizes_copy": "copy_out",
    "fsdp.chunk_cat": "copy_in",
}
SCHEDULES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved": "ScheduleInterleaved1F1B",
    "zbh1": "ScheduleInterleavedZeroBubble",
    "interleaved-zb": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
}
#: steps run before the counted one: lazy initialisation, the pipeline's shape exchange (step 1) and
#: DDP's bucket rebuild with its index broadcast (step 2)
WARMUP_STEPS = 2


def check_plan(model: ModelSpec, plan: TrainingPlan) -> None:
    """What the CPU run can lay out; each refusal names the field."""
    from meshplan.verify.build import model_type

    if plan.cp > 1 and plan.tp * plan.pp * plan.dp > 1:
        raise InputError("cp", "verify comm runs cp alone (a reference ring attention: torch's context_parallel has no rule for the CPU SDPA kernel)")
    if plan.ep > 1:
        raise InputError("ep", "verify comm runs dense models only (ep = 1)")
    if hsdp(plan) and plan.zero < 2:
        raise InputError("dp_shard", "verify comm runs HSDP as FSDP2 on a (replicate, shard) mesh: give --zero 3 or 2")
    if plan.recompute != "none":
        raise InputError("recompute", "verify comm runs without recompute")
    if plan.precision.precision != "fp32":
        raise InputError("precision", "verify comm runs fp32 on CPU (gloo); give --precision fp32")
    if plan.stack.fsdp_accumulate_unsharded:
        raise InputError("fsdp_accumulate_unsharded", "not run by verify comm")
    if model.dropout:
        raise InputError("model", "verify comm runs models without dropout")
    if model.tied_embeddings and plan.dp > 1 and plan.zero >= 2:
        raise InputError("model", "tied embeddings would share one weight between the embedding and LM-head FSDP units: verify runs untied models under --zero 2 or 3")
    if (plan.tp > 1 or plan.pp > 1) and model_type(model) not in ("llama", "qwen2"):
        raise InputError("model", "verify comm lays out TP and PP for Llama-style models (llama, qwen2) only")
    check_tp_divisible(model, plan)
    world = plan.tp * plan.pp * plan.dp * plan.cp
    if world > 16:
        raise InputError("gpus", f"verify comm starts one CPU process per rank: {world} is more than 16")


# ---- the counting mode ------------------------------------------------------------------------


def _group_ranks(arg: Any) -> tuple[int, ...] | None:
    """Global ranks of a process group given as a ProcessGroup or a functional group name."""
    import torch.distributed as dist

    import torch

    try:
        if isinstance(arg, torch.ScriptObject):
            arg = dist.ProcessGroup.unbox(arg)
        if isinstance(arg, str):
            from torch.distributed.distributed_c10d import _resolve_process_group

            arg = _resolve_process_group(arg)
        if isinstance(arg, dist.ProcessGroup):
            return tuple(dist.get_process_group_ranks(arg))
    except Exception:  # noqa: BLE001 - a non-group argument
        return None
    return None


def _nbytes(t: Any) -> int:
    import torch

    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    if isinstance(t, (list, tuple)):
        return sum(_nbytes(x) for x in t)
    return 0


def _collective_bytes(kind: str, name: str, args: tuple, kwargs: dict, out: Any) -> int:
    """nccl-tests' size: all-reduce buffer, all-gather output, reduce-scatter input, send buffer."""
    if name.startswith("_c10d_functional"):
        if kind == "all_gather":
            return _nbytes(out)
        return _nbytes(args[0])
    # c10d ops: (output, input, ...) for the *_base_ ones, (tensors, ...) for the others
    if name in ("c10d._allgather_base_",):
        return _nbytes(args[0])
    if name in ("c10d._reduce_scatter_base_",):
        return _nbytes(args[1])
    if name == "c10d.allgather_":
        return _nbytes(args[0])
    if name == "c10d.reduce_scatter_":
        return _nbytes(args[1])
    return _nbytes(args[0])


def make_counter(axis_of: dict[tuple[int, ...], str]):
    """A TorchDispatchMode recording (kind, axis, phase, bytes) of every collective, and of FSDP2's
    copy-out and copy-in (:data:`COPY_KIND`, bytes read and written)."""
    import torch
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    class CollectiveCounter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.records: list[dict[str, Any]] = []
            self.phase_override: str | None = None

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if any(issubclass(t, DTensor) for t in types):
                return NotImplemented  # let DTensor unwrap: its collectives come back as plain tensors
            out = func(*args, **kwargs)
            name = f"{func.namespace}.{func._schema.name.split('::')[-1]}"
            if name in COPY_KIND:  # the tensors it reads (args) and writes (out=)
                self.records.append({
                    "kind": COPY_KIND[name], "op": name, "axis": "fsdp2", "phase": self._phase(),
                    "bytes": _nbytes(list(args)) + _nbytes(list(kwargs.values())),
                })
            kind = OP_KIND.get(name)
            if kind is not None:
                ranks = None
                for a in list(args) + list(kwargs.values()):
                    ranks = _group_ranks(a)
                    if ranks is not None:
                        break
                axis = axis_of.get(tuple(sorted(ranks or ())), "world" if ranks else "?")
                if kind in ("send", "recv") and axis == "pp":  # the schedule sends gradients after their backward
                    phase = "pipeline"
                else:
                    phase = self._phase()
                self.records.append({
                    "kind": kind, "op": name, "axis": axis, "phase": phase,
                    "bytes": _collective_bytes(kind, name, args, kwargs, out),
                })
            return out

        def _phase(self) -> str:
            return self.phase_override or ("backward" if torch._C._current_graph_task_id() != -1 else "forward")

    return CollectiveCounter()


# ---- building the layout (inside a worker) -----------------------------------------------------


def _build(model: ModelSpec, plan: TrainingPlan, mesh, rank_pp: int, device: str = "cpu"):
    """This rank's stage modules (one per virtual stage it holds), laid out on ``device``; and their
    indices."""
    import torch
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.nn.parallel import DistributedDataParallel as DDP

    from meshplan.pipeline.schedules import stage_style
    from meshplan.pipeline.stages import layer_split, stages_of_rank
    from meshplan.verify.build import build_model, parts
    from meshplan.verify.device import here

    torch.manual_seed(0)
    dev = here(device)
    net = build_model(model, device=dev, attn="sdpa")
    p = parts(net)
    split = layer_split(model.n_layers, plan.pp, plan.vpp, plan.layer_split)
    n_stages = len(split)
    starts = [sum(split[:k]) for k in range(n_stages)]
    mine = stages_of_rank(rank_pp, plan.pp, plan.vpp, stage_style(plan.schedule)) if plan.pp > 1 else [0]
    Stage = stage_module_class()
    mods = []
    for k in mine:
        ids = list(range(starts[k], starts[k] + split[k]))
        mods.append(Stage(p, ids, k == 0, k == n_stages - 1, plan.seq_len))
    sp = plan.sequence_parallel and plan.tp > 1
    for mod in mods:
        if plan.tp > 1:
            layer_plan, top_plan = tp_plan(sp)
            for layer in mod.layers.values():
                parallelize_module(layer, mesh["tp"], layer_plan)
            top = {k: v for k, v in top_plan.items() if getattr(mod, k) is not None}
            if top:
                parallelize_module(mod, mesh["tp"], top)
    wrapped = []
    for mod in mods:
        if plan.dp > 1 and plan.zero >= 2:
            shard_units(mod, plan, dp_mesh(mesh, plan))
            wrapped.append(mod)
        elif plan.dp > 1:
            grad_mb = sum(q.numel() * q.element_size() for q in mod.parameters()) / 2**20
            wrapped.append(DDP(mod, process_group=mesh["dp"].get_group(), bucket_cap_mb=grad_mb + 1,
                               broadcast_buffers=False, device_ids=[dev] if dev.type == "cuda" else None))
        else:
            wrapped.append(mod)
    return wrapped, mine, n_stages


class _Trainer:
    """This rank's modules, optimizer and (with pp > 1) pipeline schedule, built once; ``step``
    runs one optimizer step of ``m`` micro-batches."""

    def __init__(self, model: ModelSpec, plan: TrainingPlan, mesh, rank_pp: int, device: str = "cpu"):
        import torch
        from torch.distributed.tensor.parallel import loss_parallel

        from meshplan.verify.device import here

        self.model, self.plan = model, plan
        self.mods, self.mine, self.n_stages = _build(model, plan, mesh, rank_pp, device)
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, model.vocab_size, (plan.grad_accum * plan.micro_batch, plan.seq_len), generator=g)
        self.ids = ids.to(here(device))
        self.loss_parallel = loss_parallel if plan.tp > 1 else None
        params = [q for mod in self.mods for q in mod.parameters()]
        self.opt = make_optimizer(params, plan, mesh)
        self.sched = None
        if plan.pp > 1:
            from torch.distributed.pipelining import PipelineStage
            from torch.distributed.pipelining import schedules as S

            self.stages = stages = [PipelineStage(mod, k, self.n_stages, here(device), group=mesh["pp"].get_group())
                                    for mod, k in zip(self.mods, self.mine)]
            cls = getattr(S, SCHEDULES[plan.schedule])
            multi = plan.schedule not in ("gpipe", "1f1b")
            self.sched = cls(stages if multi else stages[0], n_microbatches=plan.grad_accum, loss_fn=lm_loss)

    def step(self, counter=None) -> None:
        import contextlib

        plan, ids = self.plan, self.ids
        mode = counter if counter is not None else contextlib.nullcontext()
        lp = self.loss_parallel() if self.loss_parallel else contextlib.nullcontext()
        with mode, lp:
            if self.sched is not None:
                kw = {"target": ids, "losses": []} if self.n_stages - 1 in self.mine else {}
                if "return_outputs" in inspect.signature(self.sched.step).parameters:  # torch 2.10 on
                    kw["return_outputs"] = plan.stack.pp_return_outputs
                if 0 in self.mine:
                    self.sched.step(ids, **kw)
                else:
                    self.sched.step(**kw)
            else:
                mod, b, m = self.mods[0], plan.micro_batch, plan.grad_accum
                for i in range(m):
                    x = ids[i * b:(i + 1) * b]
                    sync = mod.no_sync() if hasattr(mod, "no_sync") and i < m - 1 else contextlib.nullcontext()
                    if hasattr(mod, "set_requires_all_reduce"):  # HSDP: replicas all-reduce once per step
                        mod.set_requires_all_reduce(i == m - 1)
                    with sync:
                        lm_loss(mod(x), x).backward()
            if counter is not None:
                counter.phase_override = "optimizer"
            self.opt.step()
            self.opt.zero_grad(set_to_none=False)
            if counter is not None:
                counter.phase_override = None


def run_rank(model: ModelSpec, plan: TrainingPlan, device: str = "cpu") -> dict[str, Any]:
    """Inside an initialised process group (gloo on CPU, NCCL on CUDA): warm-up steps, counted
    step; this rank's records."""
    import torch.distributed as dist

    mesh = plan_mesh(plan, device)
    axis_of = {}
    for name in mesh.mesh_dim_names:
        axis_of[tuple(sorted(dist.get_process_group_ranks(mesh[name].get_group())))] = name
    axis_of.setdefault(tuple(range(dist.get_world_size())), "world")
    rank_pp = mesh["pp"].get_local_rank() if plan.pp > 1 else 0
    trainer = _Trainer(model, plan, mesh, rank_pp, device)
    for _ in range(WARMUP_STEPS):
        trainer.step()
    counter = make_counter(axis_of)
    trainer.step(counter)
    dist.barrier()
    return {"rank": dist.get_rank(), "pp_rank": rank_pp, "stages": list(trainer.mine), "records": counter.records,
            "pp_buffers": _stage_buffers(trainer), "pp_outputs": _stage_outputs(trainer)}


def _stage_buffers(trainer: "_Trainer") -> list[int]:
    """Elements of every receive buffer this rank's pipeline stages hold after a step (torch's
    ``PipelineStage``: an input buffer per micro-batch on every stage but the first, an output
    gradient buffer per micro-batch on every stage but the last; meshplan's ``pp_buffers``
    per-micro-batch), or none without a pipeline."""
    out = []
    for stage in getattr(trainer, "stages", []):
        for infos in (*stage.args_recv_info.values(), *stage.grad_recv_info.values()):
            out += [int(info.buffer.numel()) for info in infos if getattr(info, "buffer", None) is not None]
    return out


def _stage_outputs(trainer: "_Trainer") -> list[list[int]]:
    """Per pipeline stage of this rank, the bytes of every output it still keeps after the step
    (torch's ``output_chunks``, local shards of DTensors): m logits tensors on the last stage when
    the schedule returns outputs (meshplan's ``pp_return_outputs``), none otherwise."""
    def local_bytes(t: Any) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    return [[local_bytes(t) for t in stage.output_chunks] for stage in getattr(trainer, "stages", [])]
