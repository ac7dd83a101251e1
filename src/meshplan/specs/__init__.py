"""Frozen, validated specifications: the model, the hardware, and the training plan."""

from meshplan.specs.hardware import ClusterSpec, GPUSpec, NetworkTier
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import PrecisionRecipe, TrainingPlan

__all__ = ["ClusterSpec", "GPUSpec", "ModelSpec", "NetworkTier", "PrecisionRecipe", "TrainingPlan"]
