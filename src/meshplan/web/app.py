"""The application factory: the JSON API, the pages and their static files, the error handlers."""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator

from fastapi import FastAPI

from meshplan.accuracy.run_presets import supported_runs
from meshplan.web import calc_api, errors, learn_api, pipeline_api, plan_api, search_api, views
from meshplan.web.estimate_cache import CachedEstimates
from meshplan.web.heavy import HeavySlots
from meshplan.web.search_api import Searches


@dataclass(frozen=True)
class Limits:
    """Work one request may cause: plans a search may evaluate and seconds it may run; heavy
    requests running at once (each in a worker process), how long one waits for a slot and how
    long its work may run (:mod:`meshplan.web.heavy`)."""

    max_search_plans: int = 1_000_000
    search_seconds: float = 60.0
    heavy_slots: int = 2
    heavy_wait_s: float = 30.0
    heavy_timeout_s: float = 60.0


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The server's life: the pages' lists read before the first request (the published runs a
    preset can be, about half a second), so the first page paints at once; its heavy requests'
    worker processes start when first needed and stop with it."""
    supported_runs()
    yield
    app.state.heavy.close()


def create_app(limits: Limits = Limits()) -> FastAPI:
    app = FastAPI(
        title="meshplan",
        summary="Plan distributed training of large language models: layout, memory, step time, MFU, cost.",
        description="The JSON API of `meshplan serve`: the same engine and the same schemas as the CLI's `--json`. "
        "Bad input is answered 422 with `field`, `rule` and `detail` (one line).",
        version="1",
        docs_url=None,  # Swagger UI and ReDoc load their scripts from a CDN: only /openapi.json is served
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.limits = limits
    app.state.searches = Searches(limits.max_search_plans, limits.search_seconds)
    app.state.heavy = HeavySlots(limits.heavy_slots, limits.heavy_wait_s, limits.heavy_timeout_s)
    errors.install(app)
    for module in (plan_api, search_api, pipeline_api, calc_api, learn_api):
        app.include_router(module.router)
    views.install(app)
    app.add_middleware(CachedEstimates, cache=plan_api.estimates)  # a repeated estimate skips routing
    return app
