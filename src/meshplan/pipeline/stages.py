"""How the L layers are split over the p·v virtual stages of a pipeline.

Virtual stage ``k`` (0 ≤ k < p·v, in pipeline order) lives on pipeline rank ``k mod p``: with
interleaving (v > 1) rank r holds stages r, r + p, r + 2p, ... (Narayanan et al. 2021, Sec. 2.2).
V-shaped schedules (ZBV) fold the pipeline instead: rank r holds stages r and 2p − 1 − r, so
rank 0 holds both the first and the last stage.
The first virtual stage also holds the embedding, the last one the final norm and LM head.

Default split: every virtual stage gets ⌊L/S⌋ layers (S = p·v) and the L mod S remaining layers
go to the inner stages 1, 2, ... — so when layers do not divide evenly the first and last stages,
which also carry the embedding and the LM head, get one layer fewer. For Llama 3 405B on
p = 16 this gives 7, 8 × 14, 7: the split Llama 3 used ("one layer fewer on the first and last
stages", Llama 3 paper Sec. 3.3.2).
"""

from __future__ import annotations

from meshplan.errors import InputError


def default_layer_split(n_layers: int, n_stages: int) -> tuple[int, ...]:
    """⌊L/S⌋ layers each, the remainder to the inner stages first (see module docstring)."""
    if n_stages > n_layers:
        raise InputError("pp", f"pp x vpp ({n_stages}) must not exceed the number of layers ({n_layers})")
    base, extra = divmod(n_layers, n_stages)
    split = [base] * n_stages
    # inner stages 1..S-2 first, then the last, then the first
    order = list(range(1, n_stages - 1)) + [n_stages - 1, 0] if n_stages > 1 else [0]
    for k in order[:extra]:
        split[k] += 1
    return tuple(split)


def layer_split(n_layers: int, pp: int, vpp: int, given: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Layers per virtual stage: ``given`` when the user set one (checked), else the default."""
    n_stages = pp * vpp
    if given is None:
        return default_layer_split(n_layers, n_stages)
    if len(given) != n_stages:
        raise InputError("layer_split", f"needs pp x vpp = {n_stages} entries, got {len(given)}")
    if sum(given) != n_layers:
        raise InputError("layer_split", f"entries must add up to the {n_layers} layers, got {sum(given)}")
    return tuple(given)


def rank_of(virtual_stage: int, pp: int, style: str = "loop") -> int:
    """Pipeline rank that runs ``virtual_stage``: k mod p ("loop"), or for the V-shaped
    schedules k for k < p and 2p − 1 − k after ("v")."""
    if style == "v":
        return virtual_stage if virtual_stage < pp else 2 * pp - 1 - virtual_stage
    return virtual_stage % pp


def stages_of_rank(rank: int, pp: int, vpp: int, style: str = "loop") -> tuple[int, ...]:
    """Virtual stages held by ``rank``: r, r + p, ..., r + (v − 1)·p ("loop"), or for the V-shaped
    schedules (two chunks) r and 2p − 1 − r ("v")."""
    if style == "v":
        return (rank, 2 * pp - 1 - rank)
    return tuple(rank + j * pp for j in range(vpp))
