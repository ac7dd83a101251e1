"""meshplan verify --device: the cpu/cuda choice, its backend, and the refusals (one line naming
--device, exit 2) when torch sees no GPU or fewer GPUs than the plan has ranks. Runs without a GPU:
torch's view of the GPUs is replaced where a test needs GPUs to be there."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from meshplan.catalog.hf_config import model_from_hf_config  # noqa: E402
from meshplan.cli.app import main  # noqa: E402
from meshplan.errors import InputError  # noqa: E402
from meshplan.specs.plan import PrecisionRecipe, TrainingPlan  # noqa: E402
from meshplan.verify import device, flops, launch  # noqa: E402

CONFIG = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 8,
          "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1024, "max_position_embeddings": 512}
MODEL = model_from_hf_config(CONFIG, "tiny-llama")
FP32 = PrecisionRecipe(precision="fp32", grad_dtype="fp32")


def _gpus(monkeypatch, n: int) -> None:
    """torch sees ``n`` CUDA GPUs (none: CUDA unavailable)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


def test_backend_of_each_device():
    assert device.backend("cpu") == "gloo"
    assert device.backend("cuda") == "nccl"
    assert device.DEVICES == ("cpu", "cuda")
    with pytest.raises(InputError, match=r"^device: --device must be one of cpu, cuda \(got 'tpu'\)$"):
        device.backend("tpu")


def test_cpu_runs_any_world_without_gpus(monkeypatch):
    _gpus(monkeypatch, 0)
    device.check("cpu", 16)
    assert device.bind("cpu", 3) == torch.device("cpu") == device.here("cpu")
    assert device.gpus_visible() == 0


def test_cuda_needs_cuda(monkeypatch):
    _gpus(monkeypatch, 0)
    with pytest.raises(InputError) as err:
        device.check("cuda", 1)
    assert err.value.field == "device"
    assert str(err.value) == ("device: --device cuda needs a CUDA GPU visible to torch (torch.cuda.is_available() is False); "
                              "run with --device cpu")


@pytest.mark.parametrize("gpus,world,ok", [(1, 1, True), (2, 2, True), (8, 4, True), (1, 2, False), (2, 4, False), (4, 8, False)])
def test_cuda_needs_one_gpu_per_rank(monkeypatch, gpus, world, ok):
    _gpus(monkeypatch, gpus)
    assert device.gpus_visible() == gpus
    if ok:
        device.check("cuda", world)
        return
    with pytest.raises(InputError, match=rf"^device: --device cuda runs one process per GPU: the plan has {world} ranks "
                                         rf"but {gpus} GPUs? (is|are) visible \(world size <= GPUs\)$"):
        device.check("cuda", world)


def test_launch_refuses_before_starting_workers(monkeypatch):
    """launch() checks the device before it spawns anything: no worker, no timeout."""
    _gpus(monkeypatch, 1)
    plan = TrainingPlan(tp=2, seq_len=64, global_batch=1, precision=FP32)
    with pytest.raises(InputError, match="^device: --device cuda runs one process per GPU: the plan has 2 ranks but 1 GPU is visible"):
        launch.launch([(MODEL, plan)], timeout=0.01, device="cuda")
    with pytest.raises(ValueError, match="task must be one of"):
        launch.launch([(MODEL, plan)], task="flops")
    with pytest.raises(ValueError, match="task must be one of"):
        launch.launch([(MODEL, plan)], task=["comm", "memory"])


def test_flops_refuses_cuda_without_gpu(monkeypatch):
    _gpus(monkeypatch, 0)
    with pytest.raises(InputError, match="^device: --device cuda needs a CUDA GPU"):
        flops.measure(MODEL, 1, 64, device="cuda")


@pytest.fixture
def cfg(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    return str(path)


@pytest.mark.parametrize("command,flags,gpus,rule", [
    ("flops", [], 0, "--device cuda needs a CUDA GPU visible to torch"),
    ("memory", [], 0, "--device cuda needs a CUDA GPU visible to torch"),
    ("kernels", [], 0, "--device cuda needs a CUDA GPU visible to torch"),
    ("comm", ["--dp", "2", "--zero", "0"], 0, "--device cuda needs a CUDA GPU visible to torch"),
    ("memory", ["--tp", "2", "--dp", "2", "--zero", "3"], 2, "--device cuda runs one process per GPU: the plan has 4 ranks but 2 GPUs are visible"),
    ("comm", ["--tp", "2", "--pp", "2"], 3, "--device cuda runs one process per GPU: the plan has 4 ranks but 3 GPUs are visible"),
    ("comm", ["--cp", "2"], 1, "--device cuda runs one process per GPU: the plan has 2 ranks but 1 GPU is visible"),
])
def test_cli_device_refusals_are_one_line_exit_2(monkeypatch, capsys, cfg, command, flags, gpus, rule):
    _gpus(monkeypatch, gpus)
    assert main(["verify", command, "--model", cfg, "--seq-len", "64", *flags, "--device", "cuda"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: device: {rule}"), err
    assert captured.out == ""


def test_cli_unknown_device(capsys, cfg):
    assert main(["verify", "flops", "--model", cfg, "--seq-len", "64", "--device", "tpu"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: device: --device must be one of cpu, cuda (got 'tpu')"]


def test_cli_plan_errors_come_before_the_device(monkeypatch, capsys, cfg):
    """A plan verify cannot lay out is named first, whatever the device."""
    _gpus(monkeypatch, 0)
    assert main(["verify", "memory", "--model", cfg, "--seq-len", "64", "--pp", "2", "--device", "cuda"]) == 2
    assert capsys.readouterr().err.startswith("error: pp:")


def test_tracker_figures_of_the_device():
    """verify memory reads the tracker's figures for the device it runs on (on CUDA, Adam's step
    counters sit in the CPU entry)."""
    from meshplan.verify import memory_trackers

    snap = {torch.device("cpu"): {"OptState": 84}, torch.device("cuda", 0): {"OptState": 3_412_992}}
    assert memory_trackers._on(snap, torch.device("cuda", 0)) == {"OptState": 3_412_992}
    assert memory_trackers._on(snap, torch.device("cpu")) == {"OptState": 84}
    assert memory_trackers._on({torch.device("cpu"): {"Total": 1}}, torch.device("cuda", 0)) == {"Total": 1}
