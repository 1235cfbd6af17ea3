"""``batch_job``: the tutorial machine. A batch job is queued, runs (starting, then
executing), and ends succeeded or failed; it can be held and released a bounded number of
times. It shows nested states, guards on data and payload, an unless guard and an eventless
transition."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from ..compiled import GuardContext
from ..spec import MachineSpec
from .builtin import Builtin


class BatchJobData(BaseModel):
    model_config = ConfigDict(extra="allow")

    owner: str = "nobody"
    cmd: str = "/bin/true"
    holds: int = 0
    max_holds: int = 3
    exit_code: int | None = None


SPEC = MachineSpec.model_validate({
    "name": "batch_job",
    "description": "A batch job: queued, running (starting, executing), then succeeded or "
                   "failed; held jobs are released while they have holds left.",
    "initial": "queued",
    "final": ["succeeded", "failed"],
    "states": [
        "queued",
        {"name": "running", "initial": "starting", "states": ["starting", "executing"]},
        "held",
        "succeeded",
        "failed",
    ],
    "transitions": [
        {"trigger": "start", "source": "queued", "dest": "running",
         "description": "a slot was matched; the starter begins"},
        {"trigger": "executing", "source": "running.starting", "dest": "running.executing",
         "description": "the job's process is running"},
        {"trigger": "exit", "source": "running.executing", "dest": "succeeded",
         "guards": ["exit_ok"], "description": "the process exited with code 0"},
        {"trigger": "exit", "source": "running.executing", "dest": "failed",
         "unless": ["exit_ok"], "description": "the process exited with another code"},
        {"trigger": "hold", "source": ["queued", "running"], "dest": "held",
         "description": "an operator or a policy holds the job"},
        {"trigger": "release", "source": "held", "dest": "queued", "guards": ["holds_left"],
         "description": "released, if it has not been held too often"},
        {"trigger": "remove", "source": ["queued", "held"], "dest": "failed",
         "description": "removed before it could finish"},
    ],
    "eventless": [
        {"source": "held", "dest": "failed", "unless": ["holds_left"],
         "description": "held too often: give up"},
    ],
    "data_model": BatchJobData,
})


def exit_ok(context: GuardContext) -> bool:
    return bool(context.payload.get("exit_code", context.data.get("exit_code")) == 0)


def holds_left(context: GuardContext) -> bool:
    return int(context.data.get("holds", 0)) < int(context.data.get("max_holds", 3))


BUILTIN = Builtin(
    spec=SPEC,
    guards={"exit_ok": exit_ok, "holds_left": holds_left},
    summary="tutorial: a batch job with nested running states, guards and an eventless edge",
)
