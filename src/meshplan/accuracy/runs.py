"""Published training runs as meshplan plans.

The ground truth (``catalog/data/published_runs.yaml``, a verbatim copy of the shared file) lists
large training runs with their layouts and published throughput. Each run becomes one (or, when a
row carries several measurements, several) :class:`MappedRun`: the (ModelSpec, ClusterSpec,
TrainingPlan) meshplan estimates, the published step time (printed, or derived from the source's
TFLOP/s with the source's own FLOP formula, :mod:`meshplan.accuracy.formulas`) and published peak
memory, and every assumption made where the source is silent, as text. A run meshplan cannot
express (a GPU range, no layout, no usable timing figure) is kept with ``status="unsupported"``
and a one-line reason: no run is skipped silently.

Settings a source leaves unstated take the documented default of the framework it ran on
(Megatron-LM of that era, DeepSpeed, torchtitan, Meta's stack); each is recorded in
``assumptions``. The per-source mappers live in :mod:`meshplan.accuracy.megatron` (Narayanan
2021, Korthikanti 2022, Megatron-LM README), :mod:`meshplan.accuracy.others` (BLOOM, OPT,
GPT-NeoX) and :mod:`meshplan.accuracy.meta` (Llama 3, torchtitan); :mod:`meshplan.accuracy.mapping`
picks a run's mapper and maps the whole ground truth. This module holds what they share: the
record, the ground truth and the builders.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Optional

from meshplan.catalog import read_data_file
from meshplan.errors import InputError
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan

RUNS_FILE = "published_runs.yaml"


@dataclass
class MappedRun:
    """One published measurement as a meshplan plan, or the reason it cannot be one."""

    id: str  # row id: the yaml id, or "<yaml id>@<n>gpu" when a row holds several measurements
    run_id: str  # the yaml entry's id
    group: str  # source group (narayanan21, korthikanti22, megatron_readme, llama3, ...)
    source: str  # short source name
    gpu: str  # the GPU as the run used it (meshplan catalog name, with variant notes)
    gpus: Optional[int]
    status: str = "ok"  # "ok" | "unsupported"
    reason: str = ""  # why unsupported
    model: Optional[ModelSpec] = None
    cluster: Optional[ClusterSpec] = None
    plan: Optional[TrainingPlan] = None
    published_step_s: Optional[float] = None
    formula: str = ""  # how the published step was obtained
    published_mem_gib: Optional[float] = None
    assumptions: list[str] = field(default_factory=list)

    @property
    def supported(self) -> bool:
        return self.status == "ok"


# ---- the ground truth ----------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _document() -> dict[str, Any]:
    return read_data_file(RUNS_FILE)


def published_runs() -> list[dict[str, Any]]:
    """The ``runs`` of the ground-truth file, in file order (read-only dicts: do not mutate)."""
    return list(_document()["runs"])


def published_run(run_id: str) -> dict[str, Any]:
    for r in _document()["runs"]:
        if r["id"] == run_id:
            return r
    raise KeyError(run_id)


# ---- shared builders -----------------------------------------------------------------------------


def gpt_model(
    name: str,
    layers: int,
    hidden: int,
    heads: int,
    vocab: int,
    seq_len: int,
    *,
    ffn: Optional[int] = None,
    mlp: str = "gelu",
    position: str = "learned",
    tied: bool = True,
    dropout: bool = True,
    parallel_residual: bool = False,
    source: str = "",
) -> ModelSpec:
    """A GPT-2/3-style model: MHA, LayerNorm, biases on every linear, 4h MLP unless ``ffn``."""
    if hidden % heads:
        raise InputError("model.hidden", f"{hidden} is not a multiple of {heads} heads")
    return ModelSpec.build(
        where=f"model {name}",
        name=name,
        n_layers=layers,
        hidden=hidden,
        n_heads=heads,
        n_kv_heads=heads,
        head_dim=hidden // heads,
        ffn_hidden=ffn or 4 * hidden,
        vocab_size=vocab,
        max_position=seq_len,
        mlp=mlp,
        norm="layernorm",
        position=position,
        tied_embeddings=tied,
        qkv_bias=True,
        linear_bias=True,
        parallel_residual=parallel_residual,
        dropout=dropout,
        source=source,
    )


def unsupported(raw: dict[str, Any], group: str, source: str, reason: str) -> MappedRun:
    gpus = raw.get("gpu_count")
    return MappedRun(
        id=raw["id"],
        run_id=raw["id"],
        group=group,
        source=source,
        gpu=str(raw.get("gpu")),
        gpus=gpus if isinstance(gpus, int) else None,
        status="unsupported",
        reason=reason,
    )
