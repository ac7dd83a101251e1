"""How ``verify`` lays a model out with torch's own APIs, what ``verify comm`` and ``verify memory``
share: the stage module holding the Hugging Face model's own parts, torchtitan's tensor-parallel
plan, FSDP2's units, the optimizer (ZeroRedundancyOptimizer for ZeRO-1), the loss, the device mesh
of the plan's axes, and the meshplan plan a torch run is compared with (:func:`torch_plan`).

torch is imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

from meshplan.errors import InputError
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan


def check_tp_divisible(model: ModelSpec, plan: TrainingPlan) -> None:
    """torch's TP plan splits heads, K/V heads, the MLP, the vocabulary and (with SP) the sequence
    evenly over tp ranks."""
    if plan.tp > 1:
        for name, value in (("n_heads", model.n_heads), ("n_kv_heads", model.n_kv_heads), ("ffn_hidden", model.ffn_hidden),
                            ("vocab_size", model.vocab_size), ("seq_len", plan.seq_len)):
            if value % plan.tp:
                raise InputError(name, f"must be a multiple of tp ({plan.tp}) for torch's tensor parallel plan (got {value})")


def stage_module_class():
    """The ``Stage`` module class (torch imported on the first call): a pipeline stage, or the whole
    model, built from the Hugging Face model's own parts."""
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


def tp_plan(sp: bool):
    """torchtitan's tensor-parallel plan for Llama, as (per decoder layer, for the stage's embedding,
    norm and head); with sequence parallelism (``sp``) the norms run sequence-sharded."""
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


def lm_loss(logits, target):
    """Cross-entropy of next-token logits (b, s, V) against the targets (b, s)."""
    import torch.nn.functional as F

    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def plan_mesh(plan: TrainingPlan, device: str = "cpu"):
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
