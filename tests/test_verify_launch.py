"""The launcher of verify's real runs: a failure is reported by its cause, not by the first rank
that lost its peer; a worker killed by a signal is :class:`WorkersLost`, and ``retries`` starts the
launch again whole."""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import signal
import threading
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from meshplan.catalog.hf_config import model_from_hf_config  # noqa: E402
from meshplan.errors import RunFailed  # noqa: E402
from meshplan.specs.plan import PrecisionRecipe, TrainingPlan  # noqa: E402
from meshplan.verify import launch  # noqa: E402

CONFIG = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
          "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 64}
PEER_CLOSED = "Traceback ...\nRuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:22238.\n"
OWN = "Traceback ...\nAssertionError: stage 1 got 3 micro-batches\n"


def _cause(errors: dict[int, str], exitcodes: list[int | None], late: dict[int, str] | None = None) -> Exception:
    """What :func:`launch._raise_cause` raises given the errors seen, the workers' exit codes and the
    errors still in the queue."""
    out: queue.Queue = queue.Queue()
    for rank, err in (late or {}).items():
        out.put((-1, rank, None, err))
    procs = [SimpleNamespace(exitcode=code) for code in exitcodes]
    with pytest.raises(RuntimeError) as info:
        launch._raise_cause("verify comm", dict(errors), procs, out)
    return info.value


def test_the_rank_with_an_error_of_its_own_is_the_cause_even_when_it_arrives_later():
    err = _cause({1: PEER_CLOSED}, [0, 0, 0], late={2: PEER_CLOSED, 0: OWN})
    assert type(err) is RunFailed and str(err).startswith("verify comm: rank 0 failed:\n") and "AssertionError" in str(err)


def test_a_worker_killed_by_a_signal_is_workers_lost_and_named():
    err = _cause({1: PEER_CLOSED}, [-signal.SIGKILL, 0])
    assert isinstance(err, launch.WorkersLost)
    assert str(err) == ("verify comm: rank 0 was killed by SIGKILL (most often the kernel's out-of-memory killer)\n"
                        "rank 1 then failed: RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                        "[127.0.0.1]:22238.")
    err = _cause({}, [0, 3])
    assert isinstance(err, launch.WorkersLost) and str(err) == "verify comm: rank 1 exited with code 3 without an error of its own"


def test_only_peers_lost_is_workers_lost():
    err = _cause({0: PEER_CLOSED, 1: PEER_CLOSED}, [0, 0])
    assert isinstance(err, launch.WorkersLost) and "every failing rank lost its peer" in str(err)


def test_a_killed_worker_starts_the_launch_again(monkeypatch):
    """A real launch of two gloo ranks, one SIGKILLed from outside once its process runs: the first
    attempt is lost, named by the signal in a warning, and the second gives every rank's result."""
    model = model_from_hf_config(CONFIG, "tiny")
    plan = TrainingPlan.of(dp=2, zero=0, seq_len=32, global_batch=2, precision=PrecisionRecipe(precision="fp32", grad_dtype="fp32"))
    monkeypatch.setattr(launch, "SETTLE_S", 1.0)
    killed: list[int] = []
    others = {p.pid for p in multiprocessing.active_children()}  # this process's other children, if any

    def kill_one_worker() -> None:
        deadline = time.monotonic() + 60
        while not killed and time.monotonic() < deadline:
            children = [p for p in multiprocessing.active_children() if p.pid is not None and p.pid not in others]
            if len(children) == 2:
                time.sleep(0.3)  # spawned, still starting up: long before its first result
                os.kill(children[-1].pid, signal.SIGKILL)
                killed.append(children[-1].pid)
            time.sleep(0.05)

    killer = threading.Thread(target=kill_one_worker, daemon=True)
    killer.start()
    with pytest.warns(RuntimeWarning, match=r"was killed by SIGKILL .* starting the launch again \(1 of 1\)"):
        (ranks,) = launch.launch([(model, plan)], timeout=120, retries=1)
    killer.join()
    assert len(killed) == 1
    assert [r["rank"] for r in ranks] == [0, 1]


def test_cli_says_a_failed_run_in_words_with_exit_1(tmp_path, capsys):
    """A run that fails (here: past its --timeout) is not the input's fault: ``error:`` and what
    failed on stderr, exit 1, no traceback of meshplan's own."""
    from meshplan.cli.app import main

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(CONFIG))
    argv = ["verify", "comm", "--model", str(cfg), "--seq-len", "64", "--dp", "2", "--zero", "0", "--timeout", "0.5"]
    assert main(argv) == 1
    assert capsys.readouterr().err == "error: verify comm: workers did not finish within 0.5 s\n"
