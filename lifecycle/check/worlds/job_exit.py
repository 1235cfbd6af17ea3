"""The job exit's world: a local-universe job that exits, a schedd's job queue that may be
down, a mail server that may refuse, and a worker that may die between any step's end and
its record.

The job runs and asked for mail. The world may then, in any order: exit the job, take the
queue down or bring it back, make the mail server refuse or accept, let time pass (the
steps' retries are 30 s apart), and, once a step gave up, have the operator run
``lifecycle retry``. The invariants are the incident's: the job queue is updated
(committed) at most once per exit, and the mail goes out only after the queue says the job
completed. ``job_exit_without_outbox`` updates a queue elsewhere at once from the step's
handler, as the starter did, instead of committing the update with the step's record.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping
from typing import Any

from ...machines.job_exit import BUILTIN, Settings, make
from ...scenario import Playable
from ..explore import Eventually, Invariant, Machine, Model
from ..memory import COMMITTED, Actions
from ..moves import Action, Create, Fire, Move, Retry, SetWorld
from ..state import View

JOB = "42.0"
DATA = {"cluster": 42, "proc": 0, "owner": "alice", "cmd": "/home/alice/analyse",
        "submit_host": "submit.example.org", "notify_user": "alice@example.org",
        "notification": "Always"}


def setup(resources: int) -> list[Move]:
    return [Create(JOB, data=DATA), SetWorld(JOB, {})]


def actions(view: View) -> Iterator[Action]:
    world = view.world(JOB)
    if view.machine_state(JOB) == "running":
        yield Action("the job exits", (Fire(JOB, "exited", {"exit_code": 0,
                                                            "wall_clock": 60.0}),))
    down = world.get("queue") == "down"
    yield Action("the job queue comes back" if down else "the job queue goes down",
                 (SetWorld(JOB, {**world, "queue": "up" if down else "down"}),))
    if any(effect.failed for effect in view.resource(JOB).effects):
        # fair: an operator looks at a job stuck for good, sooner or later
        yield Action("the operator runs lifecycle retry", (Retry(JOB),), fair=True)
    refusing = world.get("mail") == "refuse"
    yield Action("the mail server accepts again" if refusing else "the mail server refuses",
                 (SetWorld(JOB, {**world, "mail": "accept" if refusing else "refuse"}),))


def _commits(view: View, actions: Actions) -> dict[str, Any]:
    done = sum(1 for name, _, _ in actions if name == COMMITTED)
    return {"commits": view.extra("commits", 0) + done} if done else {}


def _twice(before: View, after: View, actions: Actions) -> str | None:
    if after.extra("commits", 0) > 1:
        return f"job {JOB}'s queue update was committed {after.extra('commits')} times"
    return None


def _early_mail(before: View, after: View, actions: Actions) -> str | None:
    for name, _, _ in actions:
        if name == "mail" and not after.extra("commits", 0):
            return f"the mail for job {JOB} went out before its queue update committed"
    return None


def _without_last(drop: str) -> Any:
    def expect(view: View, before: Actions, hop: Actions) -> list[dict[str, Any]]:
        names = [name for name, key, _ in [*before, *hop] if key == JOB]
        last = len(names) - 1 - names[::-1].index(drop)
        return [{"expect_actions": {"key": JOB, "actions": names[:last] + names[last + 1:]}}]
    return expect


ONCE = Invariant("queue_once", "the job queue is updated at most once per exit", _twice,
                 _without_last(COMMITTED))
MAIL = Invariant("mail_after_queue", "the mail goes out only after the queue update",
                 _early_mail, _without_last("mail"))


class _QueueElsewhere:
    """A job queue updated at once by the step's handler (the starter's way), down while
    the world says so; each update is recorded as committed."""

    def __init__(self, world: Any) -> None:
        self.world = world

    def complete(self, job: Any, ad: Mapping[str, Any], *, key: str, now: dt.datetime) -> None:
        name = f"{job.cluster}.{job.proc}"
        down = self.world.status.get(name, {}).get("queue") == "down"
        self.world.actions.append(("queue", name, {"down": down}))
        if down:
            raise ConnectionError("schedd at <127.0.0.1:9618> does not answer")
        self.world.actions.append((COMMITTED, name, {}))


def _elsewhere(world: Any) -> tuple[Any, Any, Any]:
    assert BUILTIN.simulation is not None
    guards, effects, probes = BUILTIN.simulation(world)
    queued = make(queue=_QueueElsewhere(world), settings=Settings(),  # type: ignore[arg-type]
                  clock=world.clock)
    return guards, {**effects, "update_job_queue": queued.effects["update_job_queue"]}, probes


def without_outbox() -> Playable:
    spec = BUILTIN.spec.model_copy(update={"name": "job_exit_without_outbox"})
    return Machine(spec, BUILTIN.guards, _elsewhere)


FINISHES = Eventually("finishes", "every exit finishes (done)",
                      lambda view: view.machine_state(JOB) != "running",
                      lambda view: view.machine_state(JOB) == "done")


def model(machine: Playable = BUILTIN) -> Model:
    return Model(machine, setup, actions, (ONCE, MAIL), ticks=(30.0,), tally=_commits,
                 eventually=(FINISHES,))


MODELS = {"job_exit": lambda: model(),
          "job_exit_without_outbox": lambda: model(without_outbox())}
