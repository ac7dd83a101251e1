"""GPUs outside the catalog (``--gpu FILE.yaml``, meshplan.catalog.gpu_file) and the power cap
(``--gpu-power``): the Grand Teton H100 as a file equals the GPU validate builds for torchtitan's
runs, every bad key gets its own error line, the CLI exits 2 without a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from meshplan.accuracy.meta import h100_96gb
from meshplan.catalog import load_gpu, resolve_gpu
from meshplan.catalog.gpu_file import gpu_from_file_data
from meshplan.cost.calibration import power_cap_clock_ratio
from meshplan.errors import InputError, InputErrors
from test_cli import run_cli, run_json

GRAND_TETON = {"name": "h100-grand-teton", "base": "h100-sxm-80gb", "hbm_gib": 96, "hbm_gbps": 2400, "power_watts": 500}

#: A whole part written out, no base: the H100 SXM's catalog values under another name.
FULL = {
    "name": "future-part", "vendor": "nvidia", "generation": "hopper",
    "peak_tflops": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
    "hbm_gib": 80, "hbm_gbps": 3350, "sm_count": 132, "scale_up_size": 8, "scale_up_gbps": 450,
    "nic_gbps": 50, "tdp_watts": 700,
}


def write(tmp_path: Path, data: dict, name: str = "gpu.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _same_hardware(a, b) -> bool:
    keys = ("vendor", "generation", "peak_flops", "hbm_bytes", "hbm_bandwidth", "sm_count", "scale_up_size",
            "scale_up_bandwidth", "nic_bandwidth", "tdp_watts")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def test_grand_teton_file_is_validates_h100_96gb(tmp_path: Path) -> None:
    gpu = resolve_gpu(write(tmp_path, GRAND_TETON))
    assert gpu.name == "h100-grand-teton"
    assert _same_hardware(gpu, h100_96gb())
    assert gpu.peak_flops.bf16 == pytest.approx(989.4e12 * power_cap_clock_ratio(500, 700))
    assert gpu.sources["base"] == "catalog h100-sxm-80gb for the keys the file leaves out"


def test_full_file_without_base_equals_the_catalog_part(tmp_path: Path) -> None:
    gpu = resolve_gpu(write(tmp_path, FULL))
    assert gpu.name == "future-part" and _same_hardware(gpu, load_gpu("h100-sxm-80gb"))
    del FULL["name"]
    assert resolve_gpu(write(tmp_path, FULL, "my-part.yml")).name == "my-part"  # the file's stem


def test_every_bad_key_is_named_once() -> None:
    bad = {**FULL, "vendor": "intel", "hbm_gib": 0, "sm_count": 1.5, "colour": "green",
           "peak_tflops": {"fp32": 60, "bf16": -1, "fp16": 900, "fp4": 3000}}
    del bad["nic_gbps"]
    with pytest.raises(InputErrors) as caught:
        gpu_from_file_data(bad, "x")
    fields = [e.field for e in caught.value.errors]
    assert sorted(fields) == sorted(["gpu.colour", "gpu.vendor", "gpu.peak_tflops.fp4", "gpu.peak_tflops.bf16",
                                     "gpu.hbm_gib", "gpu.sm_count", "gpu.nic_gbps"])
    assert all("\n" not in str(e) for e in caught.value.errors) and "\n" not in str(caught.value)


@pytest.mark.parametrize("data,field", [
    ({"base": "tpu-v5"}, "gpu.base"),
    ({"base": "h100", "generation": "volta"}, "gpu.generation"),
    ({"base": "h100", "power_watts": 800}, "gpu.power_watts"),
    ({"base": "h100", "power_watts": 100}, "gpu.power_watts"),  # below the static power
    ({"base": "h100", "peak_tflops": [1, 2]}, "gpu.peak_tflops"),
    ({"base": "h100", "sources": {"hbm": 3}}, "gpu.sources"),
    ([1, 2], "gpu"),
])
def test_single_refusals(data, field: str) -> None:
    with pytest.raises(InputError) as caught:
        gpu_from_file_data(data, "x")
    assert caught.value.field == field


def test_cli_gpu_file_and_errors(tmp_path: Path) -> None:
    d = run_json("--gpu", write(tmp_path, GRAND_TETON), "--gpus", "8")
    assert d["cluster"]["gpu"] == "h100-grand-teton"
    bad = write(tmp_path, {**FULL, "vendor": "intel", "hbm_gib": -3}, "bad.yaml")
    code, out, err = run_cli("estimate", "--gpu", bad)
    assert (code, out) == (2, "")
    assert err.splitlines() == ["error: gpu.vendor: must be one of nvidia, amd (got 'intel')",
                                "error: gpu.hbm_gib: must be a positive number (got -3)"]
    code, _, err = run_cli("estimate", "--gpu", str(tmp_path / "missing.yaml"))
    assert (code, err) == (2, f"error: gpu: no such file: {tmp_path / 'missing.yaml'}\n")


def test_cli_power_cap_scales_the_peaks_only() -> None:
    capped = run_json("--gpu", "h100", "--gpu-power", "500", "--gpus", "8")
    full = run_json("--gpu", "h100", "--gpus", "8")
    assert capped["cluster"]["gpu"] == "h100-sxm-80gb@500W"
    assert capped["time"]["step_s"] > full["time"]["step_s"]
    assert capped["memory"] == full["memory"]
    assert run_json("--gpu", "h100", "--gpu-power", "700", "--gpus", "8")["time"] == full["time"]  # the TDP: no change
    for watts in ("900", "50", "nan"):
        code, _, err = run_cli("estimate", "--gpu", "h100", "--gpu-power", watts)
        assert code == 2 and err.startswith("error: gpu_power: ") and err.count("\n") == 1


def test_web_takes_catalog_gpus_only(tmp_path: Path) -> None:
    from meshplan.web.plan_api import plan_args

    assert plan_args({"gpu": "h100"}).gpu == "h100"
    for value in (write(tmp_path, GRAND_TETON), "/etc/hostname"):
        with pytest.raises(InputError) as caught:
            plan_args({"gpu": value})
        assert caught.value.field == "gpu" and "catalog names only" in caught.value.rule
