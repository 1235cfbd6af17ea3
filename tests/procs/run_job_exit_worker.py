"""Worker processes for the job_exit tests: python run_job_exit_worker.py KIND URL [ARGS...].

- ``crash-loop URL CRASH_LOG PROBABILITY SMTP_URL PARALLEL TIMEOUT``: fork PARALLEL workers
  at a time, each killing itself with SIGKILL at random crash points, and fork new ones as
  they die, until the outbox is empty; print a JSON summary. Forking from this process, which
  has imported everything once, makes a restart cost milliseconds instead of a Python start.
- ``hang URL HANG_FILE``: work until a signal, the job queue blocking while HANG_FILE exists.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path

# tests/ on the path, as pytest puts it there: `procs` is this folder (a package named
# `tests`, which some installed distributions ship, cannot shadow it)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lifecycle import Engine, Store, Worker
from lifecycle.outbox_admin import outbox_counts
from procs import job_exit_faults


def _idle(url: str) -> bool:
    store = Store(url)
    try:
        left = outbox_counts(Engine(store))
    finally:
        store.dispose()  # no connection may cross a fork
    return not left.get("pending") and not left.get("running")


def _child(url: str, crash_log: Path, run: int, probability: float, smtp_url: str) -> None:
    engine = job_exit_faults.crash_engine(url, crash_log, run, probability, smtp_url)
    # one effect claimed and run at a time: a live worker never holds a claim it is not
    # working on, so it never loses one, and every repeated effect is a crash's doing
    Worker(engine, lease=1.0, concurrency=1, batch=1, poll=0.02, seed=run).run_until_idle()


def crash_loop(url: str, crash_log: Path, probability: float, smtp_url: str, parallel: int,
               timeout: float) -> None:
    started = time.monotonic()
    children: dict[int, int] = {}
    runs = crashes = 0
    quiet_until = 0.0
    draining = False
    while True:
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            run = children.pop(pid)
            if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
                crashes += 1
            elif os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                quiet_until = time.monotonic() + 0.1  # idle for now: effects back off
            else:
                raise SystemExit(f"worker run {run} ended with status {status}")
        if not draining and _idle(url):
            draining = True
        if draining and not children:
            break
        if time.monotonic() - started > timeout:
            raise SystemExit(f"not idle after {timeout:g} s ({runs} runs, {crashes} crashes)")
        while not draining and len(children) < parallel and time.monotonic() >= quiet_until:
            runs += 1
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    _child(url, crash_log, runs, probability, smtp_url)
                except BaseException:
                    traceback.print_exc()
                    code = 1
                sys.stderr.flush()
                os._exit(code)
            children[pid] = runs
        time.sleep(0.02)
    print(json.dumps({"runs": runs, "crashes": crashes,
                      "seconds": round(time.monotonic() - started, 1)}), flush=True)


def main() -> None:
    kind, url = sys.argv[1], sys.argv[2]
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    if kind == "crash-loop":
        crash_loop(url, Path(sys.argv[3]), float(sys.argv[4]), sys.argv[5], int(sys.argv[6]),
                   float(sys.argv[7]))
    elif kind == "hang":
        engine = job_exit_faults.hang_engine(url, Path(sys.argv[3]))
        print("ready", flush=True)
        Worker(engine, poll=0.05, name="hanging-queue-worker").run(handle_signals=True)
    else:
        raise SystemExit(f"unknown worker kind {kind!r}")


if __name__ == "__main__":
    main()
