"""`lifecycle serve`: a port already taken is one error line and exit 1, with no claim to
be serving; /metrics answers in the format the scraper asks for, Prometheus' text format
0.0.4 unless it asks for OpenMetrics."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("uvicorn")
import httpx


@pytest.fixture
def lifecycle_cmd(forkserver: Any) -> list[str]:
    """`python -m lifecycle`, started warm (tests/zygote.py): each command here ends by
    itself, or by the SIGTERM its client passes on."""
    return forkserver.python("-m", "lifecycle")  # type: ignore[no-any-return]


def test_a_busy_port_is_one_error_line_and_exit_1(sqlite_url: str,
                                                  lifecycle_cmd: list[str]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = subprocess.run([*lifecycle_cmd, "serve", "--port", str(port), "--db", sqlite_url],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done
    assert done.stdout == ""                              # never said it was serving
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use"), lines


def test_metrics_in_the_format_the_scraper_asks_for(sqlite_url: str, tmp_path: Path,
                                                    lifecycle_cmd: list[str]) -> None:
    server = subprocess.Popen([*lifecycle_cmd, "serve", "--port", "0", "--db", sqlite_url],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()                   # the address, port 0 resolved
        base = line.strip().rsplit(" ", 1)[1].rstrip("/")
        assert not base.endswith(":0"), line
        deadline = time.monotonic() + 60
        while True:
            try:
                plain = httpx.get(f"{base}/metrics", timeout=10)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and server.poll() is None
                time.sleep(0.05)
        assert plain.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert "lifecycle_database_up 1.0" in plain.text
        open_metrics = httpx.get(f"{base}/metrics", timeout=10, headers={
            "Accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"})
        assert open_metrics.headers["content-type"].startswith("application/openmetrics-text")
        assert open_metrics.text.rstrip().endswith("# EOF")
    finally:
        server.terminate()
        server.wait(timeout=60)
