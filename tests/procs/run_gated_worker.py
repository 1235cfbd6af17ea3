"""A worker process of the gated machine (tests/procs/gated.py) for the claim tests:
python run_gated_worker.py sync|async URL LEASE CONCURRENCY BATCH [CLOCK]. It says ``pid N``
first on stdout (started through the session's fork server, its pid is not its client's: the
tests stop and kill that one), logs lifecycle's INFO lines to stderr (the tests read them)
and stops on SIGTERM. With CLOCK (a file) its time is a JumpClock of that file, which the
test moves."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lifecycle import AsyncWorker, Engine, Store, Worker
from lifecycle.spec import load_spec
from procs import gated
from procs.jump_clock import JumpClock


def main() -> None:
    print(f"pid {os.getpid()}", flush=True)
    kind, url = sys.argv[1], sys.argv[2]
    lease, concurrency, batch = float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger("lifecycle").setLevel(logging.INFO)
    clock = JumpClock(sys.argv[6]) if len(sys.argv) > 6 else None
    engine = Engine(Store(url), [load_spec(gated.SPEC)], effects=gated.effects, clock=clock)
    options = {"lease": lease, "concurrency": concurrency, "batch": batch, "poll": 0.05,
               "name": f"paused-{kind}"}
    try:
        if kind == "sync":
            Worker(engine, **options).run(handle_signals=True)
        else:
            asyncio.run(AsyncWorker(engine, **options).run(handle_signals=True))
    finally:
        engine.store.dispose()


if __name__ == "__main__":
    main()
