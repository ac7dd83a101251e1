"""``meshplan serve``: the web explorer (FastAPI, Jinja2 templates, Plotly.js from the ``plotly``
wheel; needs the ``web`` extra: ``pip install 'meshplan[web]'``).

The JSON API mirrors the CLI with the same schemas as its ``--json`` (``/api/estimate``,
``/api/explain``, ``/api/search``, ``/api/pipeline``, ``/api/calc/<calculator>``); the pages only
draw what the API returns, so every figure on screen comes from meshplan's engine. Bad input is
answered with status 422 and one line naming the field and the rule.
"""

from meshplan.web.app import Limits, create_app

__all__ = ["Limits", "create_app"]
