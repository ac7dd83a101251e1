"""``meshplan verify memory``: torch's MemTracker / FSDPMemTracker over two optimizer steps.

How it is measured: the Hugging Face model of the spec is built under ``FakeTensorMode`` (so a large
model costs no memory; fake and real CPU runs give the same figures), trained for two steps of one
micro-batch with AdamW (fp32 weights, gradients and moments: meshplan's fp32 recipe, 4 + 4 + 8
bytes per parameter), gradients kept between steps (``zero_grad(set_to_none=False)``, like
Megatron's persistent gradient buffer that meshplan models), and the tracker's statistics reset after
the first step so that optimizer state exists. Read at the peak of the second step, per category:

* one device (dp = 1): ``MemTracker`` — Parameter, Gradient, Optstate, Activation, Temp;
* FSDP2 (``--dp N --zero 3``): ``fully_shard`` per decoder layer, on the embedding, on the final norm +
  LM head and on the root, over a *fake* process group of N ranks (``init_process_group("fake")``,
  the device mesh built outside FakeTensorMode), measured by ``FSDPMemTracker`` on rank 0 — Sharded
  Param, Sharded Grad, OptState, Activation, and the transient unsharded parameters, gradients and
  communication buffers.

Compared with :func:`meshplan.estimate.estimate` for the same plan on pipeline rank 0: weights,
gradients and optimizer state exact, activations and the peak within 10 %. Named differences: Adam's
per-parameter ``step`` counters (4 bytes each, torch keeps them as tensors), the eager Hugging Face
kernels' extra saved tensors (RMSNorm's normalized copy and fp32 statistics, SiLU's output; meshplan
models Megatron's fused kernels), and the runtime reserve (CUDA context, NCCL: absent on CPU).
"""

from __future__ import annotations

from typing import Any

from meshplan.errors import InputError
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.verify.compare import ACTIVATIONS, EXACT, PEAK, Comparison, KnownDifference, Row

STEP_COUNTERS = KnownDifference(
    "adam-step-counters",
    "torch's Adam/AdamW keeps each parameter's step count as a 0-d fp32 tensor (4 bytes per parameter "
    "tensor), which meshplan's 8 bytes per parameter of moments do not include.",
)
EAGER_KERNELS = KnownDifference(
    "eager-norm-and-silu",
    "meshplan's activation list follows Megatron's fused kernels: a fused RMSNorm keeps its input and "
    "per-token statistics, the fused SwiGLU recomputes SiLU in backward. The Hugging Face eager modules "
    "also keep RMSNorm's normalized copy before the weight multiply (n·h·e) and its fp32 reciprocal RMS "
    "(4·n) for every norm, and SiLU's output (n·f·e) for the gated product: per Llama layer "
    "2·(n·h·e + 4·n) + n·f·e more, and n·h·e + 4·n for the final norm.",
)
NO_RUNTIME = KnownDifference(
    "no-runtime-reserve-on-cpu",
    "meshplan's peak includes a runtime reserve for the CUDA context, library workspaces and NCCL buffers "
    "(calibration.runtime_reserve); a CPU run has none, so it is taken off the prediction.",
)


def check_plan(model: ModelSpec, plan: TrainingPlan) -> None:
    from meshplan.verify.build import model_type

    if model_type(model) not in ("llama", "qwen2"):
        raise InputError("model", "verify memory names the eager kernels' saved tensors for Llama-style models (llama, qwen2) only")
    if model.dropout:
        raise InputError("model", "verify memory runs models without dropout")
    if model.tied_embeddings and plan.dp > 1 and plan.zero == 3:
        raise InputError("model", "tied embeddings would share one weight between the embedding and LM-head FSDP units: verify runs untied models under --zero 3")
    for name, value in (("tp", plan.tp), ("pp", plan.pp), ("cp", plan.cp)):
        if value > 1:
            raise InputError(name, "verify memory runs one device or FSDP2 over dp ranks (tp = pp = cp = 1)")
    if plan.dp > 1 and plan.zero != 3:
        raise InputError("zero", "verify memory runs FSDP2 for dp > 1: give --zero 3")
    if plan.precision.precision != "fp32" or plan.precision.grad_dtype != "fp32":
        raise InputError("precision", "verify memory runs meshplan's fp32 recipe (4 + 4 + 8 bytes per parameter): give --precision fp32")
    if plan.recompute != "none":
        raise InputError("recompute", "verify memory runs without recompute")
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


def measure(model: ModelSpec, plan: TrainingPlan) -> dict[str, Any]:
    """Peak snapshot by category (bytes, rank 0) and the number of parameter tensors."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode

    from meshplan.verify.build import build_model, parts

    b, s = plan.micro_batch, plan.seq_len
    fsdp = plan.dp > 1
    mesh = None
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh

        _fake_pg(plan.dp)
        mesh = init_device_mesh("cpu", (plan.dp,))
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            net = build_model(model, device=None)
            if fsdp:
                from torch.distributed.fsdp import fully_shard

                p = parts(net)
                fully_shard(p["embed"], mesh=mesh)
                for layer in p["layers"]:
                    fully_shard(layer, mesh=mesh)
                fully_shard([p["norm"], p["head"]], mesh=mesh, reshard_after_forward=False)
                fully_shard(net, mesh=mesh)
            opt = torch.optim.AdamW(net.parameters(), lr=1e-4, foreach=False)
            ids = torch.randint(0, model.vocab_size, (b, s))
            if fsdp:
                from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

                tracker = FSDPMemTracker(net, opt)
                tracker.track_inputs((ids,))
            else:
                from torch.distributed._tools.mem_tracker import MemTracker

                tracker = MemTracker()
                tracker.track_external(net, opt)
            with tracker:
                for i in range(2):
                    net(input_ids=ids, labels=ids).loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=False)
                    if i == 0:
                        tracker.reset_mod_stats()
            snap = next(iter(tracker.get_tracker_snapshot("peak").values()))
            n_tensors = sum(len(g["params"]) for g in opt.param_groups)
    finally:
        if fsdp and dist.is_initialized():
            dist.destroy_process_group()
    by_name = {(k.value if hasattr(k, "value") else str(k)): int(v) for k, v in snap.items()}
    return {"peak": by_name, "param_tensors": n_tensors}


def eager_extra_bytes(model: ModelSpec, plan: TrainingPlan) -> float:
    """The eager Hugging Face kernels' saved tensors beyond meshplan's fused-kernel list (see
    :data:`EAGER_KERNELS`), for the whole model on one rank (dp shards nothing of activations)."""
    n = plan.micro_batch * plan.seq_len
    e = plan.precision.activation_bytes
    per_norm = n * model.hidden * e + 4 * n
    per_layer = 2 * per_norm + (n * model.ffn_hidden * e if model.gated_mlp else 0)
    return model.n_layers * per_layer + per_norm


def compare(model: ModelSpec, plan: TrainingPlan, cluster) -> Comparison:
    """Rows for pipeline rank 0 (rank 0 of the fake group under FSDP2)."""
    from meshplan.estimate import estimate

    check_plan(model, plan)
    got = measure(model, plan)
    peak = got["peak"]
    st = estimate(model, cluster, plan).stages[0]
    fsdp = plan.dp > 1
    key = {
        "weights": "Sharded Param" if fsdp else "Parameter",
        "gradients": "Sharded Grad" if fsdp else "Gradient",
        "optimizer": "OptState" if fsdp else "Optstate",
    }
    steps = 4 * got["param_tensors"]  # not sharded: every rank steps every parameter's shard
    eager = eager_extra_bytes(model, plan)
    reserve = st.other_items.get("runtime_reserve", 0.0)
    c = Comparison("memory", f"Memory per rank at the peak of step 2 ({'FSDP2 over ' + str(plan.dp) + ' fake ranks' if fsdp else 'one device'})")
    c.setup = {
        "model": model.name, "micro_batch": plan.micro_batch, "seq_len": plan.seq_len, "dp": plan.dp,
        "zero": plan.zero, "tracker": "FSDPMemTracker" if fsdp else "MemTracker", "measured_peak_by_category": peak,
        "meshplan_other_items": dict(st.other_items), "meshplan_activation_items": dict(st.activation_items),
    }
    c.add(Row("weights", peak.get(key["weights"], 0), st.weights, EXACT, "B"))
    c.add(Row("gradients", peak.get(key["gradients"], 0), st.gradients, EXACT, "B"))
    c.add(Row("optimizer state", peak.get(key["optimizer"], 0), st.optimizer, EXACT, "B", known=steps,
              notes=(STEP_COUNTERS.name,)), STEP_COUNTERS)
    c.add(Row("activations at the peak", peak.get("Activation", 0), st.activations, ACTIVATIONS, "B", known=eager,
              notes=(EAGER_KERNELS.name,)), EAGER_KERNELS)
    total = peak.get("Total", sum(v for k, v in peak.items() if k != "Total"))
    c.add(Row("peak", total, st.total, PEAK, "B", known=steps + eager - reserve,
              notes=(STEP_COUNTERS.name, EAGER_KERNELS.name, NO_RUNTIME.name)), STEP_COUNTERS, EAGER_KERNELS, NO_RUNTIME)
    return c
