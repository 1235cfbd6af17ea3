"""Worker runs that kill themselves, restarted until the outbox is empty, for the crash tests'
subprocess runners (``run_worker.py exit``, ``run_job_exit_worker.py crash-loop``).

Each run is a child forked from the runner, which has imported everything once: a restart
costs milliseconds instead of a Python start, and each run is still a process of its own
with connections of its own (none may cross a fork: the runner holds none while it forks).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable

from lifecycle import Engine, Store
from lifecycle.outbox_admin import outbox_counts


def idle(url: str) -> bool:
    """Whether the outbox of ``url`` holds nothing pending or running, asked by a child of
    its own: this process opens no database, so none of SQLite's state crosses a fork."""
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            store = Store(url)
            left = outbox_counts(Engine(store))
            store.dispose()
            code = 0 if not left.get("pending") and not left.get("running") else 3
        except BaseException:
            traceback.print_exc()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) not in (0, 3):
        raise SystemExit(f"the look at the outbox ended with status {status}")
    return os.WEXITSTATUS(status) == 0


def crash_loop(url: str, child: Callable[[int], None], parallel: int, timeout: float) -> None:
    """Fork ``parallel`` children at a time, each running ``child(run)`` (run = 1, 2, ...), and
    fork new ones as they end, until the outbox of ``url`` is empty; then print a JSON
    summary: the runs, how many were killed with SIGKILL, the seconds. A child that ends any
    other way than by exit code 0 or SIGKILL ends the loop with an error."""
    started = time.monotonic()
    Store(url, check=False).dispose()  # compiles the store's statements (connecting to
    children: dict[int, int] = {}      # nothing) once, for every run to inherit
    runs = crashes = 0
    quiet_until = 0.0
    draining = False
    ended = True  # the outbox is looked at first, then only when a run ended: only a run
    while True:  # empties it
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            ended = True
            run = children.pop(pid)
            if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
                crashes += 1
            elif os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                quiet_until = time.monotonic() + 0.1  # idle for now: effects back off
            else:
                raise SystemExit(f"worker run {run} ended with status {status}")
        if ended and not draining:
            draining, ended = idle(url), False
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
                    child(runs)
                except BaseException:
                    traceback.print_exc()
                    code = 1
                sys.stderr.flush()
                os._exit(code)
            children[pid] = runs
        time.sleep(0.02)
    print(json.dumps({"runs": runs, "crashes": crashes,
                      "seconds": round(time.monotonic() - started, 1)}), flush=True)
