"""The dashboard served by a real uvicorn on a free loopback port, in a thread of the test:
started once it answers, stopped (and its connections closed) when the test is done."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn

from lifecycle.clock import Clock
from lifecycle.dashboard.app import create_app

START_SECONDS = 60.0


@contextmanager
def served(url: str, clock: Clock | None = None) -> Iterator[str]:
    """The base URL (``http://127.0.0.1:PORT``) of the dashboard of ``url``."""
    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listening.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{listening.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(create_app(url, clock=clock), log_level="warning",
                                           timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]},
                              name="dashboard", daemon=True)
    thread.start()
    try:
        _wait_for(base, server, thread)
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        listening.close()
        assert not thread.is_alive(), "the dashboard's server did not stop"


def _wait_for(base: str, server: uvicorn.Server, thread: threading.Thread) -> None:
    """Until the server has started and answers a request (or died, or a minute passed)."""
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if not thread.is_alive():
            raise RuntimeError("the dashboard's server stopped while starting")
        if server.started:
            try:
                httpx.get(f"{base}/metrics", timeout=10).raise_for_status()
                return
            except httpx.TransportError:
                pass
        time.sleep(0.01)
    raise RuntimeError(f"the dashboard did not answer at {base} within {START_SECONDS} s")
