"""``meshplan serve``: run the web explorer (:mod:`meshplan.web`) on this machine with uvicorn. The
web extra is imported only when the command runs, so the CLI works without it."""

from __future__ import annotations

import errno
import importlib.util
import os
import socket
import threading
import webbrowser
from typing import Annotated

import typer

from meshplan.errors import InputError

#: Most server processes ``--workers`` starts.
MAX_WORKERS = 64


def serve(
    host: Annotated[str, typer.Option("--host", help="Address to listen on; 127.0.0.1 keeps the explorer on this machine.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 8765,
    open_browser: Annotated[bool, typer.Option("--open", help="Open the Plan view in the default browser.")] = False,
    workers: Annotated[int, typer.Option("--workers", help="Server processes (each keeps its own estimate cache); one per core to use.")] = 1,
) -> None:
    """Run the web explorer: Plan, Search, Pipeline, Calculators and Learn views over meshplan's JSON API (needs the web extra: pip install 'meshplan\\[web]')."""
    if not host.strip():
        raise InputError("host", "must not be empty (127.0.0.1 keeps the explorer on this machine; 0.0.0.0 listens on every interface)")
    if not 1 <= port <= 65535:
        raise InputError("port", f"must be between 1 and 65535 (got {port})")
    if not 1 <= workers <= MAX_WORKERS:
        raise InputError("workers", f"must be between 1 and {MAX_WORKERS} (got {workers})")
    try:
        import uvicorn

        from meshplan.web import create_app
    except ImportError as err:
        raise InputError("serve", f"needs the web extra ({err.name} is missing): pip install 'meshplan[web]'") from None
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise InputError("host", f"cannot resolve '{host}': {err.strerror or err}") from None
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as err:
        field = "host" if err.errno == errno.EADDRNOTAVAIL else "port"
        reason = os.strerror(err.errno) if err.errno else str(err)
        raise InputError(field, f"cannot listen on {host}:{port}: {reason}") from None
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/plan"
    typer.echo(f"meshplan explorer on {url} (Ctrl+C stops it)")
    if workers > 1:
        typer.echo(f"{workers} server processes: estimates, calculators and pipelines scale with them; a search's progress "
                   "lives in the process that runs it, so the Search view needs --workers 1")
    if open_browser:
        threading.Timer(1.0, webbrowser.open, args=(url,)).start()
    # httptools and uvloop (uvicorn[standard]) parse and loop in C; no access log on the hot path
    fast = {"http": "httptools" if _has("httptools") else "h11", "loop": "uvloop" if _has("uvloop") else "asyncio"}
    if workers == 1:
        uvicorn.run(create_app(), host=host, port=port, log_level="warning", access_log=False, **fast)
    else:  # worker processes import the factory by name
        uvicorn.run("meshplan.web:create_app", factory=True, workers=workers, host=host, port=port, log_level="warning",
                    access_log=False, **fast)


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
