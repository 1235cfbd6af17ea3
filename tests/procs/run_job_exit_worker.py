"""Worker processes for the job_exit tests: python run_job_exit_worker.py KIND URL [ARGS...].

- ``crash-loop URL CRASH_LOG PROBABILITY SMTP_URL PARALLEL TIMEOUT``: fork PARALLEL workers
  at a time, each killing itself with SIGKILL at random crash points, and fork new ones as
  they die, until the outbox is empty; print a JSON summary (``procs.crash_loop``).
- ``hang URL HANG_FILE``: work until a signal, the job queue blocking while HANG_FILE exists
  (it creates HANG_FILE.hanging when it blocks); lifecycle's INFO lines on stderr.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

# tests/ on the path, as pytest puts it there: `procs` is this folder (a package named
# `tests`, which some installed distributions ship, cannot shadow it)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lifecycle import Worker
from procs import job_exit_faults
from procs.crash_loop import crash_loop


def _child(url: str, crash_log: Path, run: int, probability: float, smtp_url: str) -> None:
    engine = job_exit_faults.crash_engine(url, crash_log, run, probability, smtp_url)
    # one effect claimed and run at a time: a live worker never holds a claim it is not
    # working on, so it never loses one, and every repeated effect is a crash's doing
    Worker(engine, lease=1.0, concurrency=1, batch=1, poll=0.02, seed=run).run_until_idle()


def main() -> None:
    kind, url = sys.argv[1], sys.argv[2]
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    if kind == "crash-loop":
        crash_log, probability, smtp_url = Path(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
        crash_loop(url, lambda run: _child(url, crash_log, run, probability, smtp_url),
                   parallel=int(sys.argv[6]), timeout=float(sys.argv[7]))
    elif kind == "hang":
        engine = job_exit_faults.hang_engine(url, Path(sys.argv[3]))
        logging.getLogger("lifecycle").setLevel(logging.INFO)  # the test reads its log
        print("ready", flush=True)
        Worker(engine, poll=0.05, name="hanging-queue-worker").run(handle_signals=True)
    else:
        raise SystemExit(f"unknown worker kind {kind!r}")


if __name__ == "__main__":
    main()
