"""A TARDIS executor for a COBalD daemon on the test's Slurm: TARDIS's ShellExecutor, except
that the first job it is asked to hold (``scontrol hold ID``, the first step of the fenced
terminate) is released first and left to start: the job starts between the drone's last
status and its removal. The job's id is then written to ``marker``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from tardis.utilities.executors.shellexecutor import ShellExecutor  # type: ignore[import-untyped]


class StartsFirst:
    def __init__(self, marker: str) -> None:
        self.shell = ShellExecutor()
        self.marker = Path(marker)
        self.done = False

    async def run_command(self, command: str, stdin_input: str | None = None) -> Any:
        if not self.done and command.startswith("scontrol hold "):
            self.done = True
            job = command.split()[-1]
            await self.shell.run_command(f"scontrol release {job}")
            deadline = time.monotonic() + 60
            while (await self.shell.run_command(
                    f"squeue -h -t all -o %T --job={job}")).stdout.strip() != "RUNNING":
                assert time.monotonic() < deadline, f"job {job} did not start"
                await asyncio.sleep(0.05)
            self.marker.write_text(job)
        return await self.shell.run_command(command, stdin_input)
