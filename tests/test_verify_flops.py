"""meshplan verify flops: FlopCounterMode against meshplan's FLOP counts, exact (needs torch + transformers)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from meshplan.catalog import load_model  # noqa: E402
from meshplan.catalog.hf_config import model_from_hf_config  # noqa: E402
from meshplan.cli.app import main  # noqa: E402
from meshplan.cost.params import count_params  # noqa: E402
from meshplan.verify import flops  # noqa: E402
from meshplan.verify.build import build_model, hf_config  # noqa: E402
from meshplan.verify.device import gpus_visible  # noqa: E402

#: cpu (fake tensors, CPU kernels) and, where a GPU is visible, cuda (real tensors, CUDA SDPA kernels)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(gpus_visible() < 1, reason="needs a CUDA GPU"))]

LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 8,
         "num_key_value_heads": 4, "intermediate_size": 688, "vocab_size": 1000, "max_position_embeddings": 512}
GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 256, "n_head": 4, "vocab_size": 1000, "n_positions": 512}


@pytest.fixture(scope="module")
def llama():
    return model_from_hf_config(LLAMA, "tiny-llama")


@pytest.fixture(scope="module")
def gpt2():
    return model_from_hf_config(GPT2, "tiny-gpt2")


@pytest.mark.parametrize("name", ["llama3-8b", "llama2-7b", "gpt3-175b"])
def test_hf_config_round_trip_and_exact_parameter_count(name):
    spec = load_model(name)
    back = model_from_hf_config(hf_config(spec), spec.name)
    assert back.model_dump(exclude={"source"}) == spec.model_dump(exclude={"source"})
    net = build_model(spec)  # meta device: no memory
    assert sum(p.numel() for p in net.parameters()) == count_params(spec).total


@pytest.mark.parametrize("device", DEVICES)
def test_llama_eager_matches_exactly(llama, device):
    c = flops.compare(llama, 2, 128, attn="eager", device=device)
    assert c.ok, [r.to_dict() for r in c.failures]
    n_mm = count_params(llama).matmul
    assert c.row("dense forward (2·N_mm·T)").measured == 2 * n_mm * 256 == 873_463_808
    # 4·L·a·d·s²·b forward, no known difference on the eager (bmm) path
    assert c.row("attention forward (full s², 4·L·a·d·s²·b)").measured == 4 * 2 * 256 * 128**2 * 2
    assert all(r.known == 0 for r in c.rows)


def test_llama_sdpa_counts_the_cpu_flash_kernel(llama):
    c = flops.compare(llama, 2, 128, attn="sdpa")
    assert c.ok, [r.to_dict() for r in c.failures]
    by_op = c.setup["measured_by_op"]
    # the trap: without the custom formulas this kernel would count 0
    assert by_op["forward"]["_scaled_dot_product_flash_attention_for_cpu"] == 67_108_864
    back = c.row("attention backward (full s², 8·L·a·d·s²·b)")
    assert back.measured == 167_772_160 and back.predicted == 134_217_728 and back.known == 33_554_432
    assert "flash-backward-recomputes-scores" in c.known
    # meshplan's default causal figure is half of the full one
    assert c.setup["meshplan_causal_attention"] * 2 == c.row("attention forward (full s², 4·L·a·d·s²·b)").predicted * 3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_gpt2_exact(gpt2, attn, device):
    c = flops.compare(gpt2, 2, 128, attn=attn, device=device)
    assert c.ok, [r.to_dict() for r in c.failures]
    assert c.setup["measured_by_op"]["forward"]["addmm"] > 0  # Conv1D layers counted as dense


@pytest.mark.skipif(gpus_visible() < 1, reason="needs a CUDA GPU")
def test_llama_sdpa_on_cuda_counts_a_cuda_kernel(llama):
    """On CUDA the fp32 model's SDPA runs a CUDA kernel whose formula torch registers (memory-efficient
    attention for fp32, or the math path's bmm): the same exact rows as on CPU, no custom formula."""
    c = flops.compare(llama, 2, 128, attn="sdpa", device="cuda")
    assert c.ok, [r.to_dict() for r in c.failures]
    assert c.setup["device"] == "cuda"
    fwd = c.setup["measured_by_op"]["forward"]
    assert not any("for_cpu" in op for op in fwd)
    kernels = [op for op in fwd if op.split(".")[0] in flops.ATTENTION_OPS]
    assert kernels and sum(fwd[op] for op in kernels) == 67_108_864 == c.row("attention forward (full s², 4·L·a·d·s²·b)").predicted
    back = c.row("attention backward (full s², 8·L·a·d·s²·b)")
    fused = any(op.split(".")[0] in flops.FUSED_BACKWARD for op in c.setup["measured_by_op"]["backward"])
    assert back.measured == (167_772_160 if fused else 134_217_728)


@pytest.mark.parametrize("fixture", ["llama", "gpt2"])
def test_full_recompute_matches_hardware_flops(fixture, request):
    model = request.getfixturevalue(fixture)
    c = flops.compare(model, 1, 128, attn="eager", recompute="full")
    assert c.ok, [r.to_dict() for r in c.failures]
    assert c.row("hardware FLOPs (with recompute, full s²)").predicted > c.row("dense forward (2·N_mm·T)").predicted * 3


def test_cli_flops_json_and_table(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA))
    assert main(["verify", "flops", "--model", str(cfg), "--seq-len", "64", "--micro-batch", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["kind"] == "flops" and len(out["rows"]) == 6
    assert main(["verify", "flops", "--model", str(cfg), "--seq-len", "64", "--attn-impl", "eager"]) == 0
    text = capsys.readouterr().out
    assert "torch measured" in text and "meshplan predicted" in text and "6 of 6 items within tolerance" in text


def test_cli_refuses_selective_recompute(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA))
    assert main(["verify", "flops", "--model", str(cfg), "--seq-len", "64", "--recompute", "selective"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: recompute:")


def test_cli_without_torch_names_the_extra(monkeypatch, tmp_path, capsys):
    import builtins

    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("No module named 'torch'", name="torch")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    assert main(["verify", "flops", "--model", "llama3-8b", "--seq-len", "64"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: verify: needs torch and transformers (torch is missing): install meshplan[verify]"]
