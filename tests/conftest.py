"""Shared fixtures: a fresh database per test on SQLite (a file) and on PostgreSQL (a database
of its own, emptied or dropped afterwards), at the code's revision or empty
(tests/databases.py); and each test's marker, ``unit``, ``integration`` or ``system`` (see
ARCHITECTURE.md, "The test suite")."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from databases import Templates

from lifecycle import Store


@pytest.fixture(scope="session")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Templates]:
    """The migrated templates of this process (each pytest-xdist worker has its own)."""
    made = Templates(tmp_path_factory.mktemp("templates"))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def postgres_url(templates: Templates) -> Iterator[str]:
    """A PostgreSQL database of this test's own at the code's revision (a copy of the
    session's migrated template, or one an earlier test left as it was and that was emptied);
    its connections are named after it and counted at the end."""
    with templates.postgres() as url:
        yield url


@pytest.fixture
def counted(postgres_url: str) -> Iterator[Any]:
    """A proxy between a test's store and ``postgres_url`` that counts round trips (the
    benchmarks' ``benchmarks/netproxy.py``: a burst of messages after the server's answer is
    one; ``tests/databases.round_trips`` counts an operation's). While ``round_trips``
    counts, each message waits 50 ms on its way to the server, so that what the client sends
    without waiting is one burst however slowly a busy machine sends it (else the server
    could answer a pipeline's first statements before the client sent the next, and one
    round trip would count as two); the rest of the test (its setup, its warm-up) goes
    through without the delay."""
    from benchmarks.netproxy import Proxy

    proxy = Proxy(postgres_url, delay_ms=0)
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def empty_postgres_url(templates: Templates) -> Iterator[str]:
    """A PostgreSQL database of this test's own with no lifecycle schema: for the tests of
    migrating and of what happens before it."""
    with templates.postgres(empty=True) as url:
        yield url


_CACHE: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """The machines' index (lifecycle/machines/index.py) is a cache file in
    $XDG_CACHE_HOME: the tests, in process and the commands they start, write theirs in a
    directory of this session's (of each xdist worker's), never in the user's ~/.cache."""
    import tempfile

    # what the tests fetch once for every run (mermaid from npm: tests/render/chromium.py)
    # stays in the user's cache, or each session would install it again (some 15 s)
    os.environ.setdefault("LIFECYCLE_USER_CACHE", os.environ.get("XDG_CACHE_HOME") or "")
    _CACHE.append(tempfile.mkdtemp(prefix="lifecycle-test-cache-"))
    os.environ["XDG_CACHE_HOME"] = _CACHE[-1]


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    while _CACHE:
        shutil.rmtree(_CACHE.pop(), ignore_errors=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow", action="store_true", default=os.environ.get("LIFECYCLE_TEST_SLOW") == "1",
        help="run the model, crash and race tests at their larger sizes (as a nightly run "
             "would; also LIFECYCLE_TEST_SLOW=1): more examples, crashes and processes")


@pytest.fixture(scope="session")
def slow(request: pytest.FixtureRequest) -> bool:
    """Whether the expensive tests run at their larger size (``--slow``); by default each is
    sized to find what it is for in seconds."""
    return bool(request.config.getoption("--slow"))


PROCESS_GRACE_SECONDS = 30.0
"""How long a process the test ended may take to exit after the test (a killed worker's
exit is noticed by the kernel, not at once)."""
KEPT_PROCESSES = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
"""Children Python's multiprocessing keeps for the rest of the session, by design."""


def _state_and_parent(pid: int | str) -> tuple[str, int]:
    """A process's state letter and parent pid, from /proc/PID/stat (after the command's
    name in parentheses, which may itself hold spaces and parentheses)."""
    state, ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:2]
    return state, int(ppid)


def _child_pids(me: int) -> set[int]:
    """The pids whose parent is this process: the kernel's list of each thread's children
    (/proc/PID/task/TID/children, a few small reads), else a scan of every process's
    /proc/PID/stat (a thousand reads on a busy machine, which twice per test cost seconds)."""
    tasks = f"/proc/{me}/task"
    try:
        found = set()
        for tid in os.listdir(tasks):
            with open(f"{tasks}/{tid}/children") as listed:
                found.update(int(pid) for pid in listed.read().split())
        return found
    except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN, or a thread ended
        pass
    found = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError):
                if _state_and_parent(entry.name)[1] == me:
                    found.add(int(entry.name))
    return found


def _children() -> dict[int, str]:
    """This process's children still running (not zombies): their command lines by pid."""
    me, found = os.getpid(), {}
    for pid in _child_pids(me):
        try:
            state, ppid = _state_and_parent(pid)
            if ppid != me or state == "Z":
                continue
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, ValueError):  # it ended meanwhile
            continue
        found[pid] = command.decode(errors="replace").strip()
    return found


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A test that leaves a process it started running fails, naming it (the process is
    killed, so that it cannot disturb the tests after it). A test that failed has what it
    left killed at once, without failing again. Fixtures' processes (a Slurm cluster, a
    browser) are theirs to stop."""
    if not os.path.isdir("/proc"):
        return (yield)
    before = set(_children())
    try:
        outcome = yield
    except BaseException:
        _kill(_left(before))
        raise
    deadline = time.monotonic() + PROCESS_GRACE_SECONDS
    while (left := _left(before)) and time.monotonic() < deadline:
        time.sleep(0.05)
    _kill(left)
    if left:
        pytest.fail("the test left processes running: " + "; ".join(
            f"{pid} {command[:200]}" for pid, command in left.items()), pytrace=False)
    return outcome


def _left(before: set[int]) -> dict[int, str]:
    """This process's children running now that were not before, but those kept by design."""
    return {pid: command for pid, command in _children().items()
            if pid not in before and not any(k in command for k in KEPT_PROCESSES)}


def _kill(processes: dict[int, str]) -> None:
    for pid in processes:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def forkserver() -> Iterator[Any]:
    """A warm fork server of this session's (each xdist worker's) that runs the installed
    ``lifecycle`` program for the tests that run it as a user does (tests/zygote.py): the
    child of a process that imported it once, with the caller's argv, environment and
    stdio, instead of a new interpreter importing it again for each command."""
    import sys

    from zygote import Server

    server = Server(str(Path(sys.executable).with_name("lifecycle"))).start()
    try:
        yield server
    finally:
        server.close()


REQUIRE_SLURM = os.environ.get("LIFECYCLE_REQUIRE_SLURM") == "1"


@pytest.fixture(scope="session")
def slurm_session() -> Iterator[Any]:
    """A single-node Slurm (munged, slurmctld, slurmd) for the session (per xdist worker):
    starting one costs a second and a half, and a fresh slurmctld schedules its first job a
    second later than the next; skipped without the Slurm packages or root, unless
    LIFECYCLE_REQUIRE_SLURM=1. Tests take it through ``cluster``."""
    from slurm_cluster import missing_binaries, start_cluster

    problem = None
    missing = missing_binaries()
    if missing:
        problem = f"Slurm binaries missing: {', '.join(missing)}"
    elif os.geteuid() != 0:
        problem = "starting slurmctld/slurmd needs root"
    if problem:
        if REQUIRE_SLURM:
            pytest.fail(f"LIFECYCLE_REQUIRE_SLURM=1 but {problem}")
        pytest.skip(problem)
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def cluster(slurm_session: Any) -> Iterator[Any]:
    """The session's Slurm, with no job of another module's in it (the Slurm site's and the
    dispatcher's tests each leave jobs the other must not meet): at the module's end every
    job is cancelled, and waited for until none is pending, running or completing."""
    slurm_session.clear()
    yield slurm_session
    slurm_session.clear()


@pytest.fixture
def sqlite_url(tmp_path: Path, templates: Templates) -> str:
    """A SQLite file at the code's revision (a copy of the session's migrated template)."""
    return templates.sqlite(tmp_path / "lifecycle.db")


@pytest.fixture
def empty_sqlite_url(tmp_path: Path, templates: Templates) -> str:
    """A SQLite file not made yet: for the tests of migrating and of what happens before."""
    return templates.sqlite(tmp_path / "unmigrated.db", empty=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Each test that takes it runs once on a SQLite file and once on PostgreSQL, each at the
    code's revision."""
    name = "sqlite_url" if request.param == "sqlite" else "postgres_url"
    return str(request.getfixturevalue(name))


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_db_url(request: pytest.FixtureRequest) -> str:
    """As db_url, with no lifecycle schema yet."""
    name = "empty_sqlite_url" if request.param == "sqlite" else "empty_postgres_url"
    return str(request.getfixturevalue(name))


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    store = Store(db_url, upgrade=True)
    try:
        yield store
    finally:
        store.dispose()


# -- markers: each test is unit, integration or system ----------------------------------------

SYSTEM_MODULES = {
    "test_slurm_site",  # a real single-node Slurm
    "test_slurm_dispatch",
    "test_dashboard_browser",  # Chromium, through chromedriver
    "test_effects_processes",  # worker processes killed with SIGKILL, real signals
    "test_readme",  # every page's examples in bash: the demo, servers, a mail server
    "test_worker_claims",  # worker processes paused with SIGSTOP past their leases
}
SYSTEM_TESTS = {
    # the demo, as a user runs it
    "test_the_demo_next_steps_run_as_printed_and_show_the_story",
    "test_lifecycle_demo_twice_in_one_folder_prints_the_same_figures",
    # crashes: processes killed, or killing themselves, at random points
    "test_a_killed_workers_claims_are_taken_over_within_its_lease",
    "test_crashes_at_random_points_across_many_exits",
    "test_fast_shutdown_while_the_queue_hangs",
}
SYSTEM_FIXTURES = {"cluster", "browser", "mermaid_page"}
DATABASE_FIXTURES = {"postgres_url", "sqlite_url", "db_url", "store", "empty_postgres_url",
                     "empty_sqlite_url", "empty_db_url", "templates"}
INTEGRATION_MODULES = {
    "test_concurrency",  # processes racing on one database
    "test_migrations",
    "test_old_databases",  # databases written at every earlier revision, upgraded
    "test_worker_faults",
    "test_cli",  # `lifecycle` on a database, in a subprocess too
    "test_cli_output",  # the installed program in a subprocess
    "test_startup",  # what a fresh interpreter imports
    "test_show",
    "test_scenario",  # scenarios replay on a SQLite file
    "test_sim",  # the simulations, on a SQLite file
    "test_dashboard",
    "test_hostile",
    "test_job_exit",
    "test_drone",
    "test_tardis",
    "test_prepare_job_hook",  # lifecycle serve and the hook, in subprocesses
    "test_cobald_daemon",  # COBalD's daemon in a subprocess, on a SQLite file
    "test_engine_model",  # the engine against its model, on both databases
    "test_check",  # counterexamples replayed on a SQLite file
    "test_check_property",
}
INTEGRATION_TESTS = {
    # Graphviz's dot in a subprocess
    "test_diagrams_check_sees_an_edited_svg",
    "test_diagram_command_formats_and_files",
    "test_the_checked_in_diagrams_are_current",
    "test_graphviz_draws_every_machine",
    # a store of their own
    "test_states_named_on_and_off_are_strings",
    "test_a_data_field_timeout_out_of_range_is_invalid_data",
    "test_the_simulation_reproduces_the_incident_and_the_fix",
    # the startd's FETCH_WORK hook, a program run in a subprocess
    "test_fetch_work_hook_reads_the_slot_ad_and_prints_a_job_ad",
    "test_fetch_work_hook_empty_output_is_no_work",
    "test_a_hook_that_exits_non_zero_fails_with_its_status",
    "test_a_hook_that_hangs_is_killed_at_its_timeout",
    "test_a_hook_that_prints_300_mb_is_killed_at_the_limit",
}
LEVELS = ("unit", "integration", "system")


def level_of(item: pytest.Item) -> str:
    """A test's marker when it names none itself: system for what needs real Slurm, Chromium,
    processes crashing or the demo; integration for what opens a database or starts a
    process; unit for the rest (which the unit_stays_in_process fixture holds to that)."""
    module = item.path.stem
    name = getattr(item, "originalname", item.name)
    fixtures = set(getattr(item, "fixturenames", ()))
    if module in SYSTEM_MODULES or name in SYSTEM_TESTS or fixtures & SYSTEM_FIXTURES:
        return "system"
    if module in INTEGRATION_MODULES or name in INTEGRATION_TESTS or \
            fixtures & DATABASE_FIXTURES:
        return "integration"
    return "unit"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        named = [level for level in LEVELS if item.get_closest_marker(level)]
        if not named:
            item.add_marker(getattr(pytest.mark, level_of(item)))
        elif len(named) > 1:
            raise pytest.UsageError(f"{item.nodeid} is marked {' and '.join(named)}: a test is "
                                    "exactly one of unit, integration and system")


@pytest.fixture(autouse=True)
def unit_stays_in_process(request: pytest.FixtureRequest,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit test opens no database and starts no process: were it to, it fails, naming the
    marker it should have (``-m unit`` is what runs in a minute, with no service)."""
    if request.node.get_closest_marker("unit") is None:
        return
    import multiprocessing.process
    import subprocess

    import lifecycle.store

    def refuse(what: str) -> Any:
        def refused(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"a unit test {what}: mark it integration or system "
                                 "(tests/conftest.py)")
        return refused

    monkeypatch.setattr(lifecycle.store.Store, "__init__", refuse("opened a Store"))
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("started a process"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start",
                        refuse("started a process"))
