"""The search options, declared once (:class:`meshplan.cli.search_options.SearchArgs`) and shared by
``meshplan search``, ``meshplan export --from-search`` and ``POST /api/search``."""

from __future__ import annotations

from dataclasses import fields

import pytest
import typer

from meshplan.catalog import load_model
from meshplan.cli.app import app
from meshplan.cli.options import PlanArgs
from meshplan.cli.search_options import SearchArgs, option_types
from meshplan.errors import InputError
from meshplan.search.space import RECOMPUTE, SCHEDULE_NAMES

from test_bad_input import assert_one_error_line, run_cli


def _options(name: str) -> dict[str, tuple]:
    """``--flag`` → (default, help) of one command's options."""
    command = typer.main.get_command(app).commands[name]
    return {p.opts[0]: (p.default, p.help) for p in command.params if p.opts[0].startswith("--")}


def test_search_and_export_share_one_declaration():
    search, export = _options("search"), _options("export")
    expected = {"--" + f.name.replace("_", "-"): (f.default, f.metadata["option"].help) for f in fields(SearchArgs)}
    assert len(expected) == 12
    for flag, (default, help) in expected.items():
        assert search[flag] == (default, help), flag
        if flag != "--top":
            assert export[flag] == (default, help), flag
    assert "--top" not in export  # export takes the best plan only
    assert {"--baseline", "--pareto", "--gpus-range", "--json"} <= set(search) and not {"--baseline", "--pareto"} & set(export)
    # the order of --help: search options right after --objective / --from-search, in declaration order
    names = list(search)
    assert names[names.index("--objective"):names.index("--objective") + 12] == list(expected)
    names = list(export)
    assert names[names.index("--from-search") + 1:names.index("--from-search") + 12] == [f for f in expected if f != "--top"]


def test_web_search_request_has_every_option():
    from meshplan.web.search_api import SearchRequest

    model_fields = SearchRequest.model_fields
    for name, (_, default, _) in option_types().items():
        assert model_fields[name].default == default, name
    assert model_fields["pareto"].default is True and model_fields["baseline"].default is None


def test_given_names_the_options_off_their_default():
    assert SearchArgs().given() == []
    assert SearchArgs(objective="throughput", headroom=0.0, hsdp=False).given() == []
    assert SearchArgs(max_tp=4, hsdp=True, batch_range="4M,16M").given() == ["--max-tp", "--hsdp", "--batch-range"]
    assert SearchArgs(headroom=0.1, top=3).given() == ["--top", "--headroom"]


@pytest.mark.parametrize("text,seq_len,want", [
    ("4M,16M", 8192, (512, 1024, 2048)),  # 4,194,304 / 8,192 = 512 sequences, doubling to 16M = 2,048
    ("4M,12M", 8192, (512, 1024, 1536)),  # MAX itself last when doubling misses it
    ("1M,1M", 4096, (256,)),
    ("3M, 4M", 4096, (768, 1024)),
])
def test_batch_range_doubles_from_min_to_max(text, seq_len, want):
    assert SearchArgs(batch_range=text).global_batches(seq_len) == want


def test_no_batch_range_keeps_the_plan_batch():
    assert SearchArgs().global_batches(4096) is None


@pytest.mark.parametrize("args,field", [
    (dict(batch_range="16M"), "batch_range"),
    (dict(batch_range="16M,4M"), "batch_range"),
    (dict(batch_range="1k,2k"), "batch_range"),  # under one 4,096-token sequence
    (dict(batch_range="x,4M"), "batch_range"),  # a bound that is no number names --batch-range
    (dict(batch_range="4M,2.5Q"), "batch_range"),
])
def test_batch_range_bad_input(args, field):
    with pytest.raises(InputError) as err:
        SearchArgs(**args).global_batches(4096)
    assert err.value.field == field


def test_batch_range_bound_that_is_no_number_says_which_value():
    with pytest.raises(InputError) as err:
        SearchArgs(batch_range="x,4M").global_batches(4096)
    assert str(err.value) == "batch_range: MIN and MAX must be a finite number such as 16M, 15.6T or 2e12 (got 'x')"


def test_limits_default_and_fixed_axes():
    lim = SearchArgs().limits(PlanArgs())
    assert (lim.max_tp, lim.max_cp, lim.max_pp, lim.max_vpp, lim.max_micro_batch, lim.max_ep) == (None, 16, 128, 8, 8, None)
    assert lim.schedules == SCHEDULE_NAMES and lim.recompute == RECOMPUTE and lim.zero == (0, 1, 2, 3)
    assert lim.sequence_parallel == (True, False) and lim.tp_comm_overlap == (False,) and lim.hsdp is False
    plan = PlanArgs(tp=8, pp=4, schedule="zbv", recompute="full", zero="3", sequence_parallel=False, tp_comm_overlap=True)
    lim = SearchArgs(max_cp=2, max_vpp=4, max_micro_batch=2, max_ep=8, schedules="1f1b,gpipe", hsdp=True).limits(plan)
    assert (lim.tp, lim.pp, lim.max_cp, lim.max_vpp, lim.max_micro_batch, lim.max_ep) == (8, 4, 2, 4, 2, 8)
    assert lim.schedules == ("zbv",)  # a --schedule flag fixes the schedule over --schedules
    assert (lim.recompute, lim.zero, lim.sequence_parallel, lim.tp_comm_overlap, lim.hsdp) == (("full",), (3,), (False,), (True,), True)
    assert SearchArgs(schedules="1f1b, gpipe").limits(PlanArgs()).schedules == ("1f1b", "gpipe")


@pytest.mark.parametrize("args,field,rule", [
    (dict(max_micro_batch=0), "max_micro_batch", "must be at least 1 (got 0)"),
    (dict(max_ep=-2), "max_ep", "must be at least 1 (got -2)"),
    (dict(schedules="1f1b,zigzag"), "schedules", "unknown schedule 'zigzag'"),
])
def test_limits_bad_input(args, field, rule):
    with pytest.raises(InputError) as err:
        SearchArgs(**args).limits(PlanArgs())
    assert err.value.field == field and rule in str(err.value)


@pytest.mark.parametrize("args,field,rule", [
    (dict(objective="fastest"), "objective", "must be one of throughput, time-to-train, cost (got 'fastest')"),
    (dict(top=0), "top", "must be between 1 and 1000 (got 0)"),
    (dict(top=1001), "top", "must be between 1 and 1000 (got 1001)"),
    (dict(headroom=1.0), "headroom", "must be a fraction in [0, 1) (got 1.0)"),
    (dict(headroom=-0.1), "headroom", "must be a fraction in [0, 1) (got -0.1)"),
])
def test_check_bad_input(args, field, rule):
    with pytest.raises(InputError) as err:
        SearchArgs(**args).check()
    assert err.value.field == field and rule in str(err.value)


def test_check_accepts_the_bounds():
    SearchArgs(top=1, headroom=0.0).check()
    SearchArgs(top=1000, headroom=0.99, objective="cost").check()
    with pytest.raises(InputError, match="between 1 and 100 "):
        SearchArgs(top=101).check(max_top=100)


def test_export_refuses_search_options_without_from_search():
    base = ["export", "--to", "megatron", "--model", "llama3-8b", "--gpus", "8"]
    assert_one_error_line(*run_cli(*base, "--batch-range", "4M,8M"), "error: batch_range: --batch-range is a search option")
    assert_one_error_line(*run_cli(*base, "--hsdp"), "error: hsdp: --hsdp is a search option: it needs --from-search")
    code, out, err = run_cli(*base, "--top", "3")  # not an export option
    assert code == 2 and out == "" and "--top" in err
    code, out, err = run_cli(*base, "--objective", "throughput", "--headroom", "0")  # the defaults, as if not given
    assert code == 0 and out.startswith("# Megatron-LM"), err


@pytest.mark.parametrize("switch", ["fsdp_fp8_all_gather", "fsdp_head_in_root"])
def test_zero3_switches_search_every_zero_stage(switch):
    """A switch that describes ZeRO-3 (FSDP2's FP8 all-gather, its 2024 root unit) is a base
    setting: the search still varies the ZeRO stage and gives the switch to its ZeRO-3 plans only,
    each estimated as ``meshplan estimate`` would with that plan."""
    from meshplan.cli.search_cmd import execute
    from meshplan.estimate import estimate

    args = PlanArgs(model="llama3-8b", gpus=16, seq_len=4096, global_batch=32, precision="fp8", pp=1,
                    set_fields=["kernels=compiled", f"{switch}=true"])
    result, cluster, _ = execute(args, SearchArgs(top=40, max_tp=2, max_micro_batch=2))
    plans = [c.estimate.plan for c in result.top]
    assert {p.zero for p in plans} > {3}
    for p in plans:
        assert getattr(p.stack, switch) is (p.zero == 3)
    best3 = next(c.estimate for c in result.top if c.estimate.plan.zero == 3)
    assert estimate(load_model("llama3-8b"), cluster, best3.plan).peak_bytes == best3.peak_bytes


def test_a_baseline_runs_the_requested_stack_on_its_own_layout():
    """The search's base plan has tp 1, whose rules set the TP fields aside; a --baseline with TP
    gets them back from the requested stack, as the searched plans do (nemo: TP overlap;
    megatron-core: the backward's own TP overlap)."""
    from meshplan.catalog import load_stack
    from meshplan.cli.search_cmd import parse_baseline
    from meshplan.specs.plan import TrainingPlan

    for name, field in (("nemo", "tp_comm_overlap"), ("megatron-core", "tp_backward_overlap")):
        stack = load_stack(name)
        base = TrainingPlan(global_batch=64, seq_len=4096, stack=stack)
        assert getattr(stack, field) and not getattr(base.stack, field)
        assert getattr(parse_baseline("tp=4,pp=2", base, 64, stack).stack, field)
        assert not getattr(parse_baseline("tp=1,pp=2", base, 64, stack).stack, field)
