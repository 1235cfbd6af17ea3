"""What the startd machine talks to: the job hooks it runs (``FETCH_WORK``,
``REPLY_FETCH``, ``EVICT_CLAIM``), the collector it publishes slot ads to and the schedds it
tells that a claim is gone.

Hooks are executables named in the startd's configuration as HTCondor names them,
``<KEYWORD>_HOOK_FETCH_WORK`` and so on, the keyword being the slot's. They are given ads on
stdin in the old ClassAd syntax, as ``StartdHookMgr`` writes them (for REPLY_FETCH and
EVICT_CLAIM: the job ad, a ``-----`` line, the slot ad and the ``ClaimId``), and are given up
after ``timeout`` seconds. FETCH_WORK's output is one job ad in the old syntax, read by
``classad2`` one line at a time: empty output means no work; a line that is not one
attribute abandons the fetch (:class:`HookFailed`, which the caller logs).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..logs import logger
from .htcondor import classads, old_syntax

log = logger(__name__)

FETCH_WORK, REPLY_FETCH, EVICT_CLAIM = "FETCH_WORK", "REPLY_FETCH", "EVICT_CLAIM"
HOOKS = (FETCH_WORK, REPLY_FETCH, EVICT_CLAIM)
_MAX_OUTPUT = 1 << 20


class HookFailed(Exception):
    """A hook that could not be run, ran out of time, failed, or printed what is not an
    ad; the message says which hook of which keyword, and how."""


class UnreadableOutput(HookFailed):
    """FETCH_WORK printed a line that is not a ClassAd attribute: the startd drops the
    reply and ends the fetch without judging it (``FetchClient::hookExited``), so an idle
    fetch claim is not evicted for it, as it is for no work."""


def _json_value(value: Any) -> Any:
    classad2 = classads()
    if classad2 is not None and isinstance(value, classad2.ExprTree):
        return str(value)  # an expression is kept as its text
    if classad2 is not None and isinstance(value, classad2.Value):
        return None
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    return value


def parse_job_ad(text: str) -> dict[str, Any] | None:
    """FETCH_WORK's output as a job ad: None for empty output (no work). Every non-blank
    line must be one attribute in the old syntax, read by ``classad2``; otherwise
    :class:`HookFailed` names the line."""
    classad2 = classads()
    if classad2 is None:
        raise HookFailed("reading FETCH_WORK's output needs HTCondor's ClassAd library: "
                         "pip install 'lifecycle-fsm[htcondor]'")
    ad: dict[str, Any] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            parsed = classad2.parseOne(line, classad2.ParserType.Old)
        except Exception as exc:  # classad2's ClassAdException
            raise HookFailed(f"line {number} is not a ClassAd attribute ({exc}): "
                             f"{line[:80]!r}") from None
        if len(parsed) != 1:
            raise HookFailed(f"line {number} is not one ClassAd attribute: {line[:80]!r}")
        (name, value), = parsed.items()
        ad[str(name)] = _json_value(value)
    return ad or None


@dataclass
class Hooks:
    """The startd's job hooks: ``config`` maps ``<KEYWORD>_HOOK_<NAME>`` to an executable."""

    config: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 30.0

    def path(self, keyword: str, hook: str) -> str | None:
        return self.config.get(f"{keyword}_HOOK_{hook}")

    def run(self, keyword: str, hook: str, stdin: str, args: Sequence[str] = ()) -> str:
        """Run one hook and return what it printed; :class:`HookFailed` otherwise."""
        where = f"{keyword}_HOOK_{hook}"
        path = self.path(keyword, hook)
        if path is None:
            raise HookFailed(f"{where} is not configured")
        try:
            # a session of its own, so that a timeout kills what the hook started too
            process = subprocess.Popen([path, *args], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       start_new_session=True)
        except OSError as exc:
            raise HookFailed(f"{where} ({path}) could not be run: {exc.strerror}") from None
        try:
            out, err, ending = _bounded(process, stdin.encode(), self.timeout, _MAX_OUTPUT)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)   # and what it started, if any
            process.wait()
        if ending == "timeout":
            raise HookFailed(f"{where} ({path}) did not finish within {self.timeout:g} s "
                             "and was killed")
        if ending == "too much":
            raise HookFailed(f"{where} ({path}) printed more than {_MAX_OUTPUT} bytes and "
                             "was killed")
        if process.returncode != 0:
            lines = err.decode("utf-8", "replace").strip().splitlines()
            raise HookFailed(f"{where} ({path}) exited with status {process.returncode}"
                             + (f": {lines[-1][:200]}" if lines else ""))
        return out.decode("utf-8", "replace")

    def fetch_work(self, keyword: str, slot_ad: Mapping[str, Any]) -> dict[str, Any] | None:
        """A job ad, or None when the hook has no work."""
        text = self.run(keyword, FETCH_WORK, old_syntax(slot_ad))
        try:
            return parse_job_ad(text)
        except HookFailed as exc:
            raise UnreadableOutput(f"{keyword}_HOOK_{FETCH_WORK} printed what is not a job "
                                   f"ad: {exc}") from None

    def reply_fetch(self, keyword: str, accepted: bool, job_ad: Mapping[str, Any],
                    slot_ad: Mapping[str, Any], claim_id: str | None) -> None:
        """REPLY_FETCH with ``accept`` or ``reject``: the job ad, ``-----``, the slot ad, and
        on accept only, the ``ClaimId`` (``claim_id``; a rejection is given none)."""
        if self.path(keyword, REPLY_FETCH) is None:
            return  # REPLY_FETCH is optional
        self.run(keyword, REPLY_FETCH,
                 _job_and_slot(job_ad, slot_ad, claim_id if accepted else None),
                 ["accept" if accepted else "reject"])

    def evict_claim(self, keyword: str, job_ad: Mapping[str, Any],
                    slot_ad: Mapping[str, Any], claim_id: str) -> None:
        if self.path(keyword, EVICT_CLAIM) is None:
            return
        self.run(keyword, EVICT_CLAIM, _job_and_slot(job_ad, slot_ad, claim_id))


def _bounded(process: subprocess.Popen[bytes], stdin: bytes, timeout: float,
             limit: int) -> tuple[bytes, bytes, str]:
    """Feed ``stdin`` and read stdout and stderr as they come, until both end ("done"),
    ``timeout`` seconds pass ("timeout") or stdout passes ``limit`` bytes ("too much"):
    what was read (stderr's last ``limit`` bytes at most) and how it ended. Memory stays
    within the limit whatever the hook prints."""
    assert process.stdin and process.stdout and process.stderr
    writer = threading.Thread(target=_feed, args=(process.stdin, stdin), daemon=True)
    writer.start()
    deadline = time.monotonic() + timeout
    out, err = bytearray(), bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ, out)
        selector.register(process.stderr, selectors.EVENT_READ, err)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(out), bytes(err), "timeout"
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                key.data.extend(chunk)
                if key.data is out and len(out) > limit:
                    return bytes(out[:limit]), bytes(err), "too much"
                if key.data is err and len(err) > limit:
                    del err[:len(err) - limit]
    left = deadline - time.monotonic()
    try:
        process.wait(max(left, 0.0))
    except subprocess.TimeoutExpired:   # its output closed, but it runs on
        return bytes(out), bytes(err), "timeout"
    return bytes(out), bytes(err), "done"


def _feed(pipe: Any, data: bytes) -> None:
    """Write a hook's stdin, then close it (a hook that exits unread is no error)."""
    with contextlib.suppress(BrokenPipeError, OSError):
        pipe.write(data)
    with contextlib.suppress(BrokenPipeError, OSError):
        pipe.close()


def _job_and_slot(job_ad: Mapping[str, Any], slot_ad: Mapping[str, Any],
                  claim_id: str | None) -> str:
    # as StartdHookMgr writes it: the job ad, "-----", the slot ad, then the ClaimId when
    # there is one to give
    return (old_syntax(job_ad) + "-----\n" + old_syntax(slot_ad)
            + (f'ClaimId = "{claim_id}"\n' if claim_id is not None else ""))


class Collector(Protocol):
    def publish(self, slot: str, ad: Mapping[str, Any]) -> None:
        """Advertise ``slot``'s ad (with its private ``ClaimId``)."""


class Schedd(Protocol):
    def release_claim(self, requester: str, claim_id: str) -> None:
        """RELEASE_CLAIM: tell the schedd ``requester`` that the claim is gone."""


@dataclass
class RecordingCollector:
    """A collector that keeps every ad published, with when (the caller's clock)."""

    ads: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def publish(self, slot: str, ad: Mapping[str, Any]) -> None:
        self.ads.append((slot, dict(ad)))


@dataclass
class RecordingSchedds:
    """Schedds that keep every RELEASE_CLAIM they were sent."""

    released: list[tuple[str, str]] = field(default_factory=list)

    def release_claim(self, requester: str, claim_id: str) -> None:
        self.released.append((requester, claim_id))


__all__ = ["EVICT_CLAIM", "FETCH_WORK", "HOOKS", "REPLY_FETCH", "Collector", "HookFailed",
           "Hooks", "RecordingCollector", "RecordingSchedds", "Schedd", "UnreadableOutput",
           "old_syntax", "parse_job_ad"]
