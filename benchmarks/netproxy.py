"""A latency-injecting TCP proxy: a network between the client and PostgreSQL, for section 15.

``python -m benchmarks.netproxy --delay-ms D`` listens on a free port of 127.0.0.1, prints it,
and forwards every connection to the upstream server (127.0.0.1:5432), both ways, holding
each chunk on its way to the server for ``D`` ms (in order). It counts the client's round
trips: a burst of client→server chunks that follows an answer from the server (or opens the
connection) is one. Each line ``count`` on its standard input is answered with the total on
its standard output, and ``delay D`` sets the delay for what is sent from then on (answered
``ok``); it exits when its standard input closes, so it never outlives the run.

It runs as a process of its own, so that its CPU is not the client's, on an event loop whose
selector sleeps with microsecond resolution (epoll's is a millisecond).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import selectors
import subprocess
import sys
from pathlib import Path
from typing import Any


class Counts:
    round_trips = 0
    delay = 0.0  # seconds


class Proxy:
    """This proxy, as a process of its own, in front of the server of ``url`` (a SQLAlchemy
    URL): ``url`` is the same through it; :meth:`round_trips` the count so far. The
    benchmarks' network section and the tests that count round trips both use it."""

    def __init__(self, url: str, delay_ms: float = 0.0) -> None:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.netproxy", "--delay-ms", str(delay_ms),
             "--upstream", f"{parsed.host or '127.0.0.1'}:{parsed.port or 5432}"],
            cwd=Path(__file__).resolve().parents[1], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.strip().isdigit():
            self.close()
            raise RuntimeError(f"the proxy did not start (it said {line!r})")
        self.port = int(line)
        self.url = parsed.set(host="127.0.0.1", port=self.port).render_as_string(
            hide_password=False)

    def round_trips(self) -> int:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(b"count\n")
        self.process.stdin.flush()
        return int(self.process.stdout.readline())

    def set_delay(self, delay_ms: float) -> None:
        """Hold what the clients send from now on for ``delay_ms`` ms (what is already held
        keeps its time)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"delay {delay_ms}\n".encode())
        self.process.stdin.flush()
        if self.process.stdout.readline().strip() != b"ok":
            raise RuntimeError("the proxy did not take the new delay")

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


async def _pipe(connection: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                upstream: tuple[str, int], counts: Counts) -> None:
    reader, writer = connection
    up_reader, up_writer = await asyncio.open_connection(*upstream)
    loop = asyncio.get_running_loop()
    turn = {"client": False}  # whether the client has spoken since the server last did
    held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await held.get()
            if not data:
                up_writer.close()
                return
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            up_writer.write(data)
            await up_writer.drain()

    async def to_server() -> None:
        while data := await reader.read(65536):
            if not turn["client"]:
                turn["client"] = True
                counts.round_trips += 1
            held.put_nowait((loop.time() + counts.delay, data))
        held.put_nowait((0.0, b""))

    async def to_client() -> None:
        while data := await up_reader.read(65536):
            turn["client"] = False
            writer.write(data)
            await writer.drain()
        writer.close()

    with contextlib.suppress(asyncio.CancelledError):  # the proxy closing: the client is done
        await asyncio.gather(to_server(), deliver(), to_client(), return_exceptions=True)
    writer.close()
    up_writer.close()


async def _main(delay_ms: float, upstream: tuple[str, int]) -> None:
    counts = Counts()
    counts.delay = delay_ms / 1000
    server = await asyncio.start_server(
        lambda r, w: _pipe((r, w), upstream, counts), "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    loop = asyncio.get_running_loop()
    control = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(control), sys.stdin)
    while command := (await control.readline()).split():
        if command == [b"count"]:
            print(counts.round_trips, flush=True)
        elif command[0] == b"delay" and len(command) == 2:
            counts.delay = float(command[1]) / 1000
            print("ok", flush=True)
        else:
            break
    server.close()
    pipes = asyncio.all_tasks() - {asyncio.current_task()}
    for task in pipes:
        task.cancel()
    await asyncio.gather(*pipes, return_exceptions=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.netproxy")
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--upstream", default="127.0.0.1:5432")
    args = parser.parse_args(argv)
    host, port = args.upstream.rsplit(":", 1)
    loop: Any = asyncio.SelectorEventLoop(selectors.SelectSelector())
    try:
        loop.run_until_complete(_main(args.delay_ms, (host, int(port))))
    finally:
        loop.close()


if __name__ == "__main__":
    main()
