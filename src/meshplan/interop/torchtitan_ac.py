"""torchtitan's activation checkpointing (``[activation_checkpoint]``), both ways.

* recompute → ``mode`` none / full, op → selective with ``selective_ac_option = "op"`` (Megatron's
  attention-core selective has no equivalent: exported as op, warned);
* full with recompute_layers N → torchtitan 0.2's layer-level SAC, ``mode = "selective"`` with
  ``selective_ac_option = "k"``: ``_apply_layer_sac`` checkpoints every k-th block of a rank (its
  counter runs over the rank's blocks), ⌊n/k⌋ of a stage of n, written where one k gives min(N, n)
  on every stage (:func:`layer_sac_every`); torchtitan 0.3 has only ``FullAC`` and per-op
  ``SelectiveAC`` (``torchtitan/distributed/activation_checkpoint.py``): full, warned.
* read: ``selective_ac_option = "k"`` as N = ⌊n/k⌋ of the largest stage (noted where the stages
  differ or a rank holds several); ``memory_budget`` as op-level selective (noted).
"""

from __future__ import annotations

from typing import Any, Optional

from meshplan.interop.common import Ledger, as_int, choice, effective_split
from meshplan.pipeline.stages import default_layer_split
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan


def activation_checkpoint_section(model: ModelSpec, p: TrainingPlan, led: Ledger, version: str) -> dict[str, Any]:
    """The ``[activation_checkpoint]`` of plan ``p`` for torchtitan ``version`` ("0.2" or "0.3")."""
    ac: dict[str, Any] = {"mode": {"none": "none", "full": "full"}.get(p.recompute, "selective")}
    if p.recompute == "full" and p.recompute_layers is not None:
        every = layer_sac_every(effective_split(model, p), p.recompute_layers) if p.vpp == 1 else None
        if version == "0.2" and every is not None and every > 1:
            ac = {"mode": "selective", "selective_ac_option": str(every)}
        elif every != 1:
            led.lose("recompute_layers", f"torchtitan {version} cannot recompute {p.recompute_layers} layers of each stage "
                                         + ("(0.3 has no layer-level checkpointing)" if version != "0.2" else
                                            "(its layer SAC checkpoints every k-th block of a rank, ⌊n/k⌋ of n)")
                                         + "; exported as full recompute of every layer")
    if p.recompute in ("op", "selective"):
        ac["selective_ac_option"] = "op"
        if p.recompute == "selective":
            led.lose("recompute", "torchtitan cannot recompute only the attention core (Megatron's selective); exported as "
                                  "op-level selective AC, which recomputes more")
    return ac


def layer_sac_every(split: tuple[int, ...], recompute_layers: int) -> Optional[int]:
    """The k of torchtitan 0.2's layer-level checkpointing (``selective_ac_option = "k"``: every k-th
    block of a rank, ⌊n/k⌋ of its n) that recomputes min(N, n) layers on every stage of ``split``,
    one stage per rank; None where no k does."""
    if recompute_layers < 1:
        return None
    for every in range(1, max(split) + 1):
        if all(n // every == min(recompute_layers, n) for n in split):
            return every
    return None


def read_activation_checkpoint(ac: dict[str, Any], f: dict[str, Any], model: Optional[ModelSpec], pp: int,
                               notes: list[str]) -> None:
    """``recompute`` (and ``recompute_layers``) of the plan fields ``f`` from the section ``ac``."""
    mode = str(ac.get("mode", "selective"))
    option = str(ac.get("selective_ac_option", "2"))
    rec = choice("activation_checkpoint.mode", mode, {"none": "none", "full": "full", "selective": "selective", "memory_budget": "op"})
    if rec == "selective":
        if option == "op":
            rec = "op"
        else:
            every = as_int("activation_checkpoint.selective_ac_option", option)
            rec = "full"
            if every > 1:
                _layer_sac(f, model, pp, every, notes)
    elif mode == "memory_budget":
        notes.append("recompute: memory_budget AC read as op-level selective")
    f["recompute"] = rec


def _layer_sac(f: dict[str, Any], model: Optional[ModelSpec], pp: int, every: int, notes: list[str]) -> None:
    """``recompute_layers`` of torchtitan 0.2's layer SAC, every ``every``-th block of a rank: ⌊n/k⌋ of
    a stage of n layers (its counter spans a rank's stages: with several per rank the count is
    read per stage), or full recompute of every layer where the model's layers are unknown."""
    if model is None:
        notes.append(f"recompute: torchtitan checkpoints every {every}th layer, which needs the model's layer count "
                     "(no known model.flavor); read as every layer (full)")
        return
    split = tuple(f.get("layer_split") or default_layer_split(model.n_layers, pp * f.get("vpp", 1)))
    f["recompute_layers"] = max(split) // every
    if len({n // every for n in split}) > 1 or f.get("vpp", 1) > 1:
        notes.append(f"recompute_layers: torchtitan checkpoints every {every}th block of a rank; read as the first "
                     f"{f['recompute_layers']} layers of each virtual stage (of {', '.join(map(str, split))})")
