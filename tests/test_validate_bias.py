"""Signed bias per scale bucket, GPU generation and stack profile in ``meshplan validate``: the
library's groups, the JSON's ``bias`` keys beside ``mape``, the text and Markdown tables and the
plot's caption."""

from __future__ import annotations

import json

import pytest
from test_validate_cli import run_cli

from meshplan.accuracy.groups import gpu_generation, scale_bucket, stack_family
from meshplan.catalog import load_stack
from meshplan.cli import validate_cmd


@pytest.fixture(scope="module")
def everything(validated_all):
    return validated_all


def test_bucket_edges_generation_and_family():
    assert [scale_bucket(n) for n in (1, 128, 129, 512, 513, 2048, 2049, 16384)] == [
        "<=128", "<=128", "129-512", "129-512", "513-2048", "513-2048", ">2048", ">2048"]
    assert [gpu_generation(g) for g in ("a100-sxm-40gb", "h100-sxm-96gb-500w", "h200-sxm-141gb", "mi300x")] == [
        "A100", "H100", "H200", "MI300X"]
    assert [stack_family(load_stack(s)) for s in ("megatron-core", "nemo", "torchtitan", "composer")] == [
        "fused", "fused", "compiled", "eager"]


def test_breakdowns_are_the_means_of_their_rows(everything):
    ok = everything.supported()
    assert {k: g.supported for k, g in everything.buckets.items()} == {"<=128": 121, "129-512": 40, "513-2048": 31, ">2048": 14}
    assert {k: g.supported for k, g in everything.generations.items()} == {"A100": 55, "H100": 149, "H200": 2}
    assert {k: g.supported for k, g in everything.stacks.items()} == {
        "megatron-lm-2021": 10, "megatron-lm-2022": 9, "megatron-core": 12, "megatron-deepspeed": 5, "torchtitan-2024": 18, "torchtitan": 2, "nemo": 101, "composer": 49}
    for label, g in everything.buckets.items():
        errs = [r.error for r in ok if scale_bucket(r.gpus) == label]
        assert g.bias == pytest.approx(sum(errs) / len(errs), rel=1e-12)
        assert g.mape == pytest.approx(sum(map(abs, errs)) / len(errs), rel=1e-12)
    for label, g in everything.stacks.items():
        errs = [r.error for r in ok if r.stack == label]
        assert g.bias == pytest.approx(sum(errs) / len(errs), rel=1e-12)
    # more negative as the job grows (the figures of docs/accuracy.md)
    assert [f"{100 * g.bias:+.1f}" for g in everything.buckets.values()] == ["-3.5", "-4.7", "-6.9", "-8.2"]
    assert {r.run_set for r in ok if r.group == "dgxc"} == {"held-out"}
    assert {r.run_set for r in ok if r.group == "llama3"} == {"visible"}


def test_json_has_bias_beside_mape_in_every_summary(everything, monkeypatch):
    monkeypatch.setattr(validate_cmd, "build_report", lambda sources=None, run_set="visible": everything)
    code, out, err = run_cli("--json", "--set", "all")
    assert (code, err) == (0, "")
    d = json.loads(out)
    for name in ("buckets", "generations", "stacks"):
        assert d[name], name
        for label, g in d[name].items():
            keys = list(g)
            assert keys.index("bias") == keys.index("mape") + 1
            assert g["bias"] == getattr(everything, name)[label].bias
    assert d["overall"]["bias"] == everything.overall.bias and d["groups"]["dgxc"]["bias"] < 0


def test_text_markdown_and_plot_show_the_tables(everything, monkeypatch, tmp_path):
    monkeypatch.setattr(validate_cmd, "build_report", lambda sources=None, run_set="visible": everything)
    code, out, err = run_cli("--set", "all")
    assert (code, err) == (0, "")
    for title in ("Bias by GPU count", "Bias by GPU generation", "Bias by stack profile"):
        assert title in out
    (line,) = [ln for ln in out.splitlines() if ln.strip().startswith(">2048")]
    assert line.split() == [">2048", "14", "9.2%", "-8.2%", "21.5%"]
    code, md, err = run_cli("--markdown", "--set", "all")
    assert "### Bias by GPU count (scale bucket)" in md
    assert "| nemo | 101 | 7.1% | -6.9% | 19.3% |" in md
    path = tmp_path / "a.svg"
    code, out, err = run_cli("--out", str(path), "--set", "all")
    assert "bias by GPU count: &lt;=128 -3.5% (121), 129-512 -4.7% (40), 513-2048 -6.9% (31), &gt;2048 -8.2% (14)" in path.read_text()
