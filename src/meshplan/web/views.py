"""The pages: Plan, Search, Pipeline, Calculators and Learn, rendered from Jinja2 templates; their scripts
draw what the JSON API returns with Plotly.js, which is served from the installed ``plotly``
wheel. Every page keeps its whole state in the URL's query string."""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from meshplan.accuracy.run_presets import supported_runs
from meshplan.catalog import gpu_names, model_names, stack_names
from meshplan.cli.options import PLAN_OPTIONS
from meshplan.cli.pipeline_cmd import schedule_names
from meshplan.cli.pipeline_runtime import RUNTIME_HELP
from meshplan.learn import TOPICS
from meshplan.pipeline.simulate import RUNTIMES
from meshplan.presets import PRESETS
from meshplan.search.run import OBJECTIVES
from meshplan.specs.plan import FP8_SCALINGS
from meshplan.specs.rules import REASONS
from meshplan.web.calc_api import calculators

HERE = Path(str(resources.files("meshplan.web")))
templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.filters["log2"] = lambda x: int(round(math.log2(x)))

VIEWS = (("plan", "Plan"), ("search", "Search"), ("pipeline", "Pipeline"), ("calc", "Calculators"), ("learn", "Learn"))

#: Numeric plan inputs: (option name, label, slider scale, slider min, slider max, step). The
#: slider of a "log2" input moves in powers of two; its number box takes any value.
NUMBERS = (
    ("gpus", "GPUs", "log2", 1, 65536, 1),
    ("tp", "TP (tensor parallel)", "log2", 1, 64, 1),
    ("cp", "CP (context parallel)", "log2", 1, 64, 1),
    ("pp", "PP (pipeline ranks)", "log2", 1, 128, 1),
    ("dp", "DP (data parallel)", "log2", 1, 65536, 1),
    ("ep", "EP (expert parallel)", "log2", 1, 256, 1),
    ("vpp", "virtual stages per rank", "lin", 1, 16, 1),
    ("micro_batch", "micro-batch (sequences)", "log2", 1, 64, 1),
    ("global_batch", "global batch (sequences)", "log2", 1, 65536, 1),
    ("seq_len", "sequence length (tokens)", "log2", 128, 1048576, 1),
    ("gpus_per_node", "GPUs per node", "log2", 1, 128, 1),
    ("nic_gbps", "NIC GB/s per GPU", "lin", 5, 200, 5),
    ("pod_size", "pod size (GPUs)", "log2", 8, 65536, 1),
    ("oversubscription", "oversubscription above pods", "lin", 1, 16, 0.5),
    ("price", "$ per GPU-hour", "lin", 0, 10, 0.1),
    ("pue", "PUE", "lin", 1, 2, 0.01),
)
#: Choice inputs: (option name, label, choices).
CHOICES = (
    ("stack", "software stack", tuple(stack_names())),
    ("schedule", "pipeline schedule", tuple(schedule_names())),
    ("pipeline_runtime", "pipeline runtime", RUNTIMES),
    ("recompute", "recompute", ("none", "selective", "op", "full")),
    ("zero", "ZeRO stage", ("0", "1", "2", "3")),
    ("precision", "precision", ("bf16", "fp16", "fp8", "fp32")),
    ("fp8_scaling", "FP8 scaling (with fp8)", FP8_SCALINGS),
    ("sequence_parallel", "sequence parallel", ("true", "false")),
    ("grad_dtype", "gradient dtype", ("fp32", "bf16", "fp16")),
    ("master_weights", "fp32 master weights", ("true", "false")),
    ("attention", "attention kernel", ("flash", "materialized")),
    ("attention_kernel", "flash kernel (auto: cuDNN on fused + Hopper)", ("auto", "flash2", "cudnn")),
    ("kernels", "kernels (stack field)", ("fused", "compiled", "eager")),
    ("compile_loss", "loss compiled (with compiled kernels)", ("true", "false")),
    ("fsdp_fp8_all_gather", "FP8 all-gather (FSDP2, torchao Float8)", ("false", "true")),
    ("fp8_linears", "FP8 library (with fp8)", ("auto", "torchao", "transformer-engine")),
    ("tp_comm_overlap", "TP communication overlap", ("false", "true")),
    ("tp_overlap_kind", "TP overlap kind", ("userbuffers", "micro-pipeline")),
)
#: The Plan view's inputs in groups: (key, title, open at first, option names). The first group
#: is open; the others open when one of their options is in the URL or shows an error.
GROUPS = (
    ("basic", "Model, GPUs and layout", True,
     ("preset", "model", "gpu", "gpus", "tp", "cp", "pp", "dp", "ep", "micro_batch", "global_batch", "seq_len")),
    ("schedule", "Pipeline schedule", False, ("schedule", "vpp", "pipeline_runtime")),
    ("memory", "Memory and precision", False, ("recompute", "zero", "sequence_parallel", "precision", "fp8_scaling", "grad_dtype",
                                                "master_weights")),
    ("stack", "Software stack", False, ("stack", "kernels", "compile_loss", "attention", "attention_kernel", "fp8_linears",
                                        "fsdp_fp8_all_gather", "tp_comm_overlap", "tp_overlap_kind")),
    ("network", "Cluster network", False, ("gpus_per_node", "nic_gbps", "pod_size", "oversubscription")),
    ("run", "Training run and cost", False, ("tokens", "price", "pue")),
)


def plan_groups() -> list[tuple[str, str, bool, list[dict[str, Any]]]]:
    """:data:`GROUPS` with each input described for the template: its ``kind`` (preset, model,
    gpu, num, text, choice), label, help and, for a number, its slider."""
    spec: dict[str, dict[str, Any]] = {
        "preset": {"kind": "preset"}, "model": {"kind": "model", "label": "model"}, "gpu": {"kind": "gpu", "label": "GPU"},
        "tokens": {"kind": "text", "label": "tokens to train on", "placeholder": "e.g. 15.6T"},
    }
    for n, label, scale, lo, hi, step in NUMBERS:
        spec[n] = {"kind": "num", "label": label, "scale": scale, "lo": lo, "hi": hi, "step": step}
    for n, label, opts in CHOICES:
        spec[n] = {"kind": "choice", "label": label, "options": opts}
    grouped = [name for *_, names in GROUPS for name in names]
    assert sorted(grouped) == sorted(spec), "every Plan input in one group"
    return [(key, title, is_open, [{"name": n, "help": _help(n), **spec[n]} for n in names]) for key, title, is_open, names in GROUPS]


def _help(name: str) -> str:
    if name not in PLAN_OPTIONS:  # a stack field: its line of the Stack docstring
        return f"The stack's {name} (meshplan.specs.stack.Stack); set here, it overrides the profile."
    return PLAN_OPTIONS[name][1].help or ""


def _context(request: Request, view: str, **extra: Any) -> dict[str, Any]:
    return {
        "request": request, "view": view, "views": VIEWS,
        "presets": [(p.name, p.description) for p in PRESETS.values()],
        "run_presets": supported_runs(),
        "models": model_names(), "gpus": gpu_names(), "schedules": schedule_names(),
        "objectives": OBJECTIVES, "stacks": stack_names(), **extra,
    }


def install(app: FastAPI) -> None:
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")

    @app.get("/vendor/plotly.min.js", include_in_schema=False)
    def plotly_js() -> Response:
        import plotly

        path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
        return FileResponse(path, media_type="application/javascript", headers={"Cache-Control": "max-age=86400"})

    @app.get("/", include_in_schema=False)
    def home() -> RedirectResponse:
        return RedirectResponse("/plan")

    @app.get("/plan", response_class=HTMLResponse, include_in_schema=False)
    def plan_page(request: Request):
        return templates.TemplateResponse(request, "plan.html", _context(request, "plan", groups=plan_groups()))

    @app.get("/search", response_class=HTMLResponse, include_in_schema=False)
    def search_page(request: Request):
        return templates.TemplateResponse(request, "search.html", _context(request, "search", reasons=REASONS))

    @app.get("/pipeline", response_class=HTMLResponse, include_in_schema=False)
    def pipeline_page(request: Request):
        return templates.TemplateResponse(request, "pipeline.html", _context(request, "pipeline", runtime_help=RUNTIME_HELP, runtimes=RUNTIMES))

    @app.get("/calc", response_class=HTMLResponse, include_in_schema=False)
    def calc_page(request: Request):
        return templates.TemplateResponse(request, "calc.html", _context(request, "calc", calculators=calculators()))

    @app.get("/learn", response_class=HTMLResponse, include_in_schema=False)
    def learn_page(request: Request):
        return templates.TemplateResponse(request, "learn.html", _context(request, "learn", topics=TOPICS))
