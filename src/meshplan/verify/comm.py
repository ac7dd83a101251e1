"""``meshplan verify comm``: one real training step per rank on a gloo CPU process group, every
collective counted.

How it runs: :func:`launch` starts ``tp·pp·dp`` processes (``cp`` processes for context
parallelism, which runs alone: :mod:`meshplan.verify.ring`), ``multiprocessing`` with *spawn*, a
free port on 127.0.0.1, a wall-clock timeout after which every worker it started is killed. The
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
import os
import queue as queue_mod
import socket
import time
import traceback
from typing import Any

from meshplan.errors import InputError
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan

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
DEFAULT_TIMEOUT = 240.0
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


def check_tp_divisible(model: ModelSpec, plan: TrainingPlan) -> None:
    """torch's TP plan splits heads, K/V heads, the MLP, the vocabulary and (with SP) the sequence
    evenly over tp ranks."""
    if plan.tp > 1:
        for name, value in (("n_heads", model.n_heads), ("n_kv_heads", model.n_kv_heads), ("ffn_hidden", model.ffn_hidden),
                            ("vocab_size", model.vocab_size), ("seq_len", plan.seq_len)):
            if value % plan.tp:
                raise InputError(name, f"must be a multiple of tp ({plan.tp}) for torch's tensor parallel plan (got {value})")


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


def _stage_module_class():
    import torch
    from torch import nn

    class Stage(nn.Module):
        """One pipeline stage (or the whole model): the Hugging Face model's own embedding, decoder
        layers, final norm and LM head, glued as ``LlamaModel.forward`` does (no KV cache, causal
        SDPA without a mask, explicit positions so that sequence-sharded inputs keep the full RoPE)."""

        def __init__(self, parts: dict, layer_ids: list[int], first: bool, last: bool, seq_len: int):
            super().__init__()
            self.embed = parts["embed"] if first else None
            self.layers = nn.ModuleDict({str(i): parts["layers"][i] for i in layer_ids})
            self.norm = parts["norm"] if last else None
            self.head = parts["head"] if last else None
            self.rotary = parts["rotary"]
            self.seq_len = seq_len

        def forward(self, x):
            if self.embed is not None:
                x = self.embed(x)
            pos = torch.arange(self.seq_len, device=x.device).unsqueeze(0)
            cos_sin = self.rotary(x, pos)
            for layer in self.layers.values():
                x = layer(x, attention_mask=None, position_ids=pos, position_embeddings=cos_sin)
            if self.head is not None:
                x = self.head(self.norm(x))
            return x

    return Stage


def _tp_plan(sp: bool):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    layer = {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1) if sp else Replicate()),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1) if sp else Replicate()),
    }
    if sp:
        layer |= {
            "input_layernorm": SequenceParallel(),
            "post_attention_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                            desired_input_kwarg_layouts={"hidden_states": Replicate()}),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        }
    top = {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1) if sp else Replicate()),
        "head": ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(), output_layouts=Shard(-1), use_local_output=False),
    }
    if sp:
        top["norm"] = SequenceParallel()
    return layer, top


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
    Stage = _stage_module_class()
    mods = []
    for k in mine:
        ids = list(range(starts[k], starts[k] + split[k]))
        mods.append(Stage(p, ids, k == 0, k == n_stages - 1, plan.seq_len))
    sp = plan.sequence_parallel and plan.tp > 1
    for mod in mods:
        if plan.tp > 1:
            layer_plan, top_plan = _tp_plan(sp)
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


def torch_plan(plan: TrainingPlan) -> TrainingPlan:
    """The meshplan plan a torch run of ``plan`` is compared with: on torch's eager stack
    (``kernels = "eager"``: its cross-entropy, FSDP2 for ZeRO-3). torch's ZeRO-2 — FSDP2 with
    ``reshard_after_forward=False``, FSDP1's ``SHARD_GRAD_OP`` — shards weights at rest and keeps
    them gathered from each unit's forward to its backward: meshplan's ZeRO-3 with weights kept
    gathered. (meshplan's ZeRO-2, whole weights at rest as in DeepSpeed and Megatron, has no
    torch-native form.)"""
    update: dict = {"kernels": "eager"}
    if plan.dp > 1 and plan.zero == 2:
        update |= {"zero": 3, "reshard_after_forward": False}
    return plan.replace(**update)


def dp_mesh(mesh, plan: TrainingPlan):
    """The device mesh FSDP2 shards over: the dp axis, or (replicate, shard) for HSDP."""
    return mesh["dp_rep", "dp_shard"] if hsdp(plan) else mesh["dp"]


def hsdp(plan: TrainingPlan) -> bool:
    return plan.dp_shard is not None and plan.dp_shard < plan.dp


def shard_units(mod, plan: TrainingPlan, mesh) -> None:
    """FSDP2 units as torchtitan lays them out: the embedding, every decoder layer, the final norm
    with the LM head (kept gathered after forward: it is the first to run backward), and the root;
    with ``fsdp_head_in_root`` as it did until pytorch/torchtitan#1094: every decoder layer (the
    last kept gathered after forward) and the root, holding the embedding, final norm and LM head.
    Weights are resharded after forward for ZeRO-3 unless the plan keeps them gathered, never for
    torch's ZeRO-2 (:func:`torch_plan`)."""
    from torch.distributed.fsdp import fully_shard

    raf = torch_plan(plan).stack.reshard_after_forward
    if plan.stack.fsdp_head_in_root:  # torchtitan's units until pytorch/torchtitan#1094: blocks and the root
        layers = list(mod.layers.values())
        for i, layer in enumerate(layers):
            fully_shard(layer, mesh=mesh, reshard_after_forward=raf and i < len(layers) - 1)
        # the root left to FSDP2's own choice: kept gathered after forward (torch's FSDP2 of 2024 did
        # so whatever it was given; later builds when reshard_after_forward is not given)
        fully_shard(mod, mesh=mesh)
        return
    if mod.embed is not None:
        fully_shard(mod.embed, mesh=mesh, reshard_after_forward=raf)
    for layer in mod.layers.values():
        fully_shard(layer, mesh=mesh, reshard_after_forward=raf)
    if mod.head is not None:
        fully_shard([mod.norm, mod.head], mesh=mesh, reshard_after_forward=False)
    fully_shard(mod, mesh=mesh, reshard_after_forward=raf)


def make_optimizer(params: list, plan: TrainingPlan, mesh):
    """AdamW (fp32, single-tensor), or for ZeRO-1 torch's ``ZeroRedundancyOptimizer`` over the dp
    group: each rank keeps the AdamW state of whole parameter tensors assigned to it (largest first,
    to the rank with the fewest elements so far) and broadcasts them after its step, one bucket per
    rank."""
    import torch

    if plan.dp > 1 and plan.zero == 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, process_group=mesh["dp"].get_group(),
                                       parameters_as_bucket_view=True, lr=1e-4, foreach=False)
    return torch.optim.AdamW(params, lr=1e-4, foreach=False)


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
            self.sched = cls(stages if multi else stages[0], n_microbatches=plan.grad_accum, loss_fn=_loss)

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
                        _loss(mod(x), x).backward()
            if counter is not None:
                counter.phase_override = "optimizer"
            self.opt.step()
            self.opt.zero_grad(set_to_none=False)
            if counter is not None:
                counter.phase_override = None


def _loss(logits, target):
    import torch.nn.functional as F

    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def _mesh(plan: TrainingPlan, device: str = "cpu"):
    """The device mesh of the plan's tp, pp and dp axes (dp split into (dp_rep, dp_shard) for HSDP),
    outermost first in meshplan's rank order, over ``device``'s ranks."""
    from torch.distributed.device_mesh import init_device_mesh

    sizes = {"tp": plan.tp, "pp": plan.pp, "dp": plan.dp}
    names = [a for a in reversed(plan.rank_order) if a in sizes]  # outermost first
    if hsdp(plan):  # shard groups are contiguous inside dp, replicas every dp_shard-th rank
        i = names.index("dp")
        names[i:i + 1] = ["dp_rep", "dp_shard"]
        sizes |= {"dp_rep": plan.dp // plan.dp_shard, "dp_shard": plan.dp_shard}
    return init_device_mesh(device, tuple(sizes[a] for a in names), mesh_dim_names=tuple(names))


def run_rank(model: ModelSpec, plan: TrainingPlan, device: str = "cpu") -> dict[str, Any]:
    """Inside an initialised process group (gloo on CPU, NCCL on CUDA): warm-up steps, counted
    step; this rank's records."""
    import torch.distributed as dist

    mesh = _mesh(plan, device)
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


# ---- the launcher -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_job(model: ModelSpec, plan: TrainingPlan, device: str, task: str) -> dict[str, Any]:
    """One job on this rank: ``comm`` (the counted step, or the ring attention for cp),
    ``memory`` (:func:`meshplan.verify.memory.run_rank`) or ``ring-memory`` (torch's ring
    attention backward, its buffers measured: :func:`meshplan.verify.ring.torch_ring_backward_rank`)."""
    if task == "memory":
        from meshplan.verify import memory

        return memory.run_rank(model, plan, device)
    if task == "ring-memory":
        from meshplan.verify import ring

        return ring.torch_ring_backward_rank(model, plan)
    if plan.cp > 1:
        from meshplan.verify import ring

        return {**ring.run_rank(model, plan, make_counter, device), "device": device}
    return {**run_rank(model, plan, device), "device": device}


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
            from meshplan.verify.memory import check_plan as check_memory_plan

            check_memory_plan(m, p)
        elif task_i == "ring-memory":
            from meshplan.verify.ring import check_ring_memory_plan

            check_ring_memory_plan(m, p)
        else:
            check_plan(m, p)
    device_mod.check(device, world)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    payload = [(m.model_dump(), p.model_dump(), t) for (m, p), t in zip(jobs, tasks)]
    port = _free_port()
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
