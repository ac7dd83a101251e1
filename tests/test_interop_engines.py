"""The exported configs read by the engines' own parsers, where the engine's package is installed;
each test is skipped cleanly when it is not (none is a dependency of meshplan's tests: they pull in
GPU kernels, tokenizers or an sdist build).

Versions these tests run with (CPU, from PyPI; ``make engines``): torchtitan 0.3.0, and 0.2.2 in a
folder of its own put first on ``PYTHONPATH`` (``pip install --no-deps --target``: its
``ConfigManager`` reads both the TOML and the ``--section.key`` flags); DeepSpeed 0.19.8
(``DeepSpeedConfig``, built with ``DS_BUILD_OPS=0``); nanotron 0.2 (``nanotron.config``; nanotron
0.4 on PyPI fails to import: a circular import); Megatron-LM's ``parse_args`` and ``validate_args``
from megatron-core 0.19.2 (its wheel for CPython 3.11 ships ``megatron/training``; ``make engines``
installs it with ``--ignore-requires-python``, see :func:`megatron_arguments`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import types
from typing import Optional

import pytest
import yaml

from meshplan.catalog import load_model
from meshplan.interop import export
from meshplan.interop.common import arg_tokens, effective_split
from meshplan.interop.torchtitan import TT_MODELS
from meshplan.specs.plan import TrainingPlan

from meshplan.specs.plan import PrecisionRecipe
from meshplan.specs.rules import check_rules
from test_interop_roundtrip import GRID, MODELS, plan

LLAMA70 = load_model("llama3-70b")


def _torchtitan_manager():
    """torchtitan's ConfigManager, imported without ``torchtitan/__init__.py`` (which pulls in
    triton kernels through its quantization converters); skip when torchtitan is absent or is not
    a JobConfig release (0.1 – 0.2)."""
    if "torchtitan" not in sys.modules:
        spec = importlib.util.find_spec("torchtitan")
        if spec is None:
            pytest.skip("torchtitan is not installed")
        pkg = types.ModuleType("torchtitan")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__spec__ = spec
        sys.modules["torchtitan"] = pkg
    try:
        import torchtitan.config as tt_config
    except ImportError as exc:
        pytest.skip(f"torchtitan's config module does not import here: {exc}")
    if not hasattr(tt_config, "JobConfig"):
        pytest.skip("torchtitan 0.3+ builds configs in Python (no JobConfig / TOML)")
    return tt_config.ConfigManager


def _torchtitan_function(path: str, name: str):
    """One function of torchtitan's source, compiled alone: its module imports GPU kernels."""
    import ast

    source = (sys.modules["torchtitan"].__path__[0] + "/" + path)
    tree = ast.parse(open(source).read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    scope: dict = {}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), source, "exec"), scope)
    return scope[name]


@pytest.mark.parametrize(("model_name", "p"), GRID["torchtitan@0.2"], ids=range(len(GRID["torchtitan@0.2"])))
def test_torchtitan_config_manager_reads_flags_and_toml(model_name, p, tmp_path):
    ConfigManager = _torchtitan_manager()
    model = MODELS[model_name]
    flags = arg_tokens(export("torchtitan@0.2", model, p).text)
    toml = tmp_path / "job.toml"
    toml.write_text(export("torchtitan-toml", model, p).text)
    for args in (flags, ["--job.config_file", str(toml)]):
        c = ConfigManager().parse_args(args)
        par, tr = c.parallelism, c.training
        assert (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.context_parallel_degree) == (p.tp, p.pp, p.cp)
        assert par.data_parallel_replicate_degree * par.data_parallel_shard_degree == p.dp
        assert (tr.global_batch_size, tr.seq_len) == (p.global_batch, p.seq_len)
        assert c.model.flavor in ("8B", "70B") and c.activation_checkpoint.mode == {"op": "selective", "selective": "selective"}.get(p.recompute, p.recompute)
        assert par.enable_async_tensor_parallel == p.stack.tp_comm_overlap
        fp8 = c.quantize.linear.float8
        assert ("quantize.linear.float8" in c.model.converters) == (p.precision.precision == "fp8")
        assert fp8.recipe_name == (None if p.precision.fp8_scaling == "tensorwise" else p.precision.fp8_scaling)
        assert fp8.enable_fsdp_float8_all_gather == p.stack.fsdp_fp8_all_gather
        # torchtitan compiles the blocks when "model" is among the components, the loss when "loss" is
        # (build_cross_entropy_loss): compiled with or without the loss, or compile off (eager)
        assert c.compile.enable == (p.stack.kernels == "compiled")
        if c.compile.enable:
            assert c.compile.components == (["model", "loss"] if p.stack.compile_loss else ["model"])
        if p.pp > 1:
            assert par.pipeline_parallel_microbatch_size == p.micro_batch
            generate_llm_fqn_per_model_part = _torchtitan_function("distributed/pipeline_parallel.py", "generate_llm_fqn_per_model_part")
            n_stages = p.pp * p.vpp
            parts = generate_llm_fqn_per_model_part(n_stages, model.n_layers, par.pipeline_parallel_first_stage_less_layers,
                                                    par.pipeline_parallel_last_stage_less_layers)
            from meshplan.interop.common import effective_split

            assert tuple(sum(m.startswith("layers.") for m in part) for part in parts) == effective_split(model, p)
        else:
            assert tr.local_batch_size == p.micro_batch


def _torchtitan03():
    """torchtitan 0.3's ConfigManager (``--module``/``--config`` registry functions; importing them
    needs triton, which a CPU venv installs as a plain wheel); skip when torchtitan is absent or older."""
    try:
        from torchtitan.config import ConfigManager
    except ImportError as exc:
        pytest.skip(f"torchtitan 0.3 does not import here: {exc}")
    if not hasattr(ConfigManager, "_load_config"):
        pytest.skip("torchtitan before 0.3 (JobConfig): see test_torchtitan_config_manager_reads_flags_and_toml")
    return ConfigManager


#: the six plan kinds users export (FSDP, TP x PP, interleaved PP, MoE with EP, long-context CP, FP8)
TT03_GRID = GRID["torchtitan"] + [
    ("qwen3-30b-a3b", plan(dp=8, ep=8, zero=3, recompute="full", kernels="compiled")),  # EP over FSDP ranks
    ("deepseek-v3-671b", plan(pp=8, dp=32, ep=32, zero=3, fsdp_accumulate_unsharded=True, pp_buffers="per-micro-batch",
                              overlap_grad_reduce=False, recompute="full", kernels="compiled")),  # MoE, MLA, EP x PP
    ("llama3-70b", plan(cp=8, dp=2, zero=3, seq_len=131072, recompute="full", kernels="compiled")),
]
TT_CATALOG = {**MODELS, **{name: load_model(name) for name in ("qwen3-30b-a3b", "deepseek-v3-671b")}}
AC_CLASS = {"none": "NoneType", "full": "FullAC", "op": "SelectiveAC", "selective": "SelectiveAC"}


@pytest.mark.parametrize(("model_name", "p"), TT03_GRID, ids=range(len(TT03_GRID)))
def test_torchtitan03_config_manager_reads_the_export(model_name, p):
    ConfigManager = _torchtitan03()
    check_rules(TT_CATALOG[model_name], p)  # a plan meshplan itself accepts
    r = export("torchtitan", TT_CATALOG[model_name], p)
    assert r.warnings == (), r.warnings
    c = ConfigManager().parse_args(arg_tokens(r.text))  # tyro: any unrecognized option is an error
    par, tr = c.parallelism, c.training
    assert (c.model_spec.name, c.model_spec.flavor) == TT_MODELS[model_name][:2]
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.context_parallel_degree, par.expert_parallel_degree) == (p.tp, p.pp, p.cp, p.ep)
    assert par.data_parallel_replicate_degree * par.data_parallel_shard_degree == p.dp
    assert par.data_parallel_shard_degree == ((p.dp_shard or p.dp) if p.zero == 3 else 1)
    assert (tr.global_batch_size, tr.seq_len) == (p.global_batch, p.seq_len)
    assert (par.pipeline_parallel_microbatch_size if p.pp > 1 else tr.local_batch_size) == p.micro_batch
    assert type(c.activation_checkpoint).__qualname__.split(".")[0] == AC_CLASS[p.recompute]  # not the registry's own
    assert c.compile.enable == (p.stack.kernels == "compiled")
    assert c.compile.enable_async_tensor_parallel == (p.tp > 1 and p.stack.tp_comm_overlap)
    assert tr.disable_cuda_graphs == (p.pp > 1 or p.ep > 1)
    c._validate_cuda_graphs()  # the Trainer's own check: graphs off with pp > 1 or an all-to-all EP dispatcher


@pytest.mark.parametrize("model_name", ["llama3-8b", "llama3-70b"])
def test_torchtitan03_fp8_and_expert_tp_are_refused_by_name(model_name):
    """0.3 takes Float8 linears from the registry function (no flag) and never splits experts over
    TP under EP: the export names both, and the 0.2 line expresses them."""
    fp8 = plan(dp=8, zero=3, precision=PrecisionRecipe(precision="fp8"), kernels="compiled", fsdp_fp8_all_gather=True)
    assert {w.split(":")[0] for w in export("torchtitan", MODELS[model_name], fp8).warnings} == {"precision.precision", "fsdp_fp8_all_gather"}
    assert export("torchtitan@0.2", MODELS[model_name], fp8).warnings == ()
    moe, qwen = plan(tp=2, dp=4, ep=2, zero=3, kernels="compiled", tp_backward_overlap=False), TT_CATALOG["qwen3-30b-a3b"]
    check_rules(qwen, moe)
    assert [w.split(":")[0] for w in export("torchtitan", qwen, moe).warnings] == ["ep"]
    assert export("torchtitan@0.2", qwen, moe).warnings == ()
    assert "--parallelism.expert_tensor_parallel_degree 2" in export("torchtitan@0.2", qwen, moe).text


def test_torchtitan03_float8_converter_is_row_wise_as_read():
    """0.3's Float8LinearConverter offers the row-wise recipes only, ``rowwise`` by default: what the
    llama3_405b registry function builds and meshplan reads from it (``fp8_scaling``)."""
    _torchtitan03()
    import typing

    from torchtitan.components.quantization.float8 import Float8LinearConverter

    from meshplan.interop import detect, parse_text
    from meshplan.specs.plan import FP8_SCALINGS

    field = Float8LinearConverter.Config.__dataclass_fields__["recipe_name"]
    assert set(typing.get_args(field.type)) == {"rowwise", "rowwise_with_gw_hp"} < set(FP8_SCALINGS)
    assert Float8LinearConverter.Config().recipe_name == "rowwise"
    words = "--module llama3 --config llama3_405b --parallelism.data_parallel_shard_degree 8 --training.local_batch_size 1"
    assert parse_text(words, detect(words, "plan")).plan["precision"]["fp8_scaling"] == "rowwise"


class _Mpu:
    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


DS_GRID = [p for _, p in GRID["deepspeed"]] + [TrainingPlan(tp=8, pp=4, dp=4, micro_batch=1, global_batch=256, seq_len=4096, zero=1)]


DS_GRID += [TrainingPlan(tp=4, dp=2, micro_batch=1, global_batch=8, seq_len=4096, zero=2),  # AutoTP, 8 ranks
            TrainingPlan(tp=4, cp=8, dp=2, micro_batch=1, global_batch=16, seq_len=32768, zero=1)]  # with Ulysses


def _deepspeed_mpu(p: TrainingPlan):
    """The mpu DeepSpeedConfig gets as its users run each plan: a pipeline's PipelineModule topology
    (data-parallel size dp), none for AutoTP (its tutorial's path: every rank counts) and for
    Ulysses without a pipeline (the ranks over sequence_parallel_size count), else dp."""
    if p.pp == 1 and (p.tp > 1 or p.cp > 1):
        return None
    return _Mpu(p.dp)


@pytest.mark.parametrize("p", DS_GRID, ids=range(len(DS_GRID)))
def test_deepspeed_config_class_reads_the_json(p, monkeypatch):
    config_mod = pytest.importorskip("deepspeed.runtime.config")
    monkeypatch.setattr(config_mod.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(config_mod.dist, "get_world_size", lambda *a, **k: p.num_gpus)
    cfg = json.loads(export("deepspeed", LLAMA70, p).text)
    ds = config_mod.DeepSpeedConfig(cfg, mpu=_deepspeed_mpu(p))  # its batch assertion: train = micro x gas x its world
    assert (ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps) == (p.micro_batch, p.grad_accum)
    if "train_batch_size" in cfg:
        assert ds.train_batch_size == p.global_batch
    else:  # DeepSpeed's own count, over the ranks it takes as data-parallel
        assert p.tp > 1 or p.cp > 1
    assert ds.zero_optimization_stage == p.zero
    if p.zero:
        assert ds.zero_config.overlap_comm == p.stack.overlap_grad_reduce
    assert ds.bfloat16_config.enabled == (p.precision.precision in ("bf16", "fp8"))
    assert ds.float16_config.enabled == (p.precision.precision == "fp16")
    assert str(ds.grad_accum_dtype) == p.precision.grad_dtype
    assert ds.pipeline["stages"] == (p.pp if p.pp > 1 else "auto")
    assert ds.tensor_parallel_config.autotp_size == (p.tp if p.tp > 1 else 0)


def _nanotron():
    """nanotron's config classes and the ``--to`` target of the installed line: 0.2 (its
    ParallelismArgs has recompute_granularity) or main (recompute_layer)."""
    try:
        from nanotron.config import ParallelismArgs, TokensArgs
        from nanotron.config.config import get_config_from_dict
        from nanotron.config.models_config import LlamaConfig
    except ImportError as exc:
        pytest.skip(f"nanotron is not importable: {exc}")
    known = {f.name for f in dataclasses.fields(ParallelismArgs)}
    target = "nanotron@main" if "recompute_layer" in known else "nanotron@0.2" if "recompute_granularity" in known else None
    if target is None:
        pytest.skip("a nanotron line between 0.2 and main: no export targets it")
    return ParallelismArgs, TokensArgs, LlamaConfig, get_config_from_dict, target


@pytest.mark.parametrize("line", ["nanotron@0.2", "nanotron@main"])
@pytest.mark.parametrize("row", range(max(len(GRID["nanotron@0.2"]), len(GRID["nanotron@main"]))))
def test_nanotron_dataclasses_read_the_sections(line, row):
    ParallelismArgs, TokensArgs, LlamaConfig, from_dict, installed = _nanotron()
    if line != installed or row >= len(GRID[line]):
        pytest.skip(f"the installed nanotron is read by --to {installed}")
    model_name, p = GRID[line][row]
    secs = yaml.safe_load(export(line, MODELS[model_name], p).text)
    par = from_dict(secs["parallelism"], config_class=ParallelismArgs)  # nanotron's strict dacite reader
    assert (par.dp, par.tp, par.pp) == (p.dp, p.tp, p.pp)
    assert par.tp_mode.name == ("REDUCE_SCATTER" if p.sequence_parallel and p.tp > 1 else "ALL_REDUCE")
    assert type(par.pp_engine).__name__ == ("AllForwardAllBackwardPipelineEngine" if p.schedule == "gpipe" else "OneForwardOneBackwardPipelineEngine")
    if line == "nanotron@main":
        assert par.recompute_layer == (p.recompute == "full")
    tok = from_dict({**secs["tokens"], "train_steps": 1}, config_class=TokensArgs)
    assert tok.micro_batch_size * tok.batch_accumulation_per_replica * par.dp == p.global_batch
    mc = from_dict(secs["model"]["model_config"], config_class=LlamaConfig)
    assert (mc.num_hidden_layers, mc.hidden_size, mc.num_key_value_heads) == (MODELS[model_name].n_layers, MODELS[model_name].hidden, MODELS[model_name].n_kv_heads)


#: ``--to`` targets → the engine release their tests above run against (docs/interop.md's table)
VALIDATED = {"torchtitan": "torchtitan 0.3.0", "torchtitan@0.3": "torchtitan 0.3.0", "torchtitan@0.2": "torchtitan 0.2.2",
             "torchtitan-toml": "torchtitan 0.2.2", "deepspeed": "DeepSpeed 0.19.8", "nanotron": "nanotron 0.2", "nanotron@0.2": "nanotron 0.2",
             "nanotron@main": "nanotron main", "megatron": "Megatron-LM (megatron-core 0.19.2)"}


def test_docs_version_table_is_the_tests():
    """docs/interop.md's version table names every export target and the release its test runs."""
    from pathlib import Path

    from meshplan.interop import ENGINES

    doc = (Path(__file__).resolve().parents[1] / "docs" / "interop.md").read_text()
    rows = {}
    for line in doc.split("## Versions each export is validated against", 1)[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| `") and cells[0] != "`--to`":
            for target in cells[0].replace("`", "").split(", "):
                rows[target] = cells[1]
    assert set(rows) == set(ENGINES)
    assert {k: v for k, v in rows.items() if k in VALIDATED} == VALIDATED
    root = Path(__file__).resolve().parents[1]  # the releases `make engines` installs are the table's
    assert "MEGATRON_CORE := megatron-core==0.19.2\n" in (root / "Makefile").read_text()
    extra = (root / "pyproject.toml").read_text().split("\nengines = ", 1)[1].split("\n", 1)[0]
    assert all(pin in extra for pin in ('"torchtitan==0.3.0"', '"deepspeed==0.19.8"', '"nanotron==0.2"'))


def _deepspeed_rank(rank: int, world: int, port: int, cfg: dict, queue) -> None:
    """One rank of ``deepspeed.initialize`` on the CPU over gloo, given meshplan's exported config:
    a two-linear model, a torch optimizer (no DeepSpeed op to compile), one micro-batch step."""
    import os

    os.environ.update(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_SIZE=str(world))
    import torch
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), config=cfg)
    dtype = next(engine.module.parameters()).dtype  # bf16 when the plan is (the engine casts the model)
    loss = engine(torch.randn(cfg["train_micro_batch_size_per_gpu"], 16, dtype=dtype)).float().sum()
    engine.backward(loss)
    engine.step()
    queue.put((rank, engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(),
               engine.gradient_accumulation_steps(), engine.zero_optimization_stage()))


@pytest.mark.parametrize("world", [1, 2])
def test_deepspeed_initialize_runs_the_export_on_cpu(world):
    """``deepspeed.initialize`` itself (gloo, CPU ranks) takes the exported JSON and trains a step
    with the plan's batch: train = micro x accumulation x dp, its ZeRO stage."""
    pytest.importorskip("deepspeed")
    import multiprocessing
    import socket

    p = TrainingPlan(dp=world, micro_batch=2, global_batch=4 * world, seq_len=4096, zero=2)
    cfg = json.loads(export("deepspeed", LLAMA70, p).text)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_deepspeed_rank, args=(r, world, port, cfg, queue)) for r in range(world)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=240)
    assert all(proc.exitcode == 0 for proc in procs), [proc.exitcode for proc in procs]
    got = sorted(queue.get(timeout=5) for _ in range(world))
    assert got == [(r, p.global_batch, p.micro_batch, p.grad_accum, 2) for r in range(world)]


# ---- Megatron-LM: parse_args + validate_args --------------------------------------------------------

#: the GPU's compute capability validate_args asks torch for (H100, Hopper: the CUDA_DEVICE_MAX_CONNECTIONS rules)
HOPPER = (9, 0)


@pytest.fixture(scope="module")
def megatron_arguments():
    """megatron-core 0.19.2's ``megatron.training.arguments``. Its cp311 wheel declares Requires-Python
    >= 3.12 and uses one 3.12 name, ``typing.override`` (a decorator that only marks a method), which
    Python 3.11 takes from typing_extensions; torch here is the CPU build, so the device
    validate_args asks about is the plan's GPU, an H100 (compute capability 9.0)."""
    import typing
    import warnings

    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.training") is None:
        pytest.skip("megatron-core (with megatron/training) is not installed")
    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override
    with warnings.catch_warnings():  # no Transformer Engine, no Apex on a CPU venv: Megatron warns and falls back
        warnings.simplefilter("ignore")
        import megatron.training.arguments as arguments
    import torch

    mp = pytest.MonkeyPatch()
    mp.setattr(arguments, "get_device_arch_version", lambda: HOPPER[0])
    mp.setattr(torch.cuda, "get_device_capability", lambda *a, **k: HOPPER)
    yield arguments
    mp.undo()


def _megatron_launch(text: str) -> tuple[dict[str, Optional[str]], list[str]]:
    """The environment lines (``export K=V``, ``unset K``) and pretrain_gpt.py's arguments of an export."""
    env: dict[str, Optional[str]] = {}
    for line in text.splitlines():
        words = line.split("#")[0].split()
        if words[:1] == ["export"]:
            key, _, value = words[1].partition("=")
            env[key] = value
        elif words[:1] == ["unset"]:
            env[words[1]] = None
    tokens = arg_tokens(text)
    return env, tokens[tokens.index("pretrain_gpt.py") + 1:]


MIXTRAL, DEEPSEEK = load_model("mixtral-8x7b"), load_model("deepseek-v3-671b")
#: GRID's Megatron rows and the six plan kinds users export
MEGATRON_GRID = [(MODELS[m], p) for m, p in GRID["megatron"]] + [
    (MODELS["llama3-8b"], plan(dp=8, zero=3)),                                            # FSDP (Megatron-FSDP)
    (LLAMA70, plan(tp=8, pp=4, dp=2, zero=1, recompute="selective")),                      # TP x PP
    (LLAMA70, plan(tp=4, pp=4, dp=2, vpp=5, schedule="interleaved", recompute="full")),  # interleaved PP
    (MIXTRAL, plan(tp=2, pp=2, dp=8, ep=8, zero=1)),                                       # MoE with EP
    (DEEPSEEK, plan(tp=2, pp=8, dp=16, ep=16, zero=1, layer_split=(7,) + (8,) * 6 + (6,))),  # MoE, MLA, dense layers
    (LLAMA70, plan(tp=8, cp=8, dp=2, zero=1, seq_len=131072, recompute="full")),           # long-context CP
    (MODELS["llama3-8b"], plan(tp=2, dp=4, zero=1, precision=PrecisionRecipe(precision="fp8"))),  # FP8
]
#: ZeRO stage -> (use_distributed_optimizer, use_megatron_fsdp, its sharding strategy): validate_args
#: turns the distributed optimizer on under Megatron-FSDP ("only compatible with --use-distributed-optimizer")
ZERO_FLAGS = {0: (False, False, None), 1: (True, False, None), 2: (True, True, "optim_grads"), 3: (True, True, "optim_grads_params")}


@pytest.mark.parametrize(("model", "p"), MEGATRON_GRID, ids=range(len(MEGATRON_GRID)))
def test_megatron_validate_args_accepts_the_export(megatron_arguments, model, p, monkeypatch, capsys):
    check_rules(model, p)  # a plan meshplan itself accepts
    r = export("megatron", model, p)
    env, argv = _megatron_launch(r.text)
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    for key, value in env.items():
        if value is not None:
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("WORLD_SIZE", str(p.num_gpus))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *argv])
    args = megatron_arguments.parse_args()  # argparse: an unknown flag exits 2
    megatron_arguments.validate_args(args, {})  # its assertions: the layout, batch, FSDP, device rules
    capsys.readouterr()
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size) == (p.tp, p.pp, p.cp)
    assert args.data_parallel_size == p.dp and args.world_size == p.num_gpus
    assert (args.virtual_pipeline_model_parallel_size or 1) == p.vpp
    assert (args.micro_batch_size, args.global_batch_size, args.seq_length) == (p.micro_batch, p.global_batch, p.seq_len)
    assert args.sequence_parallel == (p.sequence_parallel and p.tp > 1)
    assert args.recompute_granularity == {"none": None, "op": "selective"}.get(p.recompute, p.recompute)
    if p.recompute == "full":  # every layer recomputed one at a time, or the first N of each stage
        assert (args.recompute_method, args.recompute_num_layers) == (
            ("uniform", 1) if p.recompute_layers is None else ("block", p.recompute_layers))
    assert (args.use_distributed_optimizer, args.use_megatron_fsdp, args.data_parallel_sharding_strategy if p.zero > 1 else None) == ZERO_FLAGS[p.zero]
    assert args.num_distributed_optimizer_instances == (p.dp // p.dp_shard if p.zero and p.dp_shard else 1)
    assert args.num_layers == model.n_layers and (args.num_experts or 0) == model.n_experts
    if model.is_moe:  # the all-to-all meshplan prices, experts split over TP as meshplan's model splits them
        assert (args.expert_model_parallel_size, args.expert_tensor_parallel_size) == (p.ep, p.tp)
        assert args.moe_token_dispatcher_type == "alltoall" and args.moe_grouped_gemm
    assert args.fp8 == ("hybrid" if p.precision.precision == "fp8" else None)
    assert (args.bf16, args.fp16) == (p.precision.precision in ("bf16", "fp8"), p.precision.precision == "fp16")
    if p.pp > 1:  # the layers each stage holds: Megatron's own split of its arguments
        assert _megatron_split(args, model) == effective_split(model, p)


def _megatron_split(args, model) -> tuple[int, ...]:
    """Layers per virtual stage as Megatron-Core derives them from validated arguments: its layout
    string, its first/last-stage counts, or an even split."""
    from megatron.core.transformer.pipeline_parallel_layer_layout import LayerType, PipelineParallelLayerLayout

    n_stages = args.pipeline_model_parallel_size * (args.virtual_pipeline_model_parallel_size or 1)
    if args.pipeline_model_parallel_layout is not None:
        layout = PipelineParallelLayerLayout.parse_str_to_list(args.pipeline_model_parallel_layout)
        return tuple(stage.count(LayerType.decoder) for stage in layout)
    if args.decoder_first_pipeline_num_layers is not None:
        middle = (model.n_layers - args.decoder_first_pipeline_num_layers - args.decoder_last_pipeline_num_layers) // (n_stages - 2)
        return (args.decoder_first_pipeline_num_layers,) + (middle,) * (n_stages - 2) + (args.decoder_last_pipeline_num_layers,)
    return (model.n_layers // n_stages,) * n_stages


# ---- every engine, the six plan kinds: exported exactly, warned by name, or refused by name -----------

SIX_KINDS = {
    "fsdp": (MODELS["llama3-8b"], plan(dp=8, zero=3)),
    "tp_pp": (LLAMA70, plan(tp=8, pp=4, dp=2, zero=1)),
    "interleaved": (LLAMA70, plan(tp=4, pp=4, dp=2, vpp=5, schedule="interleaved", zero=1)),
    "moe_ep": (TT_CATALOG["qwen3-30b-a3b"], plan(dp=8, ep=8, zero=1)),
    "cp": (LLAMA70, plan(tp=8, cp=8, dp=2, zero=1, seq_len=131072, recompute="full")),
    "fp8": (MODELS["llama3-8b"], plan(tp=2, dp=4, zero=1, precision=PrecisionRecipe(precision="fp8"))),
}


def _named_fields() -> set[str]:
    from meshplan.specs.model import ModelSpec
    from meshplan.specs.stack import Stack

    return (set(TrainingPlan.model_fields) | set(Stack.model_fields) | {f"precision.{k}" for k in PrecisionRecipe.model_fields}
            | {f"model.{k}" for k in ModelSpec.model_fields} | {"model"})


@pytest.mark.parametrize("kind", SIX_KINDS)
def test_six_plan_kinds_are_exported_or_named(kind):
    """Each engine writes each of the six plan kinds, naming every setting it cannot express by the
    plan's field (``field: ...``), or refuses it in one line naming the field; Megatron-LM expresses
    all six exactly (its validate_args runs them above)."""
    from meshplan.errors import InputError
    from meshplan.interop import ENGINES

    model, p = SIX_KINDS[kind]
    check_rules(model, p)
    fields = _named_fields()
    for engine in ENGINES:
        try:
            warnings = export(engine, model, p).warnings
        except InputError as exc:
            assert exc.field in fields, (engine, str(exc))
            continue
        assert {w.split(":", 1)[0] for w in warnings} <= fields, (engine, warnings)
        if engine == "megatron":
            assert warnings == ()


def _torchtitan03_values(text: str, p: TrainingPlan) -> dict:
    c = _torchtitan03()().parse_args(arg_tokens(text))
    par, tr = c.parallelism, c.training
    c._validate_cuda_graphs()
    return dict(tp=par.tensor_parallel_degree, pp=par.pipeline_parallel_degree, cp=par.context_parallel_degree,
                ep=par.expert_parallel_degree, dp=par.data_parallel_replicate_degree * par.data_parallel_shard_degree,
                micro_batch=par.pipeline_parallel_microbatch_size if par.pipeline_parallel_degree > 1 else tr.local_batch_size,
                global_batch=tr.global_batch_size, seq_len=tr.seq_len, zero=3 if par.data_parallel_shard_degree > 1 else 0)


def _deepspeed_values(text: str, p: TrainingPlan) -> dict:
    config_mod = pytest.importorskip("deepspeed.runtime.config")
    cfg = json.loads(text)
    mp = pytest.MonkeyPatch()
    mp.setattr(config_mod.dist, "get_rank", lambda *a, **k: 0)
    mp.setattr(config_mod.dist, "get_world_size", lambda *a, **k: p.num_gpus)
    try:
        ds = config_mod.DeepSpeedConfig(cfg, mpu=_deepspeed_mpu(p))
    finally:
        mp.undo()
    out = dict(micro_batch=ds.train_micro_batch_size_per_gpu, zero=ds.zero_optimization_stage,
               tp=ds.tensor_parallel_config.autotp_size or 1)
    if p.pp > 1:
        out["pp"] = ds.pipeline["stages"]
    if "train_batch_size" in cfg:
        out["global_batch"] = ds.train_batch_size
    return out


def _nanotron_values(text: str, p: TrainingPlan) -> dict:
    ParallelismArgs, TokensArgs, _, from_dict, installed = _nanotron()
    secs = yaml.safe_load(text)
    par = from_dict(secs["parallelism"], config_class=ParallelismArgs)
    tok = from_dict({**secs["tokens"], "train_steps": 1}, config_class=TokensArgs)
    dp = par.dp * getattr(par, "expert_parallel_size", 1)  # 0.2's EP axis: dp / ep written as dp
    return dict(tp=par.tp, pp=par.pp, dp=dp, micro_batch=tok.micro_batch_size, seq_len=tok.sequence_length,
                global_batch=tok.micro_batch_size * tok.batch_accumulation_per_replica * dp)


ENGINE_VALUES = {"torchtitan": _torchtitan03_values, "deepspeed": _deepspeed_values, "nanotron": _nanotron_values}


@pytest.mark.parametrize("engine", ENGINE_VALUES)
@pytest.mark.parametrize("kind", SIX_KINDS)
def test_six_plan_kinds_pass_each_engines_validation(engine, kind):
    """Each engine's own validation takes its export of each of the six plan kinds (or meshplan
    refused it by name), and every value it parses equals the plan's unless the export warned that
    field by name."""
    from meshplan.errors import InputError

    model, p = SIX_KINDS[kind]
    try:
        r = export(engine, model, p)
    except InputError:
        return  # refused by name: test_six_plan_kinds_are_exported_or_named
    warned = {w.split(":", 1)[0] for w in r.warnings}
    got = ENGINE_VALUES[engine](r.text, p)
    for field, value in got.items():
        if field not in warned:
            assert value == getattr(p, field), (engine, kind, field, value)
