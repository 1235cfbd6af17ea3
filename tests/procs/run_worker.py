"""A worker process for the effect tests: python run_worker.py KIND URL [ARGS...]."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
import traceback
from pathlib import Path

from lifecycle import AsyncWorker, Worker
from lifecycle.outbox_admin import outbox_counts

# tests/ on the path, as pytest puts it there: `procs` is this folder (a package named
# `tests`, which some installed distributions ship, cannot shadow it)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from procs import machines
from procs.crash_loop import crash_loop


def _ticker(url: str, table: str, name: str, gate: Path | None, workers: int) -> None:
    """One ticker worker (a forked child: its engine and connections are its own), working
    until the outbox is empty; with ``gate``, it starts when all ``workers`` have started."""
    engine = machines.ticker_engine(url, table, name)
    worker = Worker(engine, concurrency=1, name=name)
    if gate is not None:
        (gate / f"{name}.ready").touch()
        deadline = time.monotonic() + 300
        while len(list(gate.glob("*.ready"))) < workers:
            if time.monotonic() > deadline:
                raise SystemExit(f"{name}: the other workers never started")
            time.sleep(0.01)
    while True:  # until the outbox is empty: effects behind another worker's come due
        before = worker.stats.done
        worker.run_until_idle()
        left = outbox_counts(engine)
        if not left.get("pending") and not left.get("running"):
            break
        if worker.stats.done == before:
            time.sleep(0.005)


def main() -> None:
    kind, url = sys.argv[1], sys.argv[2]
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if kind == "exit":  # exit URL LOGS PROBABILITY: runs that crash, one at a time, until idle
        logs, probability = Path(sys.argv[3]), float(sys.argv[4])

        def run(seed: int) -> None:
            engine = machines.exit_engine(url, logs, machines.Crasher(seed, probability))
            Worker(engine, lease=0.5, concurrency=2, seed=seed).run_until_idle()

        crash_loop(url, run, parallel=1, timeout=240)
    elif kind == "tickers":  # tickers URL TABLE WORKERS [GATE]: w0, w1, ... forked at once
        table, workers = sys.argv[3], int(sys.argv[4])
        gate = Path(sys.argv[5]) if len(sys.argv) > 5 else None
        children = []
        for index in range(workers):
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    _ticker(url, table, f"w{index}", gate, workers)
                    code = 0
                except BaseException:
                    traceback.print_exc()
                sys.stderr.flush()
                os._exit(code)
            children.append(pid)
        failed = [pid for pid in children if os.waitpid(pid, 0)[1] != 0]
        if failed:
            raise SystemExit(f"{len(failed)} of {workers} ticker workers failed")
    elif kind in ("slow", "slow-async"):  # the thread driver, or the asyncio one
        marker = Path(sys.argv[3])
        engine = machines.slow_engine(url, marker)
        logging.getLogger("lifecycle").setLevel(logging.INFO)  # the tests read its log
        print("ready", flush=True)
        if kind == "slow":
            Worker(engine, poll=0.05, name="slow-worker").run(handle_signals=True)
        else:
            aio = AsyncWorker(engine, poll=0.05, name="slow-worker")
            asyncio.run(aio.run(handle_signals=True))
    else:
        raise SystemExit(f"unknown worker kind {kind!r}")


if __name__ == "__main__":
    main()
