"""Presets by name: the named plans of published runs (:mod:`meshplan.named_presets`) and every
published run of ``meshplan validate`` under its row id (:mod:`meshplan.accuracy.run_presets`).

A preset is data: the plan's settings, keyed by the names of ``meshplan estimate``'s options
(``seq_len`` for ``--seq-len``), and the published figures to compare the estimate with. Options
given on the command line override a preset's values.
"""

from __future__ import annotations

from meshplan.named_presets import PRESETS, Preset


def preset_names() -> list[str]:
    return list(PRESETS)


def get_preset(name: str) -> Preset:
    """The named preset, or the published run of ``meshplan validate`` whose row id is ``name``."""
    from meshplan.accuracy.run_presets import close_run_ids, run_preset
    from meshplan.errors import InputError

    key = name.strip().lower()
    if key in PRESETS:
        return PRESETS[key]
    run = run_preset(key)
    if run is not None:
        return run
    near = close_run_ids(key)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise InputError("preset", f"unknown preset '{name}' (named presets: {', '.join(PRESETS)}; or a run id that "
                               f"`meshplan validate --set all` lists{hint})")
