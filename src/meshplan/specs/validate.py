"""Checks that need the model, the cluster and the plan together. Each failure is one
:class:`~meshplan.errors.InputError` naming the field and the rule."""

from __future__ import annotations

from meshplan.cost.attention import attention_rates
from meshplan.cost.calibration import calibration_for
from meshplan.errors import InputError
from meshplan.pipeline.stages import layer_split
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.specs.rules import check_rules


def check_plan(model: ModelSpec, cluster: ClusterSpec, plan: TrainingPlan) -> None:
    """Raise on the first rule the plan breaks for this model and cluster: the GPU count, the rules
    of :data:`meshplan.specs.rules.PLAN_RULES`, a user's layer split, the GPU's dtypes and
    measured attention kernels."""
    n = plan.num_gpus
    if n != cluster.num_gpus:
        raise InputError(
            "gpus",
            f"tp x cp x pp x dp = {plan.tp} x {plan.cp} x {plan.pp} x {plan.dp} = {n} must equal the GPU count ({cluster.num_gpus})",
        )
    check_rules(model, plan)
    layer_split(model.n_layers, plan.pp, plan.vpp, plan.layer_split)  # raises on a bad user split
    cluster.gpu.peak(plan.precision.compute_dtype)  # raises if the GPU lacks the dtype
    if plan.attention == "flash" and plan.stack.attention_kernel == "cudnn":
        attention_rates(calibration_for(cluster.gpu), "cudnn")  # raises where cuDNN's rates are not measured
