"""The built-in ``job_exit`` machine: an HTCondor local-universe job exit whose four steps
(user log, output ad, job queue, email) happen exactly as promised across failures and
crashes. What it writes is read back with the real HTCondor bindings (``htcondor2``,
``classad2``); its mail is received by a real SMTP server (``aiosmtpd``) on loopback."""

from __future__ import annotations

import ctypes
import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import classad2
import htcondor2
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from procs.job_exit_faults import FaultyQueue, RecordingMailer
from procs.mail_sink import MailSink
from waiting import read_until

from lifecycle import (
    Effect,
    Engine,
    LifecycleError,
    Retry,
    SimulatedClock,
    Store,
    Worker,
    file_writes,
)
from lifecycle.adapters import htcondor, smtp
from lifecycle.adapters.htcondor import JobId
from lifecycle.adapters.job_queue import (
    DatabaseJobQueue,
    JobQueue,
    queue_ad,
    record_completion,
    submit,
)
from lifecycle.cli import main
from lifecycle.compiled import GuardContext
from lifecycle.errors import GuardError, InvalidData
from lifecycle.machines import builtins, job_exit
from lifecycle.outbox_admin import effect_records, outbox_counts, retry_failed

EXITED_AT = dt.datetime(2026, 12, 2, 10, 1, 0, tzinfo=dt.UTC)
FAST = Retry(max_attempts=None, base=0.05, cap=0.2, jitter=0.5)
SCRIPT = str(Path(__file__).parent / "procs" / "run_job_exit_worker.py")


@pytest.fixture
def worker_cmd(forkserver: Any) -> list[str]:
    """`python procs/run_job_exit_worker.py`, started warm (tests/zygote.py): each run here
    ends by itself (the crash loop's own forks kill themselves) or by the SIGTERM its client
    passes on."""
    return forkserver.python(SCRIPT)  # type: ignore[no-any-return]
TRIGGERS = ["exited", "userlog_written", "output_ad_written", "queue_updated", "email_sent"]


@pytest.fixture
def clock() -> SimulatedClock:
    return SimulatedClock("2026-12-02T10:00:00Z")


def make_engine(store: Store, clock: SimulatedClock | None = None, *,
                queue: JobQueue | None = None, mailer: Any = None, retry: Retry | None = None,
                timeout: float | None = 30.0) -> Engine:
    machine = job_exit.make(queue=queue, mailer=mailer or RecordingMailer(), retry=retry,
                            timeout=timeout, clock=clock)
    return Engine(store, [machine.spec], guards=machine.guards, effects=machine.effects,
                  clock=clock)


def job(cluster: int, proc: int, where: Path, **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "cluster": cluster, "proc": proc, "owner": "alice", "cmd": "/home/alice/analyse",
        "submit_host": "submit.example.org", "userlog": str(where / f"{cluster}.log"),
        "output_ad": str(where / f"{cluster}.{proc}.ad"), "notification": "Never"}
    data.update(overrides)
    return data


def exit_payload(**overrides: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "exit_code": 3, "remote_user_cpu": 61.5, "remote_sys_cpu": 2.25, "wall_clock": 3725.0,
        "image_size": 204800, "exited_at": EXITED_AT.isoformat()}
    payload.update(overrides)
    return {k: v for k, v in payload.items() if v is not None}


def events(path: Path) -> list[Any]:
    return list(htcondor2.JobEventLog(str(path)).events(stop_after=0))


def expected_ad(data: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    """The final ad as HTCondor's starter and schedd leave it, with the real ad's types."""
    when = int(dt.datetime.fromisoformat(payload["exited_at"]).timestamp())
    ad: dict[str, Any] = {**data.get("ad", {}),
        "ClusterId": data["cluster"], "ProcId": data["proc"], "Owner": data["owner"],
        "Cmd": data["cmd"], "JobUniverse": 12, "JobStatus": 4, "LastJobStatus": 2,
        "ExitBySignal": "exit_signal" in payload,
        "JobDuration": float(payload.get("wall_clock", 0.0)), "CompletionDate": when,
        "EnteredCurrentStatus": when, "RemoteUserCpu": float(payload.get("remote_user_cpu", 0)),
        "RemoteSysCpu": float(payload.get("remote_sys_cpu", 0)),
        "RemoteWallClockTime": float(data.get("ad", {}).get("RemoteWallClockTime", 0.0))
        + float(payload.get("wall_clock", 0.0)),
        "ImageSize": payload.get("image_size", 0)}
    for name, attribute in (("submitted_at", "QDate"), ("started_at", "JobStartDate")):
        if data.get(name):
            ad[attribute] = int(dt.datetime.fromisoformat(data[name]).timestamp())
    if "exit_signal" in payload:
        ad["ExitSignal"] = payload["exit_signal"]
        ad["ExitReason"] = f"died on signal {payload['exit_signal']} " \
                           f"({signal.strsignal(payload['exit_signal'])})"
    else:
        ad["ExitCode"] = payload["exit_code"]
    if "core_file" in payload:
        ad["JobCoreDumped"] = True  # set only when the job dumped core, as the starter does
    return ad


# -- the machine --------------------------------------------------------------------------------


def test_the_steps_follow_the_incidents_order() -> None:
    builtin = builtins()["job_exit"]
    spec = builtin.spec
    chain, state = [], spec.initial
    for trigger in TRIGGERS:
        edge = next(t for t in spec.transitions if t.trigger == trigger and state in t.sources
                    and "todays_order" not in t.guards
                    and "notification_wanted" not in t.unless)
        chain.append((state, [e.name for e in edge.effects]))
        state = edge.dest
    assert chain == [("running", ["write_terminated_event"]),
                     ("writing_userlog", ["write_output_ad"]),
                     ("writing_output_ad", ["update_job_queue"]),
                     ("updating_queue", ["send_job_notification"]),
                     ("emailing", [])]
    assert state == "done" and spec.final == ("done",)
    # every step gives up into a visible stuck state, which the step's follow-up leaves
    for step, stuck in zip(job_exit.STEPS, job_exit.STUCK, strict=False):
        assert any(t.trigger == "gave_up" and t.sources == (step,) and t.dest == stuck
                   for t in spec.transitions)
    retry = builtin.effects["update_job_queue"].retry
    # HTCondor's LOCAL_UNIVERSE_MAX_JOB_CLEANUP_RETRIES=5 retries after the first attempt,
    # LOCAL_UNIVERSE_JOB_CLEANUP_RETRY_DELAY=30 s, no jitter
    assert (retry.max_attempts, retry.base, retry.cap, retry.jitter) == (6, 30.0, 30.0, 0.0)
    described = json.loads(CliRunner().invoke(main, ["describe", "job_exit", "--json"]).output)
    assert [s["name"] for s in described["states"]][:6] == ["running", *job_exit.STEPS]


@pytest.mark.parametrize("notification", ["Always", "Never"])
def test_today_s_order_writes_the_output_ad_last(sqlite_url: str, tmp_path: Path,
                                                 clock: SimulatedClock,
                                                 notification: str) -> None:
    """step_order: today, as JICLocalSchedd::notifyJobExit: the user log, the queue, the
    mail, then the output ad; the journal shows the steps in that order."""
    mailer = RecordingMailer()
    engine = make_engine(Store(sqlite_url, upgrade=True), clock, mailer=mailer)
    engine.create("job_exit", "42.0", job(42, 0, tmp_path, step_order="today",
                                          notification=notification))
    engine.fire("42.0", "exited", exit_payload())
    Worker(engine).run_until_idle()
    assert engine.get("42.0").state == "done"
    steps = [e.dest for e in engine.history("42.0") if e.dest != "running"]
    wanted = ["writing_userlog", "updating_queue", *(["emailing"] if notification == "Always"
                                                     else []), "writing_output_ad", "done"]
    assert steps == wanted
    assert len(mailer.sent) == (notification == "Always")
    [ad] = classad2.parseAds((tmp_path / "42.0.ad").read_text(), classad2.ParserType.Old)
    assert ad["ExitCode"] == 3


def test_a_job_exit_end_to_end(db_url: str, tmp_path: Path, clock: SimulatedClock) -> None:
    store = Store(db_url, upgrade=True)
    mailer = RecordingMailer()
    engine = make_engine(store, clock, mailer=mailer)
    submit(store, JobId(42, 0), {"Owner": "alice", "Cmd": "/home/alice/analyse",
                                 "RequestCpus": 4}, now=clock.now())
    data = job(42, 0, tmp_path, notification="Complete", notify_user="alice@example.org")
    engine.create("job_exit", "42.0", data)
    payload = exit_payload()
    assert engine.fire("42.0", "exited", payload).dest == "writing_userlog"
    stats = Worker(engine).run_until_idle()
    assert (stats.done, stats.retried, stats.failed) == (4, 0, 0)
    assert engine.get("42.0").state == "done"
    history = engine.history("42.0")
    assert [e.trigger for e in history[1:]] == TRIGGERS
    assert [e.actor for e in history[2:]] == [
        "effect:write_terminated_event", "effect:write_output_ad", "effect:update_job_queue",
        "effect:send_job_notification"]
    [event] = events(tmp_path / "42.log")
    assert (event.type, event.cluster, event.proc) == (htcondor2.JobEventType.JOB_TERMINATED,
                                                       42, 0)
    assert event["ReturnValue"] == 3 and event.timestamp == int(EXITED_AT.timestamp())
    ad = classad2.parseOne((tmp_path / "42.0.ad").read_text())
    assert dict(ad) == expected_ad(data, payload)
    found = queue_ad(store, JobId(42, 0))
    assert found is not None
    assert (found.job_status, found.updates) == (4, 1)
    assert found.ad["RequestCpus"] == 4 and found.ad["LastJobStatus"] == 2
    assert {k: found.ad[k] for k in htcondor.TERMINAL_ATTRIBUTES if k in found.ad} == {
        k: v for k, v in expected_ad(data, payload).items() if k in htcondor.TERMINAL_ATTRIBUTES}
    assert found.updated_by == "job_exit:42.0:4:0:update_job_queue"
    [(recipient, message)] = mailer.sent
    assert recipient == "alice@example.org" and message["Subject"] == "[Condor] Condor Job 42.0"
    assert engine.verify() == []
    store.dispose()


# -- formats, read back with the real HTCondor bindings -----------------------------------------

HOSTILE_OWNER = 'mallory" JobStatus = 1 ]; ['
HOSTILE_CMD = ('/bin/sh -c "echo hi ]; JobStatus = 1; x = " Owner = "root" ünïcødé 日本 '
               '[ a \\ b ]')
UNHOLDABLE = {"a newline": 'mallory"\nJobStatus = 1\n', "an escape": "x \x1b[31m y",
              "a backslash at the end": "ends with \\", "a backslash quote": 'a\\" b'}
"""What the old ClassAd syntax (the output ad's) cannot hold: refused when the job is made."""

CASES = {
    "normal exit": (job(42, 0, Path()), exit_payload()),
    "signal with core": (job(43, 7, Path()), exit_payload(
        exit_code=None, exit_signal=11, core_file="/scratch/alice/core dumps/core.4242 ü")),
    "signal without core": (job(44, 0, Path()), exit_payload(exit_code=None, exit_signal=9)),
    "large cluster numbers": (job(2147483647, 123456, Path()), exit_payload(exit_code=255)),
    "hostile strings": (job(45, 0, Path(), owner=HOSTILE_OWNER, cmd=HOSTILE_CMD),
                        exit_payload(exit_code=0, remote_user_cpu=0.1)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_user_log_and_output_ad_read_back_with_htcondor(case: str, sqlite_url: str,
                                                        tmp_path: Path,
                                                        clock: SimulatedClock) -> None:
    template, payload = CASES[case]
    data = {**template, "userlog": str(tmp_path / "shared.log"),
            "output_ad": str(tmp_path / "job.ad")}
    (tmp_path / "shared.log").write_text(  # the log already holds another job's events
        "000 (007.000.000) 2026-12-02 09:00:00Z Job submitted from host: "
        "<127.0.0.1:9618?addrs=127.0.0.1-9618>\n...\n")
    engine = make_engine(Store(sqlite_url, upgrade=True), clock)
    key = f"{data['cluster']}.{data['proc']}"
    engine.create("job_exit", key, data)
    engine.fire(key, "exited", payload)
    Worker(engine).run_until_idle()
    assert engine.get(key).state == "done"

    submitted, event = events(tmp_path / "shared.log")
    assert submitted.type == htcondor2.JobEventType.SUBMIT
    assert event.type == htcondor2.JobEventType.JOB_TERMINATED
    assert (event.cluster, event.proc) == (data["cluster"], data["proc"])
    assert event.timestamp == int(EXITED_AT.timestamp())
    if "exit_signal" in payload:
        assert event["TerminatedNormally"] is False
        assert event["TerminatedBySignal"] == payload["exit_signal"]
        assert event.get("CoreFile") == payload.get("core_file")
    else:
        assert event["TerminatedNormally"] is True
        assert event["ReturnValue"] == payload["exit_code"]
    assert event["SentBytes"] == event["ReceivedBytes"] == 0  # a local job transfers nothing
    user = htcondor.usage(payload["remote_user_cpu"])
    assert event["RunLocalUsage"] == f"Usr {user}, Sys {htcondor.usage(payload['remote_sys_cpu'])}"
    assert event["RunRemoteUsage"] == "Usr 0 00:00:00, Sys 0 00:00:00"

    ad = classad2.parseOne((tmp_path / "job.ad").read_text(encoding="utf-8"))
    assert dict(ad) == expected_ad(data, payload)  # every value unchanged, nothing added
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00")))
def test_no_string_can_inject_an_attribute(value: str) -> None:
    """Old syntax, as the starter writes the output ad: a string either reads back
    unchanged beside the others, or is refused (and the job with it)."""
    try:
        text = htcondor.old_syntax({"ClusterId": 1, "Owner": value, "JobStatus": 2})
    except ValueError:
        assert htcondor.old_syntax_problem(value) is not None
        return
    [ad] = classad2.parseAds(text, classad2.ParserType.Old)
    assert dict(ad) == {"ClusterId": 1, "Owner": value, "JobStatus": 2}


def test_two_runs_append_two_ads_as_the_starter_does(tmp_path: Path,
                                                    clock: SimulatedClock) -> None:
    """JobInfoCommunicator::writeOutputAdFile opens the file with "a" and writes the ad
    with fPrintAd, no delimiter: each run's ad follows the last; read whole, the file is
    one ad with the last run's values (its RemoteWallClockTime the total of both runs)."""
    output = tmp_path / "42.0.ad"
    runs = []
    for run, earlier in ((1, 0.0), (2, 3725.0)):   # the schedd's ad after run 1 holds it
        data = job(42, 0, tmp_path, userlog=None, output_ad=str(output),
                   ad={**JOB_AD, "RemoteWallClockTime": earlier})
        payload = exit_payload(exit_code=run, exited_at=(EXITED_AT + dt.timedelta(
            hours=run)).isoformat())
        engine = make_engine(Store(f"sqlite:///{tmp_path / f'run{run}.db'}", upgrade=True),
                             clock)
        engine.create("job_exit", "42.0", data)
        engine.fire("42.0", "exited", payload)
        Worker(engine).run_until_idle()
        assert engine.get("42.0").state == "done"
        engine.store.dispose()
        runs.append(str(classad2.ClassAd(expected_ad(data, payload)).printOld()))
    text = output.read_text()
    assert text == runs[0] + runs[1]
    first = [dict(ad) for ad in classad2.parseAds(runs[0], classad2.ParserType.Old)]
    second = [dict(ad) for ad in classad2.parseAds(text[len(runs[0]):],
                                                   classad2.ParserType.Old)]
    assert [ad["ExitCode"] for ad in first + second] == [1, 2]
    assert second[0]["RemoteWallClockTime"] == 3725.0 + 3725.0
    [whole] = classad2.parseAds(text, classad2.ParserType.Old)
    assert dict(whole) == second[0]


@pytest.mark.parametrize("what", list(UNHOLDABLE))
def test_a_string_the_output_ad_cannot_hold_is_refused_with_the_job(
        what: str, sqlite_url: str, tmp_path: Path) -> None:
    engine = make_engine(Store(sqlite_url, upgrade=True))
    for field, data in (("owner", job(42, 0, tmp_path, owner=UNHOLDABLE[what])),
                        ("cmd", job(43, 0, tmp_path, cmd=UNHOLDABLE[what])),
                        ("ad: Iwd", job(44, 0, tmp_path, ad={"Iwd": UNHOLDABLE[what]}))):
        with pytest.raises(LifecycleError, match=f"{field} .*the output ad"):
            engine.create("job_exit", f"{data['cluster']}.0", data)


def test_the_event_text_is_htcondors() -> None:
    end = htcondor.JobTermination(cluster=42, proc=0, owner="a", cmd="b", submit_host="h",
                                  exited_at=EXITED_AT, exit_signal=11,
                                  core_file="/tmp/core.1", remote_user_cpu=90061.9)
    utc = htcondor.UserLogFormat.parse("UTC")
    assert htcondor.terminated_event(end, utc).decode() == (
        "005 (042.000.000) 2026-12-02 10:01:00Z Job terminated.\n"
        "\t(0) Abnormal termination (signal 11)\n"
        "\t(1) Corefile in: /tmp/core.1\n"
        "\t\tUsr 0 00:00:00, Sys 0 00:00:00  -  Run Remote Usage\n"
        "\t\tUsr 1 01:01:01, Sys 0 00:00:00  -  Run Local Usage\n"
        "\t\tUsr 0 00:00:00, Sys 0 00:00:00  -  Total Remote Usage\n"
        "\t\tUsr 0 00:00:00, Sys 0 00:00:00  -  Total Local Usage\n"
        "\t0  -  Run Bytes Sent By Job\n"
        "\t0  -  Run Bytes Received By Job\n"
        "\t0  -  Total Bytes Sent By Job\n"
        "\t0  -  Total Bytes Received By Job\n"
        "...\n")
    with pytest.raises(ValueError, match="control character"):
        htcondor.terminated_event(htcondor.JobTermination(
            cluster=1, proc=0, owner="a", cmd="b", submit_host="h", exited_at=EXITED_AT,
            exit_signal=6, core_file="/tmp/core\n...\n005 (001.000.000)"))


# -- the data a job exit takes ------------------------------------------------------------------


@pytest.mark.parametrize(("change", "message"), [
    ({"notification": "Sometimes"}, "notification: Input should be 'Never', 'Always'"),
    ({"userlog": "relative/job.log"}, "is not an absolute path"),
    ({"output_ad": "/tmp/a\nb.ad"}, "contains a control character"),
    ({"notify_user": "alice@example.org\r\nBcc: all@example.org"}, "notify_user"),
    ({"notify_user": "Alice <alice@example.org>"}, "is not a plain dot-atom"),
    ({"cluster": -1}, "cluster: Input should be greater than or equal to 0"),
    ({"cmd": "a\x00b"}, "NUL character"),
    ({"exit_code": 1, "exit_signal": 9}, "not both"),
    ({"exit_code": 1, "core_file": "/tmp/core"}, "core_file goes with exit_signal"),
    ({"JobStatus": 4}, "JobStatus: Extra inputs are not permitted"),
    # strict types: no string or boolean is taken for a number
    ({"cluster": "42"}, "cluster: Input should be a valid integer"),
    ({"cluster": True}, "cluster: Input should be a valid integer"),
    ({"proc": 0.0}, "proc: Input should be a valid integer"),
    ({"success_exit_code": "0"}, "success_exit_code: Input should be a valid integer"),
    ({"success_exit_code": 256}, "success_exit_code: Input should be less than or equal to 255"),
    ({"notification": 1}, "notification: Input should be 'Never'"),
    ({"owner": 7}, "owner: Input should be a valid string"),
    # times the user log and ClassAds cannot hold
    ({"submitted_at": "0999-12-31T23:59:59Z"}, "outside what the user log and ClassAds"),
    ({"submitted_at": 1796205600}, "submitted_at must be an ISO 8601 time with a zone"),
    ({"started_at": "2026-12-02T10:00:00"}, "started_at needs a time zone"),
    ({"submitted_at": "2026-12-02T11:00:00Z", "started_at": "2026-12-02T10:00:00Z"},
     "started_at 2026-12-02T10:00:00+00:00 is before submitted_at"),
    # paths: absolute, without '..'
    ({"userlog": "/home/alice/../bob/job.log"}, "userlog '/home/alice/../bob/job.log' "
                                                "contains '..'"),
    ({"output_ad": "/home/alice/.."}, "contains '..'"),
])
def test_bad_data_is_refused_with_a_clear_error(sqlite_url: str, tmp_path: Path,
                                                change: dict[str, Any], message: str) -> None:
    engine = make_engine(Store(sqlite_url, upgrade=True))
    with pytest.raises(InvalidData, match=re.escape(message)):
        engine.create("job_exit", "42.0", {**job(42, 0, tmp_path), **change})
    assert engine.resources() == []


def test_an_exit_without_status_is_refused(sqlite_url: str, tmp_path: Path) -> None:
    engine = make_engine(Store(sqlite_url, upgrade=True))
    engine.create("job_exit", "42.0", job(42, 0, tmp_path))
    refused = engine.fire("42.0", "exited", {"wall_clock": 5})
    assert refused.reason == "guard 'exit_status_given' is false"
    with pytest.raises(InvalidData, match="not both"):
        engine.fire("42.0", "exited", {"exit_code": 0, "exit_signal": 9})
    assert outbox_counts(engine) == {}


# -- notification and mail ----------------------------------------------------------------------


@pytest.mark.parametrize(("notification", "exit", "mailed"), [
    ("Never", {"exit_code": 1}, False),
    ("Always", {"exit_code": 0}, True),
    ("Complete", {"exit_code": 0}, True),
    ("complete", {"exit_signal": 9}, True),
    ("Error", {"exit_code": 0}, False),
    ("Error", {"exit_code": 1}, True),
    ("Error", {"exit_signal": 15}, True),
    ("Error", {"exit_signal": 11, "core_file": "/tmp/core.11"}, True),
    ("Start", {"exit_code": 1}, False),  # mail when the job starts, none at its exit
    ("start", {"exit_signal": 11, "core_file": "/tmp/core.11"}, False),
])
def test_notification_decides_whether_mail_is_sent(sqlite_url: str, tmp_path: Path,
                                                   notification: str, exit: dict[str, Any],
                                                   mailed: bool) -> None:
    mailer = RecordingMailer()
    engine = make_engine(Store(sqlite_url, upgrade=True), mailer=mailer)
    engine.create("job_exit", "42.0", job(42, 0, tmp_path, notification=notification))
    engine.fire("42.0", "exited", exit)
    Worker(engine).run_until_idle()
    assert engine.get("42.0").state == "done"
    assert len(mailer.sent) == int(mailed)
    decision = engine.history("42.0")[-2 if mailed else -1]
    assert decision.trigger == "queue_updated"  # the journal shows why mail was (not) sent
    assert decision.guards is not None
    assert decision.guards["notification_wanted"] is mailed
    assert decision.dest == ("emailing" if mailed else "done")


def test_error_notification_respects_the_success_exit_code(sqlite_url: str,
                                                           tmp_path: Path) -> None:
    mailer = RecordingMailer()
    engine = make_engine(Store(sqlite_url, upgrade=True), mailer=mailer)
    engine.create("job_exit", "42.0", job(42, 0, tmp_path, notification="Error",
                                          success_exit_code=2))
    engine.fire("42.0", "exited", {"exit_code": 2})
    Worker(engine).run_until_idle()
    assert engine.get("42.0").state == "done" and mailer.sent == []


def test_mail_received_by_a_real_smtp_server(sqlite_url: str, tmp_path: Path,
                                             clock: SimulatedClock) -> None:
    with MailSink() as sink:
        mailer = smtp.SmtpMailer(sink.url, sender="condor@submit.example.org")
        engine = make_engine(Store(sqlite_url, upgrade=True), clock, mailer=mailer)
        injection = HOSTILE_CMD + "\r\nBcc: everyone@example.org\r\n\r\n.\r\n"
        with pytest.raises(LifecycleError, match=r"cmd .* contains a control character"):
            engine.create("job_exit", "42.0", job(42, 0, tmp_path, cmd=injection))
        data = job(42, 0, tmp_path, notification="Complete", notify_user="alice@example.org",
                   cmd=HOSTILE_CMD)
        engine.create("job_exit", "42.0", data)
        engine.fire("42.0", "exited", exit_payload())
        Worker(engine).run_until_idle()
        assert engine.get("42.0").state == "done"
        [mail] = sink.received
    assert (mail.mail_from, mail.rcpt_tos) == ("condor@submit.example.org",
                                               ("alice@example.org",))
    headers = mail.message
    assert sorted(headers.keys()) == sorted([
        "From", "To", "Subject", "Date", "Message-ID", "Auto-Submitted", "Content-Type",
        "Content-Transfer-Encoding", "MIME-Version"])  # nothing injected
    assert headers["Subject"] == "[Condor] Condor Job 42.0"
    [effect] = [e for e in effect_records(engine) if e.name == "send_job_notification"]
    assert mail.message_id == smtp.message_id(effect.idempotency_key, "submit.example.org")
    body = mail.body
    assert "Condor job 42.0\n\t/bin/sh -c" in body
    assert "exited normally with status 3\n" in body
    assert "Remote User CPU Time:      0+00:01:01\n" in body
    # no JobStartDate (the shadow's birthdate): HTCondor's mail says the run took no time
    assert "Allocation/Run time:       0+00:00:00\n" in body
    assert "ünïcødé 日本" in body and "\nBcc:" not in body


def test_a_server_that_refuses_the_first_attempts(sqlite_url: str, tmp_path: Path,
                                                  clock: SimulatedClock) -> None:
    with MailSink(refuse=2) as sink:
        mailer = smtp.SmtpMailer(sink.url)
        engine = make_engine(Store(sqlite_url, upgrade=True), clock, mailer=mailer,
                             retry=Retry(max_attempts=5, base=30, cap=30, jitter=0))
        engine.create("job_exit", "42.0", job(42, 0, tmp_path, notification="Always"))
        engine.fire("42.0", "exited", {"exit_signal": 9})
        worker = Worker(engine)
        worker.run_until_idle()
        [mail_effect] = [e for e in effect_records(engine) if e.name == "send_job_notification"]
        assert (mail_effect.status, mail_effect.attempts) == ("pending", 1)
        assert "451 4.3.0 Try again later" in (mail_effect.last_error or "")
        assert engine.get("42.0").state == "emailing"
        for _ in range(2):
            clock.advance(30)
            worker.run_until_idle()
        assert engine.get("42.0").state == "done"
        assert sink.refused == 2
        [mail] = sink.received
        assert mail.rcpt_tos == ("alice@submit.example.org",)  # owner@submit_host
        assert "died on signal 9 (Killed)\n" in mail.body


def test_a_permanent_refusal_or_a_bad_address_leaves_the_job_visibly_stuck(
        sqlite_url: str, tmp_path: Path, clock: SimulatedClock) -> None:
    with MailSink(refuse=1, reply="550 5.1.1 No such user") as sink:
        engine = make_engine(Store(sqlite_url, upgrade=True), clock,
                             mailer=smtp.SmtpMailer(sink.url))
        engine.create("job_exit", "42.0", job(42, 0, tmp_path, notification="Always"))
        engine.create("job_exit", "43.0", job(43, 0, tmp_path, notification="Always",
                                              owner="eve, all@example.org"))
        for key in ("42.0", "43.0"):
            engine.fire(key, "exited", {"exit_code": 0})
        Worker(engine).run_until_idle()
        assert [engine.get(k).state for k in ("42.0", "43.0")] == ["stuck_email"] * 2
        stuck = {e.key: e for e in effect_records(engine, statuses=("failed",))}
        assert "550 5.1.1 No such user" in (stuck["42.0"].last_error or "")
        assert "no mail sent: recipient 'eve, all@example.org'" in (
            stuck["43.0"].last_error or "")
        assert stuck["42.0"].attempts == 1  # a 5xx is not retried
        assert sink.received == []
        assert retry_failed(engine, "42.0") == 1  # the server takes it now
        Worker(engine).run_until_idle()
        assert engine.get("42.0").state == "done" and len(sink.received) == 1


def test_without_an_smtp_server_mail_is_stuck_not_lost(sqlite_url: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(smtp.URL_VARIABLE, raising=False)
    engine = make_engine(Store(sqlite_url, upgrade=True), mailer=smtp.SmtpMailer())
    engine.create("job_exit", "42.0", job(42, 0, tmp_path, notification="Always"))
    engine.fire("42.0", "exited", {"exit_code": 0})
    Worker(engine).run_until_idle()
    assert engine.get("42.0").state == "stuck_email"
    [failed] = effect_records(engine, statuses=("failed",))
    assert "no SMTP server: set LIFECYCLE_SMTP_URL" in (failed.last_error or "")


# -- the job queue ------------------------------------------------------------------------------


def test_the_queue_update_is_exactly_once_and_a_no_op_when_final(db_url: str,
                                                                 tmp_path: Path) -> None:
    store = Store(db_url, upgrade=True)
    ad = {"ClusterId": 7, "ProcId": 0, "Owner": "a", "Cmd": "b", "JobStatus": 4,
          "ExitCode": 0}
    submit(store, JobId(7, 0), {"Owner": "a", "Cmd": "b", "JobStatus": 5})  # held
    with store.write() as cursor:
        assert record_completion(cursor, job=JobId(7, 0), ad=ad, key="k1",
                                 now=EXITED_AT) is True
    with store.write() as cursor:
        assert record_completion(cursor, job=JobId(7, 0), ad={**ad, "ExitCode": 9},
                                 key="k2", now=EXITED_AT) is False
    found = queue_ad(store, JobId(7, 0))
    assert found is not None
    assert (found.updates, found.updated_by, found.ad["ExitCode"]) == (1, "k1", 0)
    assert found.ad["LastJobStatus"] == 5
    # a job the queue already holds as Completed: the machine goes on, the ad is untouched
    submit(store, JobId(8, 0), {"Owner": "alice", "JobStatus": 4, "ExitCode": 0})
    engine = make_engine(store)
    engine.create("job_exit", "8.0", job(8, 0, tmp_path))
    engine.fire("8.0", "exited", {"exit_code": 1})
    Worker(engine).run_until_idle()
    assert engine.get("8.0").state == "done"
    found = queue_ad(store, JobId(8, 0))
    assert found is not None and (found.updates, found.ad["ExitCode"]) == (0, 0)
    store.dispose()


class BrokenWrites(JobQueue):
    """The database queue whose writes, in the effect's transaction, fail the first time."""

    def __init__(self) -> None:
        self.inner = DatabaseJobQueue()
        self.broken = 1

    def complete(self, job: JobId, ad: Any, *, key: str, now: dt.datetime) -> Any:
        writes = self.inner.complete(job, ad, key=key, now=now)
        if not self.broken:
            return writes
        self.broken -= 1

        def failing(cursor: Any) -> None:
            writes(cursor)  # written, then rolled back with the effect's completion
            raise RuntimeError("the database refused the update")

        return failing


def test_writes_that_fail_roll_back_with_the_completion_and_are_retried(
        db_url: str, tmp_path: Path, clock: SimulatedClock) -> None:
    store = Store(db_url, upgrade=True)
    engine = make_engine(store, clock, queue=BrokenWrites(),
                         retry=Retry(max_attempts=5, base=30, cap=30, jitter=0))
    engine.create("job_exit", "42.0", job(42, 0, tmp_path))
    engine.fire("42.0", "exited", {"exit_code": 0})
    worker = Worker(engine)
    worker.run_until_idle()  # the worker lives on: the failure is the attempt's
    [update] = [e for e in effect_records(engine) if e.name == "update_job_queue"]
    assert (update.status, update.attempts, update.last_error) == (
        "pending", 1, "RuntimeError: the database refused the update")
    assert engine.get("42.0").state == "updating_queue"
    assert queue_ad(store, JobId(42, 0)) is None  # nothing of it was committed
    clock.advance(30)
    worker.run_until_idle()
    assert engine.get("42.0").state == "done"
    found = queue_ad(store, JobId(42, 0))
    assert found is not None and found.updates == 1
    store.dispose()


def test_a_failing_queue_is_retried_then_stuck_and_retry_resumes_at_that_step(
        db_url: str, tmp_path: Path, clock: SimulatedClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(db_url, upgrade=True)
    queue = FaultyQueue(fail_times=6)
    engine = make_engine(store, clock, queue=queue, retry=None)  # the default: 6 x 30 s
    engine.create("job_exit", "42.0", job(42, 0, tmp_path, notification="Complete"))
    engine.fire("42.0", "exited", exit_payload())
    worker = Worker(engine)
    worker.run_until_idle()
    for attempt in range(2, 7):
        assert engine.get("42.0").state == "updating_queue", attempt
        clock.advance(30)  # nobody slept: the next attempt is due 30 s later
        worker.run_until_idle()
    assert engine.get("42.0").state == "stuck_queue"
    assert queue.calls == 6
    gave_up = engine.history("42.0")[-1]
    assert (gave_up.trigger, gave_up.payload) == ("gave_up", {
        "effect": "update_job_queue",
        "error": "QueueDown: schedd at <127.0.0.1:9618> does not answer"})

    # `lifecycle stuck` shows it; `lifecycle retry` and `lifecycle worker` finish it, with
    # the built-in machine's own handlers (the job queue in this database, SMTP)
    with MailSink() as sink:
        monkeypatch.setenv(smtp.URL_VARIABLE, sink.url)
        runner = CliRunner()

        def run(*args: str) -> str:
            result = runner.invoke(main, [*args, "--db", db_url], catch_exceptions=False)
            assert result.exit_code == 0, result.output
            return result.output

        stuck = json.loads(run("stuck", "--json"))
        assert [(s["key"], s["name"], s["attempts"]) for s in stuck] == [
            ("42.0", "update_job_queue", 6)]
        assert "stuck_queue" in run("list", "job_exit")
        assert "1 failed effect queued again" in run("retry", "42.0")
        report = json.loads(run("worker", "--until-idle", "--json"))
        assert (report["done"], report["failed"]) == (2, 0)
        assert len(sink.received) == 1
        shown = json.loads(run("queue", "show", "42.0", "--json"))
    assert (shown["job_status"], shown["updates"]) == (4, 1)
    assert engine.get("42.0").state == "done"
    assert [e.trigger for e in engine.history("42.0")][-3:] == [
        "gave_up", "queue_updated", "email_sent"]
    records = {e.name: e for e in effect_records(engine)}
    assert records["write_terminated_event"].attempts == 1  # (a) and (b) were not repeated
    assert records["write_output_ad"].attempts == 1
    assert len(events(tmp_path / "42.log")) == 1
    store.dispose()


def test_the_command_line(db_url: str, tmp_path: Path,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()

    def run(*args: str, code: int = 0) -> str:
        result = runner.invoke(main, [*args, "--db", db_url], catch_exceptions=False)
        assert result.exit_code == code, result.output
        return result.output

    run("db", "upgrade")
    data = job(42, 0, tmp_path, notification="Error", notify_user="alice@example.org")
    assert "created job_exit:42.0 in running" in run("create", "job_exit", "42.0", "--data",
                                                     json.dumps(data))
    assert "running -> writing_userlog" in run(
        "fire", "42.0", "exited", "--payload", '{"exit_signal": 11, "core_file": "/tmp/c"}')
    with MailSink() as sink:
        monkeypatch.setenv(smtp.URL_VARIABLE, sink.url)
        assert "effects: 4 done" in run("worker", "--until-idle")
        [mail] = sink.received
    assert "died on signal 11 (Segmentation fault)\nCore file generated\n" in mail.body
    assert json.loads(run("show", "42.0", "--json"))["state"] == "done"
    shown = run("queue", "show", "42.0")
    assert "4 (Completed)" in shown and "1 (times its completion was recorded)" in shown
    assert "ExitSignal" in shown and "JobCoreDumped" in shown and "true" in shown
    parsed = json.loads(run("queue", "show", "42.0", "--json"))
    assert (parsed["job"], parsed["updates"], parsed["ad"]["ExitSignal"]) == ("42.0", 1, 11)
    assert "job 43.0 is not in the job queue" in run("queue", "show", "43.0", code=1)
    assert "is not a job id" in run("queue", "show", "forty-two", code=2)


# -- a queue outage -----------------------------------------------------------------------------


def _wait(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _work_off(engine: Engine, seconds: float = 30) -> None:
    """Run workers until the outbox is empty (effects backing off come due meanwhile)."""
    deadline = time.monotonic() + seconds
    while outbox_counts(engine).keys() - {"done"}:
        assert time.monotonic() < deadline, f"not idle: {outbox_counts(engine)}"
        Worker(engine, concurrency=2, poll=0.02).run_until_idle()
        time.sleep(0.02)


def test_a_queue_outage_holds_up_nothing_else(sqlite_url: str, tmp_path: Path) -> None:
    """The queue fails (and one call hangs) for a while: the worker keeps serving other jobs'
    steps and stops on request within a second; once the queue is back, it finishes
    everything, each job's queue ad updated once."""
    store = Store(sqlite_url, upgrade=True)
    down = threading.Event()
    down.set()
    queue = FaultyQueue(down=down, hang=3.0, hang_times=1)
    machine = job_exit.make(queue=queue, mailer=RecordingMailer(), retry=FAST, timeout=30)
    effects = dict(machine.effects)
    effects["update_job_queue"] = Effect(effects["update_job_queue"].handler, FAST, timeout=0.3)
    engine = Engine(store, [machine.spec], guards=machine.guards, effects=effects)

    def exits(clusters: range) -> None:
        for cluster in clusters:
            engine.create("job_exit", f"{cluster}.0", job(cluster, 0, tmp_path))
            engine.fire(f"{cluster}.0", "exited", {"exit_code": 0})

    def states(clusters: range) -> set[str]:
        return {engine.get(f"{c}.0").state for c in clusters}

    exits(range(100, 108))
    worker = Worker(engine, concurrency=2, poll=0.02)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        _wait(lambda: states(range(100, 108)) == {"updating_queue"}, 20, "steps (a), (b)")
        exits(range(200, 208))  # new exits during the outage are served all the same
        _wait(lambda: states(range(200, 208)) == {"updating_queue"}, 20, "the new exits")
        _wait(lambda: queue.calls >= 20, 20, "retries of the queue update")
        assert queue.hangs == 1
    finally:
        worker.stop(fast=True)
        thread.join(120)
    assert not thread.is_alive()
    left = outbox_counts(engine)
    assert set(left) <= {"done", "pending"} and left["pending"] == 16  # nothing lost
    down.clear()
    _work_off(engine)
    assert states(range(100, 108)) | states(range(200, 208)) == {"done"}
    for cluster in [*range(100, 108), *range(200, 208)]:
        found = queue_ad(store, JobId(cluster, 0))
        assert found is not None and (found.job_status, found.updates) == (4, 1)
    print(f"queue outage: {queue.calls} calls to the queue for 16 jobs")
    store.dispose()


def test_fast_shutdown_while_the_queue_hangs(sqlite_url: str, tmp_path: Path,
                                             worker_cmd: list[str]) -> None:
    store = Store(sqlite_url, upgrade=True)
    hang_file = tmp_path / "hang"
    hang_file.touch()
    engine = make_engine(store, mailer=RecordingMailer())
    engine.create("job_exit", "42.0", job(42, 0, tmp_path))
    engine.fire("42.0", "exited", {"exit_code": 0})
    process = subprocess.Popen([*worker_cmd, "hang", sqlite_url, str(hang_file)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        _wait(lambda: hang_file.with_name("hang.hanging").exists(), 30,
              "the queue update to hang")
        process.send_signal(signal.SIGTERM)  # graceful: waits for the running handler
        assert process.stderr is not None
        read_until(process.stderr, "finishing 1 running handlers",
                   "the worker ended without waiting for its handler")
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)  # fast: gives it back at once
        assert process.wait(timeout=120) == 0
        assert hang_file.exists()  # it left while the queue update still hung
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    [update] = [e for e in effect_records(engine) if e.name == "update_job_queue"]
    assert (update.status, update.attempts) == ("pending", 0)  # given back, not lost
    hang_file.unlink()
    Worker(engine).run_until_idle()
    assert engine.get("42.0").state == "done"
    store.dispose()


# -- crashes ------------------------------------------------------------------------------------

WINDOW = ("email:accepted", "send_job_notification:after")
"""Crashes after the SMTP server accepted a mail and before the commit: each sends it again."""
MAYBE = ("email:claim_lost", "email:failed")
"""A mail whose sender lost its claim, or saw the send fail (a reply that came too late, on a
busy machine): it may or may not have been delivered, and is sent again."""


def _crash_run(worker_cmd: list[str], url: str, tmp_path: Path, jobs: int,
               probability: float) -> None:
    """Job exits worked off by worker processes that kill themselves with SIGKILL at random
    points, two at a time, restarted until nothing is left to do."""
    store = Store(url, upgrade=True)
    logs = tmp_path / "logs"
    logs.mkdir()
    crash_log = tmp_path / "crashes.txt"
    crash_log.touch()
    engine = make_engine(store)
    wants_mail: dict[str, bool] = {}
    payloads: dict[str, dict[str, Any]] = {}
    for i in range(jobs):
        cluster = 1000 + i
        key = f"{cluster}.0"
        notification = ("Complete", "Always", "Error", "Never")[i % 4]
        data = job(cluster, 0, logs, notification=notification, notify_user="u@example.org",
                   userlog=str(logs / f"shared{i % 10}.log"))  # ten logs, shared
        if i % 2:
            submit(store, JobId(cluster, 0), {"Owner": "alice", "Cmd": data["cmd"]})
        payload = exit_payload(exit_code=i % 3) if i % 5 else exit_payload(
            exit_code=None, exit_signal=9)
        engine.create("job_exit", key, data)
        engine.fire(key, "exited", payload)
        payloads[key] = payload
        wants_mail[key] = job_exit.JobExitData.model_validate({**data, **payload}).wants_mail()
    started = time.monotonic()
    with MailSink() as sink:
        done = subprocess.run([*worker_cmd, "crash-loop", url, str(crash_log), str(probability),
                               sink.url, "2", "200"], capture_output=True, text=True,
                              timeout=260)
        assert done.returncode == 0, done.stderr[-3000:]
        mails = Counter(mail.subject.removeprefix("[Condor] Condor Job ")
                        for mail in sink.received)
    summary = json.loads(done.stdout.splitlines()[-1])
    runs, crashes = summary["runs"], summary["crashes"]
    elapsed = time.monotonic() - started
    points = [line.split() for line in crash_log.read_text().splitlines()]
    window = Counter(key for point, key in points if point in WINDOW)
    maybe = Counter(key for point, key in points if point in MAYBE)
    print(f"{jobs} job exits on {store.dialect}: {runs} worker runs, {crashes} killed with "
          f"SIGKILL in {elapsed:.1f} s; crash points hit: "
          f"{dict(Counter(point for point, _ in points))}; the window between the SMTP "
          f"reply and the commit was hit {sum(window.values())} times, and "
          f"{sum(maybe.values())} mails were sent by a worker that lost its claim or saw "
          f"the send fail")
    killed = [point for point, _ in points if point not in MAYBE]
    assert crashes == len(killed) and crashes >= 10, "too few crashes to show anything"

    assert {e.status for e in effect_records(engine)} == {"done"}
    terminated: Counter[str] = Counter()
    for i in range(10):
        text = (logs / f"shared{i}.log").read_text()
        found = events(logs / f"shared{i}.log")
        assert text.count("\n...\n") == len(found)  # no torn or unreadable event
        for event in found:
            assert event.type == htcondor2.JobEventType.JOB_TERMINATED
            terminated[f"{event.cluster}.{event.proc}"] += 1
    assert terminated == Counter(dict.fromkeys(payloads, 1))  # exactly one 005 event each
    for key, payload in payloads.items():
        assert engine.get(key).state == "done"
        ad = classad2.parseOne((logs / f"{key}.ad").read_text())
        assert ad["ClusterId"] == int(key.split(".")[0]) and ad["JobStatus"] == 4
        assert ad.get("ExitCode") == payload.get("exit_code")
        found_ad = queue_ad(store, JobId.parse(key))
        assert found_ad is not None and (found_ad.job_status, found_ad.updates) == (4, 1)
        if wants_mail[key]:  # once, and again only for a window that was hit
            assert 1 + window[key] <= mails[key] <= 1 + window[key] + maybe[key], (
                key, mails[key], window[key], maybe[key])
        else:
            assert mails[key] == 0, (key, mails[key])
    assert not [p for p in logs.iterdir() if p.name.startswith(".")]  # no temporary files
    assert engine.verify() == []
    store.dispose()


def test_crashes_at_random_points_across_many_exits(db_url: str, tmp_path: Path,
                                                    slow: bool, worker_cmd: list[str]) -> None:
    """40 job exits, each crash point taken with probability 0.04 (some 20 crashes); with
    --slow, 200 exits at 0.015."""
    if slow:
        _crash_run(worker_cmd, db_url, tmp_path, jobs=200, probability=0.015)
    else:
        _crash_run(worker_cmd, db_url, tmp_path, jobs=40, probability=0.04)


# -- identity: a payload never changes which job exits ------------------------------------------


def _nothing_changed(engine: Engine, store: Store, key: str, data: dict[str, Any],
                     where: Path, mailer: RecordingMailer) -> None:
    """The job is as created: running, version 1, its data, one journal row; no effect, no
    file, no mail, and the queue holds every job as it was."""
    resource = engine.get(key)
    assert (resource.state, resource.version, resource.data) == ("running", 1, {
        **job_exit.JobExitData.model_validate(data).model_dump(mode="json")})
    assert [e.kind for e in engine.history(key)] == ["create"]
    assert outbox_counts(engine) == {}
    assert Worker(engine).run_until_idle().done == 0
    assert sorted(p.name for p in where.iterdir()) == []
    assert mailer.sent == []
    for cluster in (42, 7):
        found = queue_ad(store, JobId(cluster, 0))
        assert found is not None and (found.job_status, found.updates) == (2, 0)


def test_the_identity_attack_is_refused_and_changes_nothing(
        db_url: str, tmp_path: Path, clock: SimulatedClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Job 42.0's exit may not name job 7.0 (another user's running job), another owner, a
    mail address or a log: refused, naming the fields, and nothing anywhere changes."""
    store = Store(db_url, upgrade=True)
    files = tmp_path / "files"
    files.mkdir()
    submit(store, JobId(42, 0), {"Owner": "alice", "Cmd": "/home/alice/analyse"},
           now=clock.now())
    submit(store, JobId(7, 0), {"Owner": "bob", "Cmd": "/home/bob/simulate"}, now=clock.now())
    mailer = RecordingMailer()
    engine = make_engine(store, clock, mailer=mailer)
    data = job(42, 0, files, notification="Always", notify_user="alice@example.org")
    engine.create("job_exit", "42.0", data)
    attack = {"exit_code": 0, "cluster": 7, "owner": "mallory",
              "notify_user": "mallory@evil.example.org", "userlog": str(files / "7.log")}
    with pytest.raises(GuardError, match=re.escape(
            "the exited payload carries 'cluster', 'notify_user', 'owner', 'userlog', which "
            "it may not: it carries only exit_code, exit_signal, core_file")):
        engine.fire("42.0", "exited", attack)
    _nothing_changed(engine, store, "42.0", data, files, mailer)
    # nor from the command line
    monkeypatch.setenv(smtp.URL_VARIABLE, "smtp://127.0.0.1:1")
    refused = CliRunner().invoke(main, ["fire", "42.0", "exited", "--payload",
                                        json.dumps(attack), "--db", db_url])
    assert refused.exit_code == 1 and "'cluster'" in refused.output
    _nothing_changed(engine, store, "42.0", data, files, mailer)
    # the job's own exit goes through, and job 7.0 is left alone
    engine.fire("42.0", "exited", exit_payload(exit_code=0))
    Worker(engine).run_until_idle()
    assert engine.get("42.0").state == "done"
    [(recipient, message)] = mailer.sent
    assert (recipient, message["Subject"]) == ("alice@example.org", "[Condor] Condor Job 42.0")
    assert [(e.cluster, e.proc) for e in events(files / "42.log")] == [(42, 0)]
    for cluster, status, updates in ((42, 4, 1), (7, 2, 0)):
        found = queue_ad(store, JobId(cluster, 0))
        assert found is not None and (found.job_status, found.updates) == (status, updates)
    store.dispose()


@pytest.mark.parametrize("field", [
    "cluster", "proc", "owner", "cmd", "submit_host", "userlog", "output_ad", "notify_user",
    "notification", "success_exit_code", "submitted_at", "started_at", "JobStatus"])
def test_every_field_but_the_exit_fields_is_refused_in_the_exit(
        sqlite_url: str, tmp_path: Path, field: str) -> None:
    store = Store(sqlite_url, upgrade=True)
    files = tmp_path / "files"
    files.mkdir()
    for cluster in (42, 7):
        submit(store, JobId(cluster, 0), {"Owner": "alice"})
    mailer = RecordingMailer()
    engine = make_engine(store, mailer=mailer)
    data = job(42, 0, files, notification="Always")
    engine.create("job_exit", "42.0", data)
    with pytest.raises(GuardError, match=f"carries '{field}', which it may not"):
        engine.fire("42.0", "exited", {"exit_code": 0, field: data.get(field, 1)})
    _nothing_changed(engine, store, "42.0", data, files, mailer)
    store.dispose()


def test_the_key_is_the_job_id_at_creation_and_at_every_change(db_url: str, tmp_path: Path,
                                                               clock: SimulatedClock) -> None:
    store = Store(db_url, upgrade=True)
    engine = make_engine(store, clock)
    data = job(42, 0, tmp_path)
    for key in ("myjob", "43.0", "42.1", "042.0", "42.00"):
        with pytest.raises(InvalidData, match=re.escape(
                f"the key {key!r} is not this job's id 42.0: a job_exit resource's key is "
                "CLUSTER.PROC of its data")):
            engine.create("job_exit", key, data)
    assert engine.resources() == []
    refused = CliRunner().invoke(main, ["create", "job_exit", "myjob", "--data",
                                        json.dumps(data), "--db", db_url])
    assert refused.exit_code == 1 and "is not this job's id 42.0" in refused.output
    engine.create("job_exit", "42.0", data)
    with pytest.raises(InvalidData, match=re.escape("the key '42.0' is not this job's id 7.0")):
        engine.update("42.0", {"cluster": 7})
    # the follow-up of step (a) carries the exit time and nothing else
    engine.fire("42.0", "exited", {"exit_code": 0})
    with pytest.raises(GuardError, match="the userlog_written payload carries 'owner'"):
        engine.fire("42.0", "userlog_written", {"owner": "mallory"})
    assert engine.get("42.0").data["owner"] == "alice"
    assert engine.get("42.0").state == "writing_userlog"
    store.dispose()


@pytest.mark.parametrize(("exit", "message"), [
    ({"exit_code": "0"}, "exit_code: Input should be a valid integer"),
    ({"exit_code": True}, "exit_code: Input should be a valid integer"),
    ({"exit_code": 0.0}, "exit_code: Input should be a valid integer"),
    ({"exit_code": 256}, "exit_code: Input should be less than or equal to 255"),
    ({"exit_code": -1}, "exit_code: Input should be greater than or equal to 0"),
    ({"exit_signal": "9"}, "exit_signal: Input should be a valid integer"),
    ({"exit_signal": 65}, "exit_signal: Input should be less than or equal to 64"),
    ({"exit_code": 0, "remote_user_cpu": "1.5"}, "remote_user_cpu: Input should be a valid "
                                                 "number"),
    ({"exit_code": 0, "wall_clock": True}, "wall_clock: Input should be a valid number"),
    ({"exit_code": 0, "remote_sys_cpu": 2.0**31}, "remote_sys_cpu: Input should be less than "
                                                  "or equal to 2147483647"),
    ({"exit_code": 0, "image_size": "1"}, "image_size: Input should be a valid integer"),
    ({"exit_code": 0, "exited_at": 1796205600}, "exited_at must be an ISO 8601 time"),
    ({"exit_code": 0, "exited_at": "0999-12-31T23:59:59Z"}, "exited_at 0999-12-31T23:59:59"
                                                            "+00:00 is outside what the user "
                                                            "log and ClassAds can hold"),
    ({"exit_code": 0, "exited_at": "0001-01-01T00:00:00+14:00"}, "is outside what the user "
                                                                 "log and ClassAds"),
    ({"exit_code": 0, "exited_at": "1970-01-01T00:00:00Z"}, "(1970-01-02 to 9999-12-30, UTC)"),
    ({"exit_code": 0, "exited_at": "9999-12-31T00:00:00Z"}, "is outside what the user log"),
    ({"exit_code": 0, "exited_at": "2026-12-02T10:01:00"}, "exited_at needs a time zone"),
    ({"exit_signal": 9, "exited_at": "2026-12-02T08:00:00Z"},
     "exited_at 2026-12-02T08:00:00+00:00 is before started_at"),
])
def test_an_exit_out_of_bounds_is_refused_and_changes_nothing(
        db_url: str, tmp_path: Path, exit: dict[str, Any], message: str) -> None:
    store = Store(db_url, upgrade=True)
    files = tmp_path / "files"
    files.mkdir()
    for cluster in (42, 7):
        submit(store, JobId(cluster, 0), {"Owner": "alice"})
    mailer = RecordingMailer()
    engine = make_engine(store, mailer=mailer)
    data = job(42, 0, files, notification="Always", started_at="2026-12-02T09:00:00Z")
    engine.create("job_exit", "42.0", data)
    with pytest.raises(InvalidData, match=re.escape(message)):
        engine.fire("42.0", "exited", exit)
    _nothing_changed(engine, store, "42.0", data, files, mailer)
    store.dispose()


def _local_time_zone(name: str) -> Iterator[str]:
    """The process's local time zone (the user log's and the mail's dates are local)."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = name
    time.tzset()
    try:
        yield name
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()


@pytest.fixture(params=["Pacific/Kiritimati", "Etc/GMT+12"])  # UTC+14 and UTC-12
def time_zone(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from _local_time_zone(request.param)


@pytest.fixture
def chicago() -> Iterator[str]:
    yield from _local_time_zone("America/Chicago")


@pytest.mark.parametrize("when", ["1970-01-02T00:00:00Z", "9999-12-30T00:00:00Z"])
def test_the_bounds_themselves_are_written_and_read_back(sqlite_url: str, tmp_path: Path,
                                                         time_zone: str, when: str) -> None:
    engine = make_engine(Store(sqlite_url, upgrade=True))
    engine.create("job_exit", "42.0", job(42, 0, tmp_path))
    most = 2**31 - 1
    engine.fire("42.0", "exited", {"exit_code": 0, "exited_at": when,
                                   "remote_user_cpu": float(most), "wall_clock": most})
    Worker(engine).run_until_idle()
    assert engine.get("42.0").state == "done"
    [event] = events(tmp_path / "42.log")
    epoch = int(dt.datetime.fromisoformat(when).timestamp())
    assert event.timestamp == epoch
    assert event["RunLocalUsage"] == "Usr 24855 03:14:07, Sys 0 00:00:00"
    ad = classad2.parseOne((tmp_path / "42.0.ad").read_text())
    assert (ad["CompletionDate"], ad["RemoteUserCpu"]) == (epoch, float(most))


def test_paths_are_normalised_and_an_administrator_can_confine_them(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    allowed, other = tmp_path / "allowed", tmp_path / "other"
    allowed.mkdir()
    other.mkdir()
    store = Store(sqlite_url, upgrade=True)
    engine = make_engine(store)
    created = engine.create("job_exit", "42.0", job(
        42, 0, tmp_path, userlog=f"{allowed}//logs/./42.log/", output_ad=None))
    assert created.data["userlog"] == f"{allowed}/logs/42.log"

    monkeypatch.setenv(job_exit.DIRECTORIES_VARIABLE, f"{allowed}:/nonexistent/spool")
    engine = make_engine(store)  # the worker's settings are read when the machine is made
    with pytest.raises(InvalidData, match=re.escape(
            f"userlog '{other}/43.log' is outside the directories "
            f"{job_exit.DIRECTORIES_VARIABLE} allows ({allowed}:/nonexistent/spool)")):
        engine.create("job_exit", "43.0", job(43, 0, other))
    with pytest.raises(InvalidData, match="is outside the directories"):
        engine.create("job_exit", "43.0", job(43, 0, allowed, output_ad=f"{allowed}x/43.ad"))
    assert [r.key for r in engine.resources()] == ["42.0"]
    engine.create("job_exit", "44.0", job(44, 0, allowed))
    (allowed / "45.log").symlink_to(other / "45.log")  # inside by name, outside in fact
    engine.create("job_exit", "45.0", job(45, 0, allowed))
    for key in ("44.0", "45.0"):
        engine.fire(key, "exited", {"exit_code": 0})
    Worker(engine).run_until_idle()
    assert engine.get("44.0").state == "done" and len(events(allowed / "44.log")) == 1
    assert engine.get("45.0").state == "stuck_userlog"
    [failed] = effect_records(engine, statuses=("failed",))
    assert f"resolves to {other}/45.log, outside {job_exit.DIRECTORIES_VARIABLE}" in (
        failed.last_error or "")
    assert not (other / "45.log").exists()
    monkeypatch.setenv(job_exit.DIRECTORIES_VARIABLE, "relative/dir")
    with pytest.raises(LifecycleError, match="is not an absolute path"):
        job_exit.settings_from_environment()


# -- the verified append reads what it compares, no more ------------------------------------


class _Progress:
    """An effect call's progress, without the rest of the call."""

    def __init__(self, progress: dict[str, Any]) -> None:
        self.progress = dict(progress)

    def save_progress(self, values: dict[str, Any]) -> None:
        self.progress.update(values)


def test_the_verified_append_reads_only_the_bytes_it_compares(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[int] = []
    real_open = open

    class Counting:
        def __init__(self, handle: Any) -> None:
            self.handle = handle

        def __enter__(self) -> Counting:
            return self

        def __exit__(self, *exc: object) -> None:
            self.handle.close()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.handle, name)

        def read(self, size: int = -1) -> bytes:
            data: bytes = self.handle.read(size)
            read.append(len(data))
            return data

    monkeypatch.setattr(file_writes, "open", lambda *a, **k: Counting(real_open(*a, **k)),
                        raising=False)
    log = tmp_path / "shared.log"
    record = b"005 (042.000.000) 2026-12-02 10:01:00 Job terminated.\n...\n"
    log.write_bytes(b"000 (001.000.000) ...\n...\n" + record + b"x" * (4 << 20))
    call = _Progress({"userlog": 26})  # an earlier attempt wrote the record at 26
    assert file_writes.verified_append(call, log, record, name="userlog") is False  # type: ignore[arg-type]
    assert sum(read) == len(record)
    read.clear()
    # at 0 there is something else, but the record is further down (the log was rewritten
    # since): found by reading the file once, no further, and not appended again
    other = _Progress({"userlog": 0})
    assert file_writes.verified_append(other, log, record, name="userlog") is False  # type: ignore[arg-type]
    assert sum(read) <= len(record) + log.stat().st_size
    assert log.read_bytes().count(record) == 1
    read.clear()
    fresh = record.replace(b"042.000.000", b"043.000.000")   # a record the file lacks
    assert file_writes.verified_append(_Progress({"userlog": 0}), log, fresh, name="userlog")  # type: ignore[arg-type]
    assert sum(read) <= len(fresh) + log.stat().st_size
    assert log.read_bytes().endswith(b"x" * 100 + fresh)


def test_a_retry_on_dev_full_fails_at_once_instead_of_reading_without_end(tmp_path: Path) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    program = (
        "import sys\n"
        "from lifecycle.file_writes import verified_append\n"
        "class Call:\n"
        "    progress = {'userlog': 0}\n"
        "    def save_progress(self, values): self.progress.update(values)\n"
        "try:\n"
        "    verified_append(Call(), '/dev/full', b'005 ...\\n...\\n', name='userlog')\n"
        "except OSError as exc:\n"
        "    print(exc.strerror)\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parents[1])
    assert done.stdout.strip() == "No space left on device", done.stderr[-2000:]


# -- fidelity: what HTCondor's own code writes --------------------------------------------------
# The expected texts below follow HTCondor's C code line by line, with its printf formats:
# ULogEvent::formatHeader and TerminatedEvent::formatBody (src/condor_utils/condor_event.cpp),
# with what LocalUserLog::logTerminate sets (src/condor_starter.V6.1/local_user_log.cpp);
# Email::writeJobId, writeExit and email_close (src/condor_utils/email_cpp.cpp, email.cpp);
# format_time (src/condor_utils/format_time.cpp); printExitString (classad_helpers.cpp).

_LIBC = ctypes.CDLL(None)
_LIBC.strsignal.restype = ctypes.c_char_p


def printf(form: str, *args: Any) -> str:
    """C's printf, for HTCondor's own format strings."""
    return form % args


def condor_header(number: int, cluster: int, proc: int, clock: int, *, utc: bool = False,
                  iso: bool = True, usec: int | None = None) -> str:
    lt = time.gmtime(clock) if utc else time.localtime(clock)
    out = printf("%03d (%03d.%03d.%03d) ", number, cluster, proc, 0)
    if iso:
        out += printf("%04d-%02d-%02d %02d:%02d:%02d", lt.tm_year, lt.tm_mon, lt.tm_mday,
                      lt.tm_hour, lt.tm_min, lt.tm_sec)
    else:
        out += printf("%02d/%02d %02d:%02d:%02d", lt.tm_mon, lt.tm_mday, lt.tm_hour,
                      lt.tm_min, lt.tm_sec)
    if usec is not None:
        out += printf(".%03d", usec // 1000)
    if utc:
        out += "Z"
    return out + " "


def condor_rusage(usr_secs: int, sys_secs: int) -> str:
    def split(secs: int) -> tuple[int, int, int, int]:
        return secs // 86400, secs % 86400 // 3600, secs % 3600 // 60, secs % 60

    return printf("\tUsr %lld %02lld:%02lld:%02lld, Sys %lld %02lld:%02lld:%02lld".replace(
        "ll", ""), *split(usr_secs), *split(sys_secs))


def condor_terminated_body(payload: dict[str, Any]) -> str:
    out = "Job terminated.\n"
    if "exit_signal" not in payload:
        out += printf("\t(1) Normal termination (return value %d)\n\t", payload["exit_code"])
    else:
        out += printf("\t(0) Abnormal termination (signal %d)\n", payload["exit_signal"])
        if payload.get("core_file"):  # the shadow's core_file; the local starter's is empty
            out += printf("\t(1) Corefile in: %s\n\t", payload["core_file"])
        else:
            out += printf("\t(0) No core file\n\t")
    local = condor_rusage(int(payload.get("remote_user_cpu", 0.0)),  # (time_t) casts
                          int(payload.get("remote_sys_cpu", 0.0)))
    out += condor_rusage(0, 0) + "  -  Run Remote Usage\n\t"
    out += local + "  -  Run Local Usage\n\t"
    out += condor_rusage(0, 0) + "  -  Total Remote Usage\n\t"
    out += condor_rusage(0, 0) + "  -  Total Local Usage\n"
    for what in ("Run Bytes Sent By", "Run Bytes Received By", "Total Bytes Sent By",
                 "Total Bytes Received By"):
        out += printf("\t%.0f  -  %s %s\n", 0.0, what, "Job")  # JICLocal::bytesSent() is 0
    return out + "...\n"


def condor_format_time(secs: int) -> str:
    return printf("%3d+%02d:%02d:%02d", secs // 86400, secs % 86400 // 3600,
                  secs % 3600 // 60, secs % 60)


def condor_mail_body(data: dict[str, Any], payload: dict[str, Any], now: int) -> str:
    """Email::writeExit (with writeJobId), then writeCustom, at ``now``, for the job's ad."""
    ad = data.get("ad", {})
    q_date = int(dt.datetime.fromisoformat(data["submitted_at"]).timestamp())
    shadow_bday = int(dt.datetime.fromisoformat(data["started_at"]).timestamp())
    out = printf('This is an automated email from the Condor system\non machine "%s".  Do not '
                 "reply.\n\n", data["submit_host"])
    out += printf("Condor job %d.%d\n", data["cluster"], data["proc"])
    args = ad.get("Arguments", ad.get("Args", ""))
    out += printf("\t%s", data["cmd"]) + (printf(" %s\n", args) if args else "\n")
    if ad.get("JobBatchName"):
        out += printf("\tfrom batch %s\n", ad["JobBatchName"])
    if ad.get("Iwd"):
        out += printf("\tsubmitted from directory %s\n", ad["Iwd"])
    if "exit_signal" in payload:
        signal_text = _LIBC.strsignal(payload["exit_signal"]).decode()
        reason = "died on " + printf("signal %d (%s)", payload["exit_signal"], signal_text)
        out += printf("%s\n", reason)
    else:
        out += printf("%s\n", "exited normally with status " + str(payload["exit_code"]))
    if "core_file" in payload:
        out += "Core file generated\n"
    out += printf("\n\nSubmitted at:        %s", time.ctime(q_date) + "\n")
    out += printf("Completed at:        %s", time.ctime(now) + "\n")
    out += printf("Real Time:           %s\n", condor_format_time(now - q_date))
    out += "\n"
    out += printf("Virtual Image Size:  %d Kilobytes\n\n", payload.get("image_size", 0))
    user, system = payload.get("remote_user_cpu", 0.0), payload.get("remote_sys_cpu", 0.0)
    wall = now - shadow_bday
    out += "Statistics from last run:\n"
    out += printf("Allocation/Run time:     %s\n", condor_format_time(wall))
    out += printf("Remote User CPU Time:    %s\n", condor_format_time(int(user)))
    out += printf("Remote System CPU Time:  %s\n", condor_format_time(int(system)))
    out += printf("Total Remote CPU Time:   %s\n\n", condor_format_time(int(user + system)))
    out += "Statistics totaled from all runs:\n"
    previous = ad.get("RemoteWallClockTime", 0.0)
    out += printf("Allocation/Run time:     %s\n", condor_format_time(int(previous + wall)))
    custom = [name for name in re.split(r"[\s,]+", ad.get("EmailAttributes", "")) if name in ad]
    if custom:
        out += "\n\n" + "".join(printf("%s = %s\n", name, str(classad2.ExprTree(
            json.dumps(ad[name])))) for name in custom)
    out += "\n\n-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=\n"
    out += "Questions about this message or HTCondor in general?\n"
    out += "The Official HTCondor Homepage is https://htcondor.org/\n"
    return out


JOB_AD = {"Iwd": "/home/alice/run 7", "Arguments": "-n 3 'input file.dat'",
          "JobBatchName": "nightly", "EmailAttributes": "RequestMemory, Site NotThere",
          "RequestMemory": 2048, "Site": "T2_DE", "RemoteWallClockTime": 600.0,
          "UidDomain": "example.org"}
"""What nearly every job ad has beside the exit: a submit directory, arguments, a batch
name, and here attributes the user wants in the mail and an earlier run's wall time."""


FIDELITY = {
    "normal exit": exit_payload(exit_code=0),
    "an exit code": exit_payload(exit_code=3, remote_user_cpu=90061.9, wall_clock=200000.5),
    "a signal without core file": exit_payload(exit_code=None, exit_signal=9,
                                               image_size=0),
    "a signal with a core file": exit_payload(exit_code=None, exit_signal=11,
                                              core_file="/home/alice/core.4242"),
}


@pytest.mark.parametrize("case", list(FIDELITY))
def test_log_ad_and_mail_are_what_htcondor_writes(case: str, db_url: str, tmp_path: Path,
                                                  clock: SimulatedClock, chicago: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(job_exit.USERLOG_FORMAT_VARIABLE, raising=False)  # HTCondor's default
    payload = FIDELITY[case]
    data = job(42, 0, tmp_path, notification="Always", submitted_at="2026-12-02T09:00:00Z",
               started_at="2026-12-02T09:05:00Z", ad=JOB_AD)
    clock.advance(90)                       # the starter reports the exit a moment later
    mailed = int(clock.now().timestamp())
    with MailSink() as sink:
        engine = make_engine(Store(db_url, upgrade=True), clock,
                             mailer=smtp.SmtpMailer(sink.url, sender="condor@example.org"))
        engine.create("job_exit", "42.0", data)
        engine.fire("42.0", "exited", payload)
        Worker(engine).run_until_idle()
        assert engine.get("42.0").state == "done"
        [mail] = sink.received
    exited = int(EXITED_AT.timestamp())

    # the user log: HTCondor's text, and every field of the event as htcondor2 reads it
    text = (tmp_path / "42.log").read_text()
    assert text == condor_header(5, 42, 0, exited) + condor_terminated_body(payload)
    [event] = events(tmp_path / "42.log")
    local = condor_rusage(int(payload["remote_user_cpu"]), int(payload["remote_sys_cpu"]))
    expected: dict[str, Any] = {
        "MyType": "JobTerminatedEvent", "EventTypeNumber": 5, "Cluster": 42, "Proc": 0,
        "Subproc": 0, "EventTime": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(exited)),
        "TerminatedNormally": "exit_signal" not in payload,
        "RunRemoteUsage": "Usr 0 00:00:00, Sys 0 00:00:00",
        "RunLocalUsage": local.strip(),
        "TotalRemoteUsage": "Usr 0 00:00:00, Sys 0 00:00:00",
        "TotalLocalUsage": "Usr 0 00:00:00, Sys 0 00:00:00",
        "SentBytes": 0.0, "ReceivedBytes": 0.0, "TotalSentBytes": 0.0,
        "TotalReceivedBytes": 0.0}
    if "exit_signal" in payload:
        expected["TerminatedBySignal"] = payload["exit_signal"]
    else:
        expected["ReturnValue"] = payload["exit_code"]
    if "core_file" in payload:
        expected["CoreFile"] = payload["core_file"]
    assert dict(event.items()) == expected
    assert event.timestamp == exited

    # the output ad: the whole job ad in the old syntax, as fPrintAd writes it, attribute
    # by attribute with the real ad's types
    text = (tmp_path / "42.0.ad").read_text()
    [ad] = classad2.parseAds(text, classad2.ParserType.Old)
    wanted = expected_ad(data, payload)
    assert text == str(classad2.ClassAd(wanted).printOld())
    assert sorted(ad.keys()) == sorted(wanted)
    for name, value in wanted.items():
        assert (name, type(ad[name]), ad[name]) == (name, type(value), value)
    assert ad["JobStartDate"] == int(dt.datetime(2026, 12, 2, 9, 5, tzinfo=dt.UTC).timestamp())

    # the mail: HTCondor's recipient (Owner at the ad's UidDomain), subject and body, line
    # by line
    assert mail.rcpt_tos == ("alice@example.org",)
    assert mail.subject == "[Condor] Condor Job 42.0"
    assert mail.body.splitlines() == condor_mail_body(data, payload, mailed).splitlines()
    assert mail.body == condor_mail_body(data, payload, mailed)
    assert mail.message["Content-Transfer-Encoding"] == "7bit"  # plain text, as HTCondor's


@pytest.mark.parametrize(("options", "utc", "iso", "sub_second"), [
    ("UTC", True, True, False),
    ("utc, SUB_SECOND", True, True, True),
    ("SUB_SECOND", False, True, True),
    ("LEGACY", False, False, False),
    ("LEGACY !LEGACY UTC", True, True, False),
    ("UTC !UTC", False, True, False),
])
def test_the_user_log_date_follows_htcondors_format_options(
        sqlite_url: str, tmp_path: Path, chicago: str, monkeypatch: pytest.MonkeyPatch,
        options: str, utc: bool, iso: bool, sub_second: bool) -> None:
    monkeypatch.setenv(job_exit.USERLOG_FORMAT_VARIABLE, options)
    engine = make_engine(Store(sqlite_url, upgrade=True))
    engine.create("job_exit", "42.0", job(42, 0, tmp_path))
    when = EXITED_AT.replace(microsecond=456789)
    engine.fire("42.0", "exited", {"exit_code": 0, "exited_at": when.isoformat()})
    Worker(engine).run_until_idle()
    header = (tmp_path / "42.log").read_text().split("Job terminated.")[0]
    assert header == condor_header(5, 42, 0, int(when.timestamp()), utc=utc, iso=iso,
                                   usec=456789 if sub_second else None)
    if iso:  # the legacy date has no year: a reader guesses it
        [event] = events(tmp_path / "42.log")
        assert event.timestamp == int(when.timestamp())


@pytest.mark.parametrize(("variable", "value", "message"), [
    (job_exit.USERLOG_FORMAT_VARIABLE, "XML", "'XML' is not a user log format option"),
    (job_exit.MAX_RETRIES_VARIABLE, "nan", "'nan' is not a whole number"),
    (job_exit.MAX_RETRIES_VARIABLE, "-1", "'-1' is not a whole number"),
    (job_exit.RETRY_DELAY_VARIABLE, "1.5", "'1.5' is not a whole number"),
    (job_exit.RETRY_DELAY_VARIABLE, "inf", "'inf' is not a whole number"),
    ("LIFECYCLE_JOB_EXIT_ATTEMPTS", "6", "is no longer read: set "
                                         "LIFECYCLE_JOB_EXIT_MAX_RETRIES"),
])
def test_bad_settings_are_refused_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(LifecycleError, match=re.escape(message)):
        job_exit.settings_from_environment()


def test_the_retry_knobs_mean_what_htcondors_mean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (job_exit.MAX_RETRIES_VARIABLE, job_exit.RETRY_DELAY_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    assert job_exit.settings_from_environment().retry == Retry(
        max_attempts=6, base=30.0, cap=30.0, jitter=0.0)
    monkeypatch.setenv(job_exit.MAX_RETRIES_VARIABLE, "0")  # no retry: one attempt
    monkeypatch.setenv(job_exit.RETRY_DELAY_VARIABLE, "10")
    assert job_exit.settings_from_environment().retry == Retry(
        max_attempts=1, base=10.0, cap=10.0, jitter=0.0)


class TimedQueue(FaultyQueue):
    """A queue that never answers and notes the simulated time of each call."""

    def __init__(self, clock: SimulatedClock) -> None:
        super().__init__(fail_times=10**6)
        self.clock = clock
        self.times: list[dt.datetime] = []

    def complete(self, job: JobId, ad: Any, *, key: str, now: dt.datetime) -> Any:
        self.times.append(self.clock.now())
        return super().complete(job, ad, key=key, now=now)


def test_six_attempts_of_the_queue_update_30_s_apart_with_the_defaults(
        db_url: str, tmp_path: Path, clock: SimulatedClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (job_exit.MAX_RETRIES_VARIABLE, job_exit.RETRY_DELAY_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    store = Store(db_url, upgrade=True)
    queue = TimedQueue(clock)
    engine = make_engine(store, clock, queue=queue, retry=None)
    engine.create("job_exit", "42.0", job(42, 0, tmp_path))
    engine.fire("42.0", "exited", {"exit_code": 0})
    worker = Worker(engine)
    worker.run_until_idle()
    start = clock.now()
    while engine.get("42.0").state == "updating_queue":
        calls = len(queue.times)
        clock.advance(29)
        worker.run_until_idle()
        assert len(queue.times) == calls  # not a second early: no jitter
        clock.advance(1)
        worker.run_until_idle()
    assert engine.get("42.0").state == "stuck_queue"
    assert [(t - start).total_seconds() for t in queue.times] == [0, 30, 60, 90, 120, 150]
    clock.advance(3600)
    worker.run_until_idle()
    assert len(queue.times) == 6
    [failed] = effect_records(engine, statuses=("failed",))
    assert (failed.name, failed.attempts) == ("update_job_queue", 6)
    store.dispose()


def test_the_queue_takes_the_terminal_attributes_and_keeps_its_own(db_url: str,
                                                                     tmp_path: Path) -> None:
    """As HTCondor's terminate update: the exit attributes change, the job's QDate,
    JobStartDate, owner and the rest stay the queue's."""
    store = Store(db_url, upgrade=True)
    own = {"Owner": "alice", "Cmd": "/home/alice/analyse", "QDate": 100, "JobStartDate": 200,
           "JobUniverse": 12, "RequestCpus": 4}
    submit(store, JobId(42, 0), own)
    engine = make_engine(store)
    engine.create("job_exit", "42.0", job(42, 0, tmp_path, submitted_at="2026-12-02T09:00:00Z",
                                          started_at="2026-12-02T09:05:00Z"))
    payload = exit_payload(exit_code=None, exit_signal=11, core_file="/tmp/core.42")
    engine.fire("42.0", "exited", payload)
    Worker(engine).run_until_idle()
    found = queue_ad(store, JobId(42, 0))
    assert found is not None
    terminal = {k: v for k, v in expected_ad(job(42, 0, tmp_path), payload).items()
                if k in htcondor.TERMINAL_ATTRIBUTES}
    assert found.ad == {"ClusterId": 42, "ProcId": 0, **own, **terminal}
    assert found.ad["ExitReason"] == "died on signal 11 (Segmentation fault)"
    store.dispose()


def test_the_exit_guard_refuses_any_field_but_the_exit_fields(slow: bool) -> None:
    """Each field of the job's data alone, then payloads mixing exit fields, data fields and
    any text: 50 by default (each data field is tried alone already), 200 with --slow."""
    for field in sorted(job_exit.JobExitData.model_fields):
        _exit_guard_judges({field: 1})

    @settings(max_examples=200 if slow else 50, deadline=None)
    @given(st.dictionaries(st.one_of(st.sampled_from(job_exit.EXIT_FIELDS),
                                     st.sampled_from(sorted(job_exit.JobExitData.model_fields)),
                                     st.text(min_size=1, max_size=20)),
                           st.integers(), max_size=6))
    def mixed(payload: dict[str, int]) -> None:
        _exit_guard_judges(payload)

    mixed()


def _exit_guard_judges(payload: dict[str, int]) -> None:
    """The exit guard passes ``payload`` if it holds exit fields only, else refuses it naming
    the first other field."""
    context = GuardContext(machine="job_exit", key="42.0", state="running", version=1,
                           data={"cluster": 42, "proc": 0}, payload=payload,
                           now=EXITED_AT)
    extra = sorted(set(payload) - set(job_exit.EXIT_FIELDS))
    if not extra:
        assert job_exit.exit_fields_only(context) is True
        return
    with pytest.raises(ValueError, match=re.escape(f"carries {extra[0]!r}")):
        job_exit.exit_fields_only(context)
