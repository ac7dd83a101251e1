"""The groups a run's error is summarized by, beyond its source: scale, GPU and stack.

A run (a validated row, or a plan being estimated) falls in

* a **scale bucket** by its GPU count N: ``<=128`` (N ≤ 128), ``129-512``, ``513-2048`` and
  ``>2048`` (N > 2,048) — :data:`SCALE_BUCKETS`, over which meshplan's error was seen to grow
  with N;
* a **GPU generation**: the part as the catalog names it, its name's first token upper-cased
  (``a100-sxm-80gb`` → ``A100``, ``h200-sxm-141gb`` → ``H200``). H100 and H200 share one
  calibration row (``hopper``, :mod:`meshplan.cost.calibration`) but not their memory, so they are
  kept apart here;
* a **stack** (the plan's profile, ``plan.stack.name``), and a **stack family**: the stack's
  kernels (:class:`meshplan.specs.stack.Stack` ``kernels``) — ``fused`` (Megatron-Core, NeMo,
  Megatron-DeepSpeed, nanotron: Transformer Engine / Megatron kernels), ``compiled`` (torchtitan:
  torch.compile'd blocks) or ``eager`` (Composer, DeepSpeed: PyTorch eager). A user's own stack
  falls in a family by its kernels, so every plan has one.
"""

from __future__ import annotations

#: (label, largest GPU count in the bucket; None: no bound), in increasing order
SCALE_BUCKETS: tuple[tuple[str, int | None], ...] = (
    ("<=128", 128), ("129-512", 512), ("513-2048", 2048), (">2048", None),
)


def scale_bucket(num_gpus: int) -> str:
    """The label of the bucket of :data:`SCALE_BUCKETS` holding ``num_gpus``."""
    for label, top in SCALE_BUCKETS:
        if top is None or num_gpus <= top:
            return label
    raise AssertionError("the last bucket has no bound")


def gpu_generation(gpu_name: str) -> str:
    """The GPU part of a catalog name: its first ``-`` token, upper-cased (``h100-sxm-80gb`` → H100)."""
    return gpu_name.split("-", 1)[0].upper()


def stack_family(stack) -> str:
    """The family of a :class:`~meshplan.specs.stack.Stack`: its ``kernels`` (fused, compiled, eager)."""
    return stack.kernels


def bucket_order(labels) -> list[str]:
    """``labels`` (scale buckets) in increasing GPU count."""
    order = [label for label, _ in SCALE_BUCKETS]
    return sorted(set(labels), key=order.index)


__all__ = ["SCALE_BUCKETS", "bucket_order", "gpu_generation", "scale_bucket", "stack_family"]
