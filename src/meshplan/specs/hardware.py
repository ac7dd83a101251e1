"""Hardware specs: one GPU, the network tiers that connect GPUs, and a cluster of them.

Conventions (see DESIGN.md "Units and conventions"):

* peak FLOP/s are dense (no 2:4 sparsity), per dtype; H100 SXM BF16 = 989.4e12;
* link bandwidth is per GPU, per direction (NVLink 4 on H100: 450 GB/s each way, "900 GB/s"
  being both directions added); one NDR InfiniBand NIC: 400 Gb/s = 50 GB/s;
* memory in bytes (the catalog writes GiB or GB and says which).

Symbols: ``B_up`` scale-up bandwidth per GPU per direction, ``B_out`` scale-out (NIC) bandwidth
per GPU per direction, ``α`` per-step latency of a tier, ``k`` GPUs per scale-up domain,
``o`` oversubscription of the links above a pod (o = 7 means 1:7).
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator

from meshplan.specs.base import Spec

DType = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]
DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")


class PeakFlops(Spec):
    """Dense peak FLOP/s per dtype (tensor cores where they exist). ``None``: not supported."""

    fp32: float = Field(gt=0)
    tf32: Optional[float] = Field(default=None, gt=0)
    bf16: float = Field(gt=0)
    fp16: float = Field(gt=0)
    fp8: Optional[float] = Field(default=None, gt=0)

    def get(self, dtype: str) -> Optional[float]:
        return getattr(self, dtype)


class GPUSpec(Spec):
    """One accelerator: compute, memory, and its links (values per GPU)."""

    name: str = Field(min_length=1)
    vendor: Literal["nvidia", "amd"] = "nvidia"
    generation: str = Field(min_length=1)  # keys the calibration constants (ampere, hopper, ...)
    peak_flops: PeakFlops
    hbm_bytes: float = Field(gt=0)
    hbm_bandwidth: float = Field(gt=0)  # bytes/s
    sm_count: int = Field(gt=0)  # streaming multiprocessors (NVIDIA) or compute units (AMD)
    scale_up_size: int = Field(gt=0)  # GPUs per NVLink/NVSwitch (or Infinity Fabric) domain
    scale_up_bandwidth: float = Field(gt=0)  # bytes/s per GPU per direction
    nic_bandwidth: float = Field(gt=0)  # scale-out bytes/s per GPU per direction
    tdp_watts: float = Field(gt=0)
    sources: dict[str, str] = Field(default_factory=dict)

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``; an :class:`~meshplan.errors.InputError` if unsupported."""
        from meshplan.errors import InputError

        value = self.peak_flops.get(dtype)
        if value is None:
            raise InputError("precision", f"{self.name} has no {dtype} tensor-core support")
        return value


class NetworkTier(Spec):
    """A level of the network: ``size`` GPUs reach each other at ``bandwidth`` per GPU per
    direction with per-step latency ``latency``."""

    name: str
    size: int = Field(gt=0)
    bandwidth: float = Field(gt=0)  # bytes/s per GPU per direction
    latency: float = Field(ge=0)  # seconds per algorithm step


class ClusterSpec(Spec):
    """``num_gpus`` GPUs of one type in scale-up domains of ``scale_up.size`` GPUs, joined by a
    scale-out fabric; optionally pods of ``pod_size`` GPUs with full bisection inside and
    ``oversubscription`` : 1 above them."""

    gpu: GPUSpec
    num_gpus: int = Field(gt=0, le=10_000_000)
    scale_up: NetworkTier
    scale_out: NetworkTier
    pod_size: Optional[int] = Field(default=None, gt=0)
    oversubscription: float = Field(default=1.0, ge=1.0, le=1000.0)

    @model_validator(mode="after")
    def _check(self) -> "ClusterSpec":
        k = self.scale_up.size
        if self.num_gpus > k and self.num_gpus % k:
            raise ValueError(
                f"num_gpus ({self.num_gpus}) must be a multiple of the scale-up domain size ({k})"
            )
        if self.pod_size is not None and self.pod_size % k:
            raise ValueError(f"pod_size ({self.pod_size}) must be a multiple of {k}")
        return self

    @property
    def gpus_per_node(self) -> int:
        return min(self.scale_up.size, self.num_gpus)

    @classmethod
    def of(
        cls,
        gpu: GPUSpec,
        num_gpus: int,
        *,
        gpus_per_node: Optional[int] = None,
        nic_bandwidth: Optional[float] = None,
        scale_up_latency: Optional[float] = None,
        scale_out_latency: Optional[float] = None,
        pod_size: Optional[int] = None,
        oversubscription: float = 1.0,
    ) -> "ClusterSpec":
        """A cluster of the usual HGX/DGX nodes of ``gpu`` unless told otherwise."""
        from meshplan.cost.calibration import calibration_for

        cal = calibration_for(gpu)
        k = gpus_per_node or gpu.scale_up_size
        return cls.build(
            gpu=gpu,
            num_gpus=num_gpus,
            scale_up=NetworkTier(
                name="scale-up",
                size=k,
                bandwidth=gpu.scale_up_bandwidth,
                latency=cal.scale_up_latency if scale_up_latency is None else scale_up_latency,
            ),
            scale_out=NetworkTier(
                name="scale-out",
                size=max(num_gpus, k),
                bandwidth=nic_bandwidth or gpu.nic_bandwidth,
                latency=cal.scale_out_latency if scale_out_latency is None else scale_out_latency,
            ),
            pod_size=pod_size,
            oversubscription=oversubscription,
        )
