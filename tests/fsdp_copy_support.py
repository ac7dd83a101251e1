"""A worker for ``tests/test_fsdp_copies.py``: FSDP2 with torchtitan's mixed precision (bf16
parameters, fp32 reduction) on two gloo CPU ranks, its copy ops counted by ``meshplan verify
comm``'s dispatch mode."""

from __future__ import annotations

import os

#: two bias-free linears (64 → 128 → 64): units of 8,192 parameters each
WIDTHS = (64, 128, 64)


def copy_records(rank: int, world: int, port: int, out) -> None:
    """One warm-up step, one counted step; put this rank's copy records (kind, phase, bytes) on ``out``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from meshplan.verify.comm import COPY_KIND, make_counter

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(0)
        mod = torch.nn.Sequential(*(torch.nn.Linear(a, b, bias=False) for a, b in zip(WIDTHS, WIDTHS[1:])))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in mod:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(mod, mesh=mesh, mp_policy=policy)
        x = torch.randn(4, WIDTHS[0])
        mod(x).sum().backward()
        counter = make_counter({})
        with counter:
            mod(x).sum().backward()
        out.put([(r["kind"], r["phase"], r["bytes"]) for r in counter.records if r["op"] in COPY_KIND])
    finally:
        dist.destroy_process_group()
