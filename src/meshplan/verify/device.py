"""Where ``meshplan verify`` runs: CPU (the default) or CUDA GPUs, and the process-group backend.

One choice threads through every measurement, so that the same functions run on either device:

=========  ==============================  ===========  ==================================================
device     tensors                         backend      ranks
=========  ==============================  ===========  ==================================================
``cpu``    CPU (fake under FakeTensorMode  ``gloo``     one CPU process per rank (``verify comm``), or a
           for flops and memory)                        fake process group in one process (``memory``)
``cuda``   real CUDA tensors               ``nccl``     one process per GPU, rank r on GPU r; the plan's
                                                        world size must not exceed the visible GPUs
=========  ==============================  ===========  ==================================================

:func:`check` refuses ``cuda`` with one line naming ``--device`` when torch sees no CUDA device or
fewer GPUs than the plan has ranks; :func:`bind` puts a worker on its GPU before the process group
starts.
"""

from __future__ import annotations

from typing import Any

from meshplan.errors import InputError

DEVICES = ("cpu", "cuda")
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}


def backend(device: str) -> str:
    """The ``torch.distributed`` backend of ``device``: gloo on CPU, NCCL on CUDA."""
    check_name(device)
    return BACKENDS[device]


def check_name(device: str) -> None:
    if device not in DEVICES:
        raise InputError("device", f"--device must be one of {', '.join(DEVICES)} (got {device!r})")


def check(device: str, world: int) -> None:
    """Refuse ``device`` when it cannot run ``world`` ranks: CUDA needs torch to see a GPU, and one
    GPU per rank (``world`` ≤ ``torch.cuda.device_count()``)."""
    check_name(device)
    if device == "cpu":
        return
    count = gpus_visible()
    if count == 0:
        raise InputError("device", "--device cuda needs a CUDA GPU visible to torch (torch.cuda.is_available() is False); "
                                   "run with --device cpu")
    if world > count:
        raise InputError("device", f"--device cuda runs one process per GPU: the plan has {world} ranks but "
                                   f"{count} GPU{'s are' if count != 1 else ' is'} visible (world size <= GPUs)")


def gpus_visible() -> int:
    """CUDA GPUs torch can use here (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def bind(device: str, rank: int) -> Any:
    """The ``torch.device`` rank ``rank`` computes on; on CUDA, GPU ``rank`` made current (before
    the NCCL process group starts, so that its communicator uses that GPU)."""
    import torch

    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    return here(device)


def here(device: str) -> Any:
    """The ``torch.device`` this process computes on: the current GPU on CUDA, else the CPU."""
    import torch

    check_name(device)
    if device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
