"""How the L layers are split over the p·v virtual stages of a pipeline.

Virtual stage ``k`` (0 ≤ k < p·v, in pipeline order) lives on pipeline rank ``k mod p``: with
interleaving (v > 1) rank r holds stages r, r + p, r + 2p, ... (Narayanan et al. 2021, Sec. 2.2).
V-shaped schedules (ZBV) fold the pipeline instead: rank r holds stages r and 2p − 1 − r, so
rank 0 holds both the first and the last stage.
The first virtual stage also holds the embedding, the last one the final norm and LM head.

Default split: every virtual stage gets ⌊L/S⌋ layers (S = p·v) and the L mod S remaining layers
go to the inner stages 1, 2, ... — so when layers do not divide evenly the first and last stages,
which also carry the embedding and the LM head, get one layer fewer. S may exceed L by up to two:
the first and last stages then hold only the embedding and only the LM head (and loss). For
Llama 3 405B (L = 126) on p = 16, v = 8 this gives 0, 1 × 126, 0, which is the split Llama 3
describes: "we reduce one Transformer layer each from the first and the last stages ... the first
model chunk on the first stage has only the embedding, and the last model chunk on the last stage
has only output projection and loss calculation" (Llama 3 paper, Sec. 3.3.2). Only with one layer
per chunk, 126 + 2 = 128 = 16 · 8, does removing one layer leave a chunk with only the embedding.
Per pipeline rank that is 7, 8 × 14, 7 layers, as with the v = 2 split (3, 4 × 30, 3).

Inner stages hold at least one layer; the first and last may hold none (:func:`check_split`).
Megatron-LM expresses such splits with ``--pipeline-model-parallel-layout`` (a stage "E" or "L"
alone) or ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``.
"""

from __future__ import annotations

from meshplan.errors import InputError


#: How many more virtual stages than layers a pipeline may have: the first and last stages can hold
#: only the embedding and only the LM head.
EMPTY_END_STAGES = 2

STAGES_RULE = "must not exceed the number of layers + 2"


def too_many_stages(n_stages: int, n_layers: int) -> InputError:
    """The error for pp·vpp > L + 2, naming ``pp``."""
    return InputError(
        "pp", f"pp x vpp ({n_stages}) {STAGES_RULE} ({n_layers + EMPTY_END_STAGES}: only the first and last stages, "
        "with the embedding and the LM head, may hold no layer)")


def default_layer_split(n_layers: int, n_stages: int) -> tuple[int, ...]:
    """⌊L/S⌋ layers each, the remainder to the inner stages first (see module docstring)."""
    if n_stages > n_layers + EMPTY_END_STAGES:
        raise too_many_stages(n_stages, n_layers)
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
    check_split(given)
    return tuple(given)


def split_problem(split: tuple[int, ...]) -> str | None:
    """What is wrong with a layer split on its own (None: nothing): negative counts, or an inner
    stage without a layer (only the first and last stages, which hold the embedding and the LM
    head, may hold none), or no layer at all."""
    if any(n < 0 for n in split):
        return "layer counts must not be negative"
    if any(n < 1 for n in split[1:-1]):
        return "every inner virtual stage needs at least one layer (only the first and last, with the embedding and the LM head, may hold none)"
    if split and sum(split) < 1:
        return "needs at least one layer"
    return None


def check_split(split: tuple[int, ...], where: str = "layer_split") -> None:
    """:func:`split_problem` as an :class:`InputError` naming ``where``."""
    problem = split_problem(tuple(split))
    if problem:
        raise InputError(where, problem)


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
