"""Load on the web explorer's ``/api/estimate``: ``meshplan serve``'s app (uvicorn, httptools,
uvloop, no access log) in a subprocess on 127.0.0.1, driven from this process by concurrent
clients, closed loop (each client sends its next request when the last one is answered), for a
fixed time per mode.

Two modes, each printed with requests, requests/s, p50/p90/p99/max latency, errors, and the CPU
time the server and the clients spent per request (the server's from /proc), against the target
(p99 under 100 ms, no errors):

* ``repeat`` cycles through 24 plans (the Llama 3 405B preset and variations, smaller models), as
  users revisiting plans do: after the first request of each, answered from the estimate cache;
* ``distinct`` makes every request a new plan (a different ``price``), so each one is a full
  estimate;
* ``cheap`` is ``distinct`` over the 8 plans of the smaller models (pp ≤ 2: cheap estimates);
* ``contended`` is ``cheap`` while one more connection keeps an expensive request in flight
  throughout (:data:`EXPENSIVE`, the Plan view at the pipeline bound, which takes a heavy slot),
  sending the next as soon as one is answered; its count and latency are printed beside.

``--mode heavy`` runs ``cheap`` and ``contended`` and then, for each of the worst requests the
server allows (:data:`WORST`: the Plan view at the 131,072 micro-batch-stage bound, the failures
calculator near its event bound, a search near its 1,000,000-plan bound), starts a fresh server,
sends it alone and reports its time, the server's peak memory above its idle resident size
(VmHWM − VmRSS from /proc) and the peak of the largest process under it (the heavy request's worker
process, where the request ran in one). ``--mode all`` runs every mode, then the worst requests.

    python benchmarks/web_load.py [--clients 50] [--seconds 30] [--mode all|both|repeat|distinct|cheap|contended|heavy] [--workers 1]

The clients are one process of raw HTTP/1.1 keep-alive connections (an asyncio protocol on uvloop
when installed), so that they take little of the CPU they share with the server; on a 2-core
machine they still take part of it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Optional
from urllib.parse import urlencode

import numpy as np

TARGET_P99_S = 0.100
HOST = "127.0.0.1"
#: One expensive request: the Plan view of a pipeline at its bound, p·v·m = 4 × 32,768 = 131,072
#: micro-batch stages (the timeline summarised), which runs in one of the server's heavy slots.
EXPENSIVE = "/api/view/plan?model=llama3-8b&gpus=8&pp=4&global_batch=65536"
#: The worst requests the server allows, each just inside a bound (GET paths; a search is a POST).
WORST = {
    "plan view, 131,072 micro-batch stages": EXPENSIVE,
    # 15,000 runs × about 652 failures: 9.8M of the 10,000,000 failure events allowed
    "failures calculator, 15,000 runs of 54 days": "/api/calc/failures?work=54d&checkpoint_time=98s&mtbf=2.4h&runs=15000",
    # 882,357 plans of the 1,000,000 allowed
    "search, 405B on 16,384 GPUs, HSDP, 4M-16M tokens": {"model": "llama3-405b", "gpus": 16384, "hsdp": True, "batch_range": "4M,16M"},
}


def plans() -> list[dict]:
    out = []
    for tp, pp, mb in itertools.product((4, 8), (8, 16), (1, 2)):
        out.append({"preset": "llama3-405b-16k", "tp": tp, "pp": pp, "micro_batch": mb})
    for model, gpus, tp in (("llama3-70b", 256, 8), ("llama3-70b", 512, 4), ("llama3-8b", 8, 1), ("llama3-8b", 64, 2),
                            ("llama2-13b", 32, 2), ("llama2-70b", 128, 8), ("llama3-405b", 1024, 8), ("llama3-8b", 16, 4)):
        out.append({"model": model, "gpus": gpus, "tp": tp, "pp": 2 if gpus >= 64 else 1, "recompute": "selective"})
    return out


def target(params: dict) -> str:
    return "/api/estimate?" + urlencode(params)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start_server(port: int, workers: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "meshplan.cli.app", "serve", "--host", HOST, "--port", str(port), "--workers", str(workers)]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}/api/presets", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not start within 60 s")


def descendants(pid: int) -> list[int]:
    """Process ``pid`` and every process under it (uvicorn's workers, the heavy requests' worker
    processes under their forkserver), from /proc."""
    parent = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    parent[int(p)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass  # gone meanwhile
    out = [pid]
    for p in out:
        out += [c for c, pp in parent.items() if pp == p]
    return out


def server_cpu_s(pid: int) -> Optional[float]:
    """User + system CPU seconds of process ``pid`` and the processes under it, from /proc; None
    where there is no /proc."""
    try:
        total = 0
        for p in descendants(pid):
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
        return total / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: sends a GET, parses the status line and
    Content-Length of the answer and completes a future with (status, body)."""

    def __init__(self) -> None:
        self.transport: Optional[asyncio.Transport] = None
        self.buf = bytearray()
        self.waiter: Optional[asyncio.Future] = None
        self.lost: Optional[Exception] = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.lost = exc or ConnectionResetError("connection closed by the server")
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(self.lost)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None:
            return
        head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        length = next((int(v) for k, _, v in (ln.partition(":") for ln in head[1:]) if k.lower() == "content-length"), None)
        if length is None:
            self.waiter.set_exception(ValueError("answer without Content-Length"))
            return
        if len(self.buf) - end - 4 < length:
            return
        body = bytes(self.buf[end + 4:end + 4 + length])
        del self.buf[:end + 4 + length]
        self.waiter.set_result((int(head[0].split()[1]), body))

    async def get(self, request: bytes) -> tuple[int, bytes]:
        if self.lost is not None:
            raise self.lost
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await self.waiter


def request_bytes(path: str, port: int) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n".encode()


async def connect(port: int) -> Connection:
    _, conn = await asyncio.get_running_loop().create_connection(Connection, HOST, port)
    return conn


#: Numbers the distinct mode's requests across all clients (one event loop, so no lock).
SERIAL = itertools.count()


def cheap_plans() -> list[dict]:
    """The plans of :func:`plans` on the smaller models (pipelines of at most 2 stages): cheap
    estimates."""
    return [p for p in plans() if "preset" not in p]


async def client(port: int, k: int, mode: str, stop: float, lat: list[float], errors: list[str]) -> None:
    table = cheap_plans() if mode in ("cheap", "contended") else plans()
    fixed = [request_bytes(target(p), port) for p in table]
    conn = await connect(port)
    i = k
    try:
        while time.perf_counter() < stop:
            if mode != "repeat":  # a price no other request has: a new plan
                req = request_bytes(target({**table[i % len(table)], "price": f"{1 + next(SERIAL) / 1e7:.7f}"}), port)
            else:
                req = fixed[i % len(fixed)]
            i += 1
            t0 = time.perf_counter()
            try:
                status, body = await conn.get(req)
                if status != 200:
                    errors.append(f"{status}: {body[:120]!r}")
            except (OSError, ValueError) as err:
                errors.append(type(err).__name__)
                conn.transport.close()
                conn = await connect(port)
            lat.append(time.perf_counter() - t0)
    finally:
        conn.transport.close()


async def expensive(port: int, stop: float, lat: list[float], errors: list[str]) -> None:
    """Keeps one :data:`EXPENSIVE` request in flight until ``stop`` (the last one may end later)."""
    conn = await connect(port)
    try:
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            status, body = await conn.get(request_bytes(EXPENSIVE, port))
            if status != 200:
                errors.append(f"{status}: {body[:120]!r}")
            lat.append(time.perf_counter() - t0)
    finally:
        conn.transport.close()


async def drive(port: int, clients: int, seconds: float, mode: str) -> tuple[list[float], list[str], float, list[float]]:
    """The cheap clients' latencies and errors, the wall time, and (``contended``) the expensive
    requests' latencies."""
    lat: list[float] = []
    errors: list[str] = []
    heavy: list[float] = []
    t0 = time.perf_counter()
    stop = t0 + seconds
    jobs = [client(port, k, mode, stop, lat, errors) for k in range(clients)]
    if mode == "contended":
        jobs.append(expensive(port, stop, heavy, errors))
    await asyncio.wait_for(asyncio.gather(*jobs), seconds + 120)
    return lat, errors, time.perf_counter() - t0, heavy


#: A quick heavy request: the warm-up starts a heavy slot's worker process with it.
QUICK_HEAVY = "/api/pipeline?pp=4&microbatches=8"


async def warm(port: int) -> None:
    """Imports, catalogs, the repeated plans' first estimates and a heavy slot's worker process,
    before the clock starts."""
    conn = await connect(port)
    for path in [target(p) for p in plans()] + [QUICK_HEAVY]:
        status, body = await conn.get(request_bytes(path, port))
        if status != 200:
            raise SystemExit(f"warm-up request {path} answered {status}: {body[:200]!r}")
    conn.transport.close()


def run(mode: str, port: int, server: subprocess.Popen, a: argparse.Namespace) -> None:
    loop_new = new_event_loop()
    try:
        cpu0, own0 = server_cpu_s(server.pid), time.process_time()
        lat, errors, wall, heavy = loop_new.run_until_complete(drive(port, a.clients, a.seconds, mode))
        cpu1, own1 = server_cpu_s(server.pid), time.process_time()
    finally:
        loop_new.close()
    x = np.array(lat) * 1e3
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    n = len(x)
    print(f"mode {mode}: {a.clients} concurrent clients, {wall:.1f} s")
    print(f"  requests {n:,}   requests/s {n / wall:,.1f}   errors {len(errors)}")
    print(f"  latency ms: p50 {p50:.1f}   p90 {p90:.1f}   p99 {p99:.1f}   max {x.max():.1f}")
    if heavy:
        print(f"  beside them {len(heavy)} expensive requests in flight one after another ({EXPENSIVE}): "
              f"{np.mean(heavy):.2f} s each on average")
    if cpu0 is not None and cpu1 is not None:
        s = (cpu1 - cpu0) / n * 1e6
        c = (own1 - own0) / n * 1e6
        print(f"  CPU per request: server {s:,.0f} us ({1e6 / s:,.0f} requests/s per core), clients {c:,.0f} us")
    verdict = "meets" if p99 / 1e3 < TARGET_P99_S and not errors else "misses"
    print(f"  target p99 < {TARGET_P99_S * 1e3:.0f} ms with no errors: {verdict}")
    if errors:
        print("  first errors: " + "; ".join(errors[:3]))


def memory_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of process ``pid`` in kB, from /proc/PID/status."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def send_worst(port: int, what) -> tuple[int, str]:
    """One worst request: a GET path, or a search's JSON body (POST /api/search, then polled to its
    end). Returns (status, first bytes of the answer)."""
    base = f"http://{HOST}:{port}"
    if isinstance(what, str):
        try:
            with urllib.request.urlopen(base + what, timeout=600) as r:
                return r.status, r.read(120).decode(errors="replace")
        except urllib.error.HTTPError as err:
            return err.code, err.read(120).decode(errors="replace")
    req = urllib.request.Request(base + "/api/search", data=json.dumps(what).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        job = json.loads(r.read())
    while True:
        with urllib.request.urlopen(f"{base}/api/search/{job['id']}", timeout=60) as r:
            job = json.loads(r.read())
        if job["status"] != "running":
            return 200 if job["status"] == "done" else 422, json.dumps(job.get("error") or {"total": job.get("total")})[:120]
        time.sleep(0.2)


def worst_requests() -> None:
    """Each :data:`WORST` request alone on a fresh server: its time, the server's peak resident
    memory above the resident size it had just before, and the peak of the largest process under
    it (a heavy request's worker process, started by the request)."""
    print("worst allowed requests, each alone on a fresh server (peak resident memory above idle; the largest worker process's peak):")
    for name, what in WORST.items():
        port = free_port()
        server = start_server(port, 1)
        try:
            rss0, _ = memory_kb(server.pid)
            t0 = time.perf_counter()
            status, head = send_worst(port, what)
            seconds = time.perf_counter() - t0
            _, hwm = memory_kb(server.pid)
            workers = [memory_kb(p)[1] for p in descendants(server.pid)[1:]]
        finally:
            server.terminate()
            server.wait(10)
        worker = f", worker peak {max(workers) / 1024:,.0f} MB" if workers else ""
        print(f"  {name}: status {status}, {seconds:.2f} s, +{(hwm - rss0) / 1024:,.0f} MB (peak {hwm / 1024:,.0f} MB){worker}"
              + ("" if status == 200 else f"  {head}"))


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=30.0, help="duration of each mode")
    ap.add_argument("--mode", choices=("all", "both", "repeat", "distinct", "cheap", "contended", "heavy"), default="both")
    ap.add_argument("--workers", type=int, default=1, help="server processes (meshplan serve --workers)")
    a = ap.parse_args()
    if not 1 <= a.clients <= 1000:
        raise SystemExit(f"error: clients: must be 1..1000 (got {a.clients})")
    if not 1 <= a.seconds <= 600:
        raise SystemExit(f"error: seconds: must be 1..600 (got {a.seconds})")
    if not 1 <= a.workers <= 64:
        raise SystemExit(f"error: workers: must be 1..64 (got {a.workers})")
    port = free_port()
    server = start_server(port, a.workers)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"/api/estimate on 127.0.0.1, {a.workers} server process(es), {os.cpu_count()} CPUs shared by server and "
          f"clients, load average {load:.1f} at start, {time.strftime('%Y-%m-%d %H:%M')}")
    try:
        loop_warm = new_event_loop()
        try:
            for _ in range(a.workers):  # each worker process keeps its own cache
                loop_warm.run_until_complete(warm(port))
        finally:
            loop_warm.close()
        modes = {"all": ("repeat", "distinct", "cheap", "contended"), "both": ("repeat", "distinct"),
                 "heavy": ("cheap", "contended")}.get(a.mode, (a.mode,))
        for mode in modes:
            run(mode, port, server, a)
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
    if a.mode in ("all", "heavy"):
        worst_requests()


if __name__ == "__main__":
    main()
