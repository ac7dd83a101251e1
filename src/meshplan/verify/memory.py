"""``meshplan verify memory``: torch's MemTracker / FSDPMemTracker over two optimizer steps.

How it is measured: the Hugging Face model of the spec is built under ``FakeTensorMode`` (so a large
model costs no memory; a real CPU run gives the same figures, but for one logits-sized temporary
more at the fake peak with TP), its own embedding, decoder
layers, final norm and LM head glued as one stage (:func:`meshplan.verify.layout.stage_module_class`),
laid out with the same torch APIs as ``verify comm``, over a *fake* process group of tp·dp ranks
(``init_process_group("fake")``, the device mesh built outside FakeTensorMode), and trained for two
steps of one micro-batch with AdamW (fp32 weights, gradients and moments: meshplan's fp32 recipe,
4 + 4 + 8 bytes per parameter), gradients kept between steps (``zero_grad(set_to_none=False)``, like
Megatron's persistent gradient buffer that meshplan models), the tracker's statistics reset after
the first step so that optimizer state exists. Rank 0 is read at the end of step 2 (weights,
gradients, optimizer state) and at its peak (activations, total):

* one device, TP (``parallelize_module``, torchtitan's plan, ``loss_parallel``; with SP too) and
  ZeRO-1 (``ZeroRedundancyOptimizer``): ``MemTracker`` — Parameter, Gradient, Optstate, Activation;
* ZeRO-3 / ZeRO-2 / HSDP: FSDP2 units (:func:`meshplan.verify.layout.shard_units`; ZeRO-2 keeps weights
  gathered from forward to backward, :func:`meshplan.verify.layout.torch_plan`; HSDP on a (replicate,
  shard) mesh), ``FSDPMemTracker`` — Sharded Param, Sharded Grad, OptState, Activation, and the
  transient unsharded parameters, gradients and communication buffers;
* FSDP2 over TP (``--tp T --dp N --zero 3``, torchtitan's 2-D layout): ``parallelize_module`` on the
  tp axis, then the same FSDP2 units on the dp axis, ``FSDPMemTracker``.

With ``device="cuda"`` the same functions run on real CUDA tensors, one process per GPU on NCCL
(:func:`meshplan.verify.memory_trackers.run_rank`), and each rank's caching allocator is read beside
the tracker:
``torch.cuda.max_memory_allocated`` over step 2 (after ``reset_peak_memory_stats``), less what the
allocator holds at the end of the step beyond the tracked tensors (:func:`allocator_peak`).

With ``recompute = "full"`` every decoder layer is wrapped in torch's ``checkpoint_wrapper`` (as
torchtitan does, after TP and before FSDP), so the run shows where a recomputed layer's working set
lands against the loss's buffers.

Compared with :func:`meshplan.estimate.estimate` for the same plan on torch's eager stack (kernels
``eager``: its norms' fp32 tensors, SiLU's output, the gathered inputs of sequence-parallel linears)
on pipeline rank 0: weights, gradients and optimizer state exact, activations live at the peak
moment and the peak within 10 %. Named differences: Adam's per-parameter ``step`` counters,
Hugging Face's grouped K/V (torchtitan repeats them), ZeroRedundancyOptimizer's whole-tensor
partition, the replicated gradient of torch's vocab-parallel embedding (not under FSDP2, which
redistributes it to the weight's row shards before reducing it), and the runtime reserve (absent on
CPU, outside the allocator on CUDA).
"""

from __future__ import annotations

from typing import Any

from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.verify.compare import ACTIVATIONS, EXACT, PEAK, Comparison, KnownDifference, Row
from meshplan.verify.launch import launch
from meshplan.verify.layout import hsdp, torch_plan
from meshplan.verify.memory_trackers import check_plan, measure_fake

STEP_COUNTERS = KnownDifference(
    "adam-step-counters",
    "torch's Adam/AdamW keeps each parameter's step count as a 0-d fp32 tensor (4 bytes per parameter "
    "tensor), which meshplan's 8 bytes per parameter of moments do not include.",
)
HF_GROUPED_KV = KnownDifference(
    "hf-sdpa-grouped-kv",
    "Hugging Face's SDPA path hands the kernel the g K/V heads with enable_gqa (transformers' use_gqa_in_sdpa: "
    "no mask, torch >= 2.5), so a layer saves K and V of g/t heads; torchtitan's repeat_kv, which meshplan's torch "
    "stacks model, saves them repeated to the a/t query heads: 2·n·(a − g)/t·d·e less per layer whose tensors are "
    "live at the peak (every layer without recompute; under full recompute the one being rebuilt, none at the "
    "head moment).",
)
WHOLE_TENSOR_PARTITION = KnownDifference(
    "zero-redundancy-whole-tensors",
    "torch's ZeroRedundancyOptimizer gives each rank whole parameter tensors (largest first, to the rank "
    "with the fewest elements so far), so a rank's optimizer state is ω times its tensors' elements, not "
    "exactly ω·P/N; the amount is that partition's (replayed from the tensor sizes) less ω·P/N.",
)
REPLICATED_EMBEDDING_GRAD = KnownDifference(
    "dtensor-embedding-grad-replicated",
    "torch's vocab-parallel embedding (RowwiseParallel on nn.Embedding) gets its weight gradient as a "
    "Replicate DTensor: every TP rank keeps the full V·h gradient where Megatron keeps its V/t rows, "
    "(t − 1)·(V/t)·h·γ more per rank.",
)
RESERVE_OUTSIDE_ALLOCATOR = KnownDifference(
    "runtime-reserve-outside-allocator",
    "meshplan's peak includes a runtime reserve for the CUDA context, library workspaces and NCCL buffers "
    "(calibration.runtime_reserve). The CUDA context and NCCL's buffers are outside torch's caching allocator and "
    "the trackers count tensors only, so the reserve is taken off the prediction; the allocator rows take off "
    "what the allocator holds at the end of the step beyond the tracked tensors (cuBLAS workspaces).",
)
NO_RUNTIME = KnownDifference(
    "no-runtime-reserve-on-cpu",
    "meshplan's peak includes a runtime reserve for the CUDA context, library workspaces and NCCL buffers "
    "(calibration.runtime_reserve); a CPU run has none, so it is taken off the prediction.",
)


def measure(model: ModelSpec, plan: TrainingPlan, device: str = "cpu") -> dict[str, Any]:
    """Rank 0's memory by category at the peak of step 2 (``peak``) and at its end (``state``: the
    persistent weights, gradients and optimizer state), and the sizes of its parameter tensors.

    On ``cpu``: fake tensors on a fake process group of tp·dp ranks, in this process. On ``cuda``:
    real tensors, one process per GPU on NCCL (:func:`meshplan.verify.launch.launch`, task
    ``memory``), each running :func:`meshplan.verify.memory_trackers.run_rank`; ``allocator`` then
    lists every rank's CUDA caching allocator figures beside its tracker's."""
    if device == "cpu":
        return measure_fake(model, plan)
    return gather(launch([(model, plan)], device=device, task="memory")[0])


def gather(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One measurement from :func:`meshplan.verify.memory_trackers.run_rank`'s results in rank order:
    rank 0's tracker figures and, on CUDA, every rank's allocator figures (``allocator``)."""
    out = dict(ranks[0])
    out.pop("allocator", None)
    if all("allocator" in r for r in ranks):
        out["allocator"] = [r["allocator"] for r in ranks]
    return out


def zero1_partition(sizes: list[int], world: int) -> list[list[int]]:
    """torch's ZeroRedundancyOptimizer partition: parameter tensors, largest first (stable for
    ties), each to the rank holding the fewest elements so far (the lowest such rank): the sizes
    every rank's optimizer steps."""
    load = [0] * world
    out: list[list[int]] = [[] for _ in range(world)]
    for n in sorted(sizes, reverse=True):
        r = load.index(min(load))
        out[r].append(n)
        load[r] += n
    return out


def grouped_kv_bytes(model: ModelSpec, plan: TrainingPlan, live_layers: int) -> float:
    """What Hugging Face's grouped K/V saves less than torchtitan's repeated K/V (:data:`HF_GROUPED_KV`)
    over ``live_layers`` layers: 2·n·(a − g)/t·d·e each, n = b·s tokens."""
    from meshplan.cost.cp_exchange import sdpa_kv_heads
    from meshplan.cost.params import kv_heads_per_rank

    n = plan.micro_batch * plan.seq_len
    extra_heads = sdpa_kv_heads(model, plan.tp, "eager") - kv_heads_per_rank(model, plan.tp)
    return live_layers * 2 * n * extra_heads * model.head_dim * plan.precision.activation_bytes


def compare(model: ModelSpec, plan: TrainingPlan, cluster, device: str = "cpu",
            measured: dict[str, Any] | None = None) -> Comparison:
    """Rows for pipeline rank 0 (rank 0 of the fake group with tp or dp > 1; on CUDA, rank 0 of the
    NCCL group, and the allocator's peak of every rank). ``measured``: a measurement already taken
    on ``device`` (:func:`gather` of the per-rank results), else :func:`measure` takes it."""
    from meshplan.cost.params import padded_vocab
    from meshplan.estimate import estimate

    check_plan(model, plan)
    got = measured if measured is not None else measure(model, plan, device)
    peak, state = got["peak"], got["state"]
    mplan = torch_plan(plan)  # torch's eager stack: its cross-entropy
    st = estimate(model, cluster, mplan, stream_pools=False).stages[0]  # allocated bytes, as the trackers count
    fsdp = plan.dp > 1 and plan.zero >= 2
    key = {
        "weights": "Sharded Param" if fsdp else "Parameter",
        "gradients": "Sharded Grad" if fsdp else "Gradient",
        "optimizer": "OptState" if fsdp else "Optstate",
    }
    owned = got["param_sizes"]
    opt_known: tuple[KnownDifference, ...] = (STEP_COUNTERS,)
    partition = 0.0
    if plan.dp > 1 and plan.zero == 1:
        owned = zero1_partition(owned, plan.dp)[0]
        partition = plan.precision.optimizer_bytes * sum(owned) - st.optimizer
        opt_known = (STEP_COUNTERS, WHOLE_TENSOR_PARTITION)
    # every tensor the rank's AdamW steps (its shard, under FSDP2); on CUDA the counters stay on the host
    steps = 4 * len(owned) if device == "cpu" else 0
    if device != "cpu":
        opt_known = tuple(k for k in opt_known if k is not STEP_COUNTERS)
    embed_grad = 0.0
    grad_known: tuple[KnownDifference, ...] = ()
    if plan.tp > 1 and not fsdp:  # FSDP2 redistributes it to the weight's Shard(0) before its reduce-scatter
        embed_grad = padded_vocab(model, plan.tp) // plan.tp * (plan.tp - 1) * model.hidden * plan.precision.grad_bytes
        grad_known = (REPLICATED_EMBEDDING_GRAD,)
    # at the head moment no layer has rebuilt its working set yet (rank_other_items: a negative
    # item, counted with the activations at the peak, meshplan.cost.compose.at_peak)
    moment = st.activation_items.get("working_set_not_yet_built", 0.0)
    # the layers whose K/V are live at the peak: all without recompute; under full recompute the
    # layer being rebuilt at the layer moment, none at the head moment
    live = model.n_layers if plan.recompute == "none" else (0 if moment else 1)
    grouped = -grouped_kv_bytes(model, plan, live)
    act_known: tuple[KnownDifference, ...] = (HF_GROUPED_KV,) if grouped else ()
    reserve = st.other_items.get("runtime_reserve", 0.0)
    ranks = {"fake": "fake ranks", "real": "GPUs (NCCL)" if device == "cuda" else "CPU processes (gloo)"}[got["tensors"]]
    dp = f"HSDP dp {plan.dp} (shard groups of {plan.dp_shard})" if hsdp(plan) else f"FSDP2 dp {plan.dp}"
    how = {True: f"{dp} over {plan.dp} {ranks}", False: "one device"}[fsdp]
    if plan.tp > 1:
        tp = f"TP{' + SP' if plan.sequence_parallel else ''}"
        how = f"{dp} x {tp} {plan.tp} over {plan.tp * plan.dp} {ranks}" if fsdp else f"{tp} over {plan.tp} {ranks}"
    elif plan.dp > 1 and plan.zero == 1:
        how = f"ZeroRedundancyOptimizer over {plan.dp} {ranks}"
    if device != "cpu" and not fsdp and plan.tp == 1 and plan.dp == 1:
        how = "one GPU"
    c = Comparison("memory", f"Memory per rank at the end and the peak of step 2 ({how})")
    c.setup = {
        "model": model.name, "micro_batch": plan.micro_batch, "seq_len": plan.seq_len, "tp": plan.tp,
        "sequence_parallel": plan.sequence_parallel and plan.tp > 1, "dp": plan.dp, "dp_shard": plan.dp_shard,
        "zero": plan.zero, "meshplan_plan": {"zero": mplan.zero, "reshard_after_forward": mplan.stack.reshard_after_forward},
        "device": device, "tensors": got["tensors"],
        "tracker": "FSDPMemTracker" if fsdp else "MemTracker", "measured_state_by_category": state,
        "measured_peak_by_category": peak, "meshplan_other_items": dict(st.other_items),
        "meshplan_activation_items": dict(st.activation_items),
    }
    c.add(Row("weights", state.get(key["weights"], 0), st.weights, EXACT, "B"))
    c.add(Row("gradients", state.get(key["gradients"], 0), st.gradients, EXACT, "B", known=embed_grad,
              notes=tuple(k.name for k in grad_known)), *grad_known)
    c.add(Row("optimizer state", state.get(key["optimizer"], 0), st.optimizer, EXACT, "B", known=steps + partition,
              notes=tuple(k.name for k in opt_known)), *opt_known)
    # the MLP backward's gradients are what the trackers call Temp: out of this row (in the peak's);
    # at a layer's end its activations, gradients included, are freed
    layer_freed = st.activation_items.get("layer_activations_freed", 0.0)
    backward_grads = 0.0 if (moment or layer_freed) else st.activation_items.get("backward_gradients", 0.0)
    # st.activations holds the moment's freed items (meshplan.cost.compose.at_peak); this row
    # takes off those of W and of the layer's end only, as it did when they were other items (the
    # LM head's freed activations stay in it; tests/test_verify_memory.py does not assert the row
    # at the layer moment)
    predicted_act = st.activations - st.activation_items.get("head_activations_freed", 0.0) - backward_grads
    c.add(Row("activations at the peak", peak.get("Activation", 0), predicted_act, ACTIVATIONS, "B", known=grouped,
              notes=tuple(k.name for k in act_known)), *act_known)
    total = peak.get("Total", sum(v for k, v in peak.items() if k != "Total"))
    notes = (*opt_known, *grad_known, *act_known, NO_RUNTIME if device == "cpu" else RESERVE_OUTSIDE_ALLOCATOR)
    known_peak = steps + partition + embed_grad + grouped - reserve
    c.add(Row("peak", total, st.total, PEAK, "B", known=known_peak, notes=tuple(k.name for k in notes)), *notes)
    if "allocator" in got:
        c.setup["allocator"] = got["allocator"]
        for r, alloc in enumerate(got["allocator"]):
            known_r = known_peak
            if plan.dp > 1 and plan.zero == 1:  # each rank steps its own whole tensors
                theirs = zero1_partition(got["param_sizes"], plan.dp)[r]
                known_r += plan.precision.optimizer_bytes * (sum(theirs) - sum(owned))
            c.add(Row(f"peak, CUDA allocator (rank {r})", allocator_peak(alloc), st.total, PEAK, "B", known=known_r,
                      notes=tuple(k.name for k in notes)), *notes)
    return c


def allocator_peak(alloc: dict[str, int]) -> int:
    """The allocator's peak over step 2 less what it holds at the end beyond the tracked tensors
    (cuBLAS workspaces, one per stream and thread, and other buffers that are no tensor of the model):
    ``max_memory_allocated − (memory_allocated − tracked)``."""
    return alloc["peak"] - (alloc["end"] - alloc["tracked_end"])
