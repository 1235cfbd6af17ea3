"""Run a command while every core is kept busy: ``python tests/under_load.py CMD...``.

The suite must pass on a loaded machine as on an idle one (no test may depend on wall-clock
speed); ``make test-loaded`` proves it by running the whole suite beside one CPU burner per
core. The burners are ordinary processes at the same priority as the tests, and they end
with the command, whatever becomes of it."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys


def burn() -> None:
    while True:
        pass


def main() -> int:
    command = sys.argv[1:]
    if not command:
        raise SystemExit(__doc__)
    burners = [multiprocessing.Process(target=burn, daemon=True)
               for _ in range(os.cpu_count() or 2)]
    for burner in burners:
        burner.start()
    print(f"under load: {len(burners)} CPU burners beside `{' '.join(command)}`", flush=True)
    try:
        return subprocess.call(command)
    finally:
        for burner in burners:
            burner.terminate()
        for burner in burners:
            burner.join()


if __name__ == "__main__":
    sys.exit(main())
