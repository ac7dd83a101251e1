"""What ``verify memory`` measures: torch's MemTracker / FSDPMemTracker over two optimizer steps of
the plan's layout, on fake ranks in this process (:func:`measure_fake`) or on real tensors, one
process per rank (:func:`run_rank`, started by :func:`meshplan.verify.launch.launch`); and the plans
it can run (:func:`check_plan`). The method and the comparison with meshplan's figures:
:mod:`meshplan.verify.memory`.
"""

from __future__ import annotations

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


def check_plan(model: ModelSpec, plan: TrainingPlan) -> None:
    """What verify memory can lay out and track; each refusal names the field."""
    from meshplan.verify.build import model_type

    if model_type(model) not in ("llama", "qwen2"):
        raise InputError("model", "verify memory names the eager kernels' saved tensors for Llama-style models (llama, qwen2) only")
    if model.dropout:
        raise InputError("model", "verify memory runs models without dropout")
    if model.tied_embeddings and plan.dp > 1 and plan.zero >= 2:
        raise InputError("model", "tied embeddings would share one weight between the embedding and LM-head FSDP units: verify runs untied models under --zero 2 or 3")
    for name, value in (("pp", plan.pp), ("cp", plan.cp), ("ep", plan.ep)):
        if value > 1:
            raise InputError(name, "verify memory runs one pipeline stage: tp and dp ranks only (pp = cp = ep = 1)")
    if plan.tp > 1 and plan.dp > 1 and plan.zero < 2:
        raise InputError("zero", "verify memory runs tp with dp as FSDP2 over TP (torchtitan's 2-D layout): give --zero 2 or 3")
    check_tp_divisible(model, plan)
    if plan.dp > 1 and plan.zero == 0:
        raise InputError("zero", "verify memory runs ZeRO-1 (ZeroRedundancyOptimizer), ZeRO-2 or ZeRO-3 (FSDP2) for dp > 1: give --zero 1, 2 or 3")
    if hsdp(plan) and plan.zero < 2:
        raise InputError("dp_shard", "verify memory runs HSDP as FSDP2 on a (replicate, shard) mesh: give --zero 2 or 3")
    if plan.stack.fsdp_accumulate_unsharded:
        raise InputError("fsdp_accumulate_unsharded", "not run by verify memory")
    if plan.precision.precision != "fp32" or plan.precision.grad_dtype != "fp32":
        raise InputError("precision", "verify memory runs meshplan's fp32 recipe (4 + 4 + 8 bytes per parameter): give --precision fp32")
    if plan.recompute not in ("none", "full"):
        raise InputError("recompute", "verify memory runs without recompute or with full recompute (torch's checkpoint_wrapper on every layer)")
    if plan.attention != "flash":
        raise InputError("attention", "verify memory runs torch's SDPA (flash) kernel: --attention flash")
    if plan.grad_accum != 1:
        raise InputError("global_batch", f"verify memory runs one micro-batch per step: give --global-batch {plan.micro_batch * plan.dp}")


def _fake_pg(world: int):
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())


def _by_name(snap) -> dict[str, int]:
    return {(k.value if hasattr(k, "value") else str(k)): int(v) for k, v in snap.items()}


def measure_fake(model: ModelSpec, plan: TrainingPlan) -> dict[str, Any]:
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode

    world = plan.tp * plan.dp
    mesh = None
    if world > 1:
        _fake_pg(world)
        mesh = plan_mesh(plan)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            return _track(model, plan, mesh, "cpu", fake=True)
    finally:
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def run_rank(model: ModelSpec, plan: TrainingPlan, device: str) -> dict[str, Any]:
    """Inside an initialised process group of tp·dp ranks (NCCL on CUDA, gloo on CPU), real
    tensors: this rank's tracker figures, and on CUDA its allocator's."""
    import torch.distributed as dist

    mesh = plan_mesh(plan, device) if plan.tp * plan.dp > 1 else None
    return {"rank": dist.get_rank(), **_track(model, plan, mesh, device, fake=False)}


def _on(snapshot: dict, dev) -> dict:
    """The tracker's figures for ``dev``'s device type (the first device's when it has none)."""
    for key, value in snapshot.items():
        if getattr(key, "type", str(key).split(":")[0]) == dev.type:
            return value
    return next(iter(snapshot.values()))


def _track(model: ModelSpec, plan: TrainingPlan, mesh, device: str, *, fake: bool) -> dict[str, Any]:
    """Build, lay out and train two steps under the tracker (see the module docstring); with
    ``fake`` the caller's FakeTensorMode is active. On CUDA, the allocator's peak over step 2
    (``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``) and its figure at the
    end of step 2 (``memory_allocated``)."""
    import contextlib

    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from meshplan.verify.build import build_model, parts
    from meshplan.verify.device import here

    b, s = plan.micro_batch, plan.seq_len
    fsdp = plan.dp > 1 and plan.zero >= 2
    dev = here(device)
    cuda = dev.type == "cuda"
    net = build_model(model, device=None if fake else dev)
    mod = stage_module_class()(parts(net), list(range(model.n_layers)), True, True, s)
    loss_ctx = contextlib.nullcontext
    if plan.tp > 1:
        from torch.distributed.tensor.parallel import loss_parallel, parallelize_module

        layer_plan, top_plan = tp_plan(plan.sequence_parallel)
        for layer in mod.layers.values():
            parallelize_module(layer, mesh["tp"], layer_plan)
        parallelize_module(mod, mesh["tp"], top_plan)
        loss_ctx = loss_parallel
    if plan.recompute == "full":  # torchtitan's full activation checkpointing: after TP, before FSDP
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        for name, layer in list(mod.layers.items()):
            mod.layers[name] = checkpoint_wrapper(layer, preserve_rng_state=False)
    if fsdp:
        # FSDP2 over TP joins the dp and tp meshes (DeviceMesh._concatenate), which locates this rank
        # with a data-dependent nonzero() that FakeTensorMode cannot run: the meshes are real, so the
        # layout is applied with the mode set aside (the parameters stay fake tensors).
        with unset_fake_temporarily():
            shard_units(mod, plan, dp_mesh(mesh, plan))
    opt = make_optimizer(list(mod.parameters()), plan, mesh)
    local_opt = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer steps a local AdamW
    ids = torch.randint(0, model.vocab_size, (b, s), device=None if fake else dev)
    if fsdp:
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        tracker = FSDPMemTracker(mod, opt)
        tracker.track_inputs((ids,))
    else:
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = MemTracker()
        tracker.track_external(mod, local_opt)
    allocator: dict[str, int] = {}
    with tracker:
        for i in range(2):
            with loss_ctx():
                lm_loss(mod(ids), ids).backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            if i == 0:
                tracker.reset_mod_stats()
                if cuda:
                    torch.cuda.synchronize(dev)
                    torch.cuda.reset_peak_memory_stats(dev)
        if cuda:
            torch.cuda.synchronize(dev)
            allocator = {"peak": int(torch.cuda.max_memory_allocated(dev)), "end": int(torch.cuda.memory_allocated(dev))}
        state = _on(tracker.get_tracker_snapshot("current"), dev)
    peak = _on(tracker.get_tracker_snapshot("peak"), dev)
    sizes = [q.to_local().numel() if hasattr(q, "to_local") else q.numel() for q in mod.parameters()]
    out: dict[str, Any] = {"peak": _by_name(peak), "state": _by_name(state), "param_sizes": sizes,
                           "tensors": "fake" if fake else "real"}
    if cuda:
        allocator["tracked_end"] = int(out["state"].get("Total", 0))
        out["allocator"] = allocator
    return out
