"""The Slurm site against a real single-node Slurm (the session's: slurmctld, slurmd,
munged; see tests/slurm_cluster.py). Skipped when the Slurm binaries are missing or the tests
do not run as root, except with LIFECYCLE_REQUIRE_SLURM=1 (set by .ci/run), which makes
that a failure."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from slurm_cluster import SlurmCluster

from lifecycle.adapters.sites import BOOTING, DELETED, ERROR, RUNNING, STOPPED, Drone, SiteError
from lifecycle.adapters.slurm import SlurmSite, resource_status, run_command


class Recorder:
    """A runner that runs the real command and remembers it; ``before``/``after`` hooks let a
    test act at an exact point between the site's commands."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.after: dict[str, Callable[[], None]] = {}

    def __call__(self, argv: Sequence[str], timeout: float,
                 env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        done = run_command(argv, timeout, env)
        hook = self.after.pop(" ".join(argv[:2]), None)
        if hook is not None:
            hook()
        return done

    def commands(self) -> list[str]:
        return [" ".join(c[:2]) if c[0] == "scontrol" else c[0] for c in self.calls]


@pytest.fixture
def make_site(cluster: SlurmCluster) -> Callable[..., tuple[SlurmSite, Recorder]]:
    def make(**options: Any) -> tuple[SlurmSite, Recorder]:
        recorder = Recorder()
        # the job says when its script has started (squeue says RUNNING a little before)
        options.setdefault("wrap", f"touch {markers(cluster)}/{{name}}; exec sleep 300")
        # jobs run and write their output in the cluster's directory, not the checkout
        options["sbatch_options"] = [f"--chdir={cluster.directory}",
                                     f"--output={cluster.directory}/log/job-%j.out",
                                     *options.get("sbatch_options", ())]
        site = SlurmSite(environment={"SLURM_CONF": str(cluster.conf)}, runner=recorder,
                         timeout=20, **options)
        return site, recorder

    return make


@pytest.fixture
def site(make_site: Callable[..., tuple[SlurmSite, Recorder]]) -> SlurmSite:
    return make_site()[0]


def markers(cluster: SlurmCluster) -> Path:
    path = cluster.directory / "markers"
    path.mkdir(mode=0o777, exist_ok=True)
    return path


def started(cluster: SlurmCluster, d: Drone, timeout: float = 15) -> None:
    """Wait until the drone's job runs its script."""
    deadline = time.monotonic() + timeout
    while not (markers(cluster) / d.name).exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"job {d.remote_id} of {d.name} has not started: "
                                 f"{cluster.job_state(str(d.remote_id))}")
        time.sleep(0.02)
    assert cluster.job_state(str(d.remote_id)) == "RUNNING"


def drone(remote_id: str | None = None) -> Drone:
    return Drone(f"drone-{uuid.uuid4().hex[:8]}", remote_id)


def deployed(site: SlurmSite) -> Drone:
    d = drone()
    return Drone(d.name, site.deploy(d))


# -- deploy and status ------------------------------------------------------------------------


def test_deploy_submits_a_job_named_after_the_drone(
    cluster: SlurmCluster, make_site: Callable[..., tuple[SlurmSite, Recorder]]
) -> None:
    site, recorder = make_site(sbatch_options=["--comment=drone {name}"])
    d = drone()
    job = site.deploy(d)
    assert job.isdigit()
    assert recorder.calls[0][:3] == ["sbatch", "--parsable", f"--job-name={d.name}"]
    assert cluster.run("squeue", "-h", "-o", "%j|%k", f"--job={job}").strip() == \
        f"{d.name}|drone {d.name}"
    assert site.status([Drone(d.name, job)])[d.name] in (BOOTING, RUNNING)
    started(cluster, Drone(d.name, job))
    assert site.status([Drone(d.name, job)]) == {d.name: RUNNING}


def test_status_of_many_drones_is_one_squeue_call(
    cluster: SlurmCluster, make_site: Callable[..., tuple[SlurmSite, Recorder]]
) -> None:
    site, recorder = make_site()
    held_site, _ = make_site(sbatch_options=["--hold"])
    quick_site, _ = make_site(wrap="true")
    running = [deployed(site) for _ in range(3)]
    pending = deployed(held_site)
    finished = deployed(quick_site)
    cancelled = deployed(site)
    cluster.run("scancel", str(cancelled.remote_id))
    for d in running:
        started(cluster, d)
    cluster.wait_for_state(str(finished.remote_id), "COMPLETED")
    cluster.wait_for_state(str(cancelled.remote_id), "CANCELLED")
    unknown, never = drone("99999999"), drone(None)
    drones = [*running, pending, finished, cancelled, unknown, never]

    recorder.calls.clear()
    statuses = site.status(drones)

    assert len(recorder.calls) == 1, recorder.calls
    (argv,) = recorder.calls
    assert argv[:7] == ["squeue", "-o", "%A|%N|%T", "-h", "-t", "all",
                        "--job=" + ",".join(str(d.remote_id) for d in drones[:-1])]
    assert statuses == {
        **{d.name: RUNNING for d in running},
        pending.name: BOOTING,
        finished.name: DELETED,
        cancelled.name: DELETED,
        unknown.name: DELETED,
        never.name: DELETED,
    }


def test_a_job_slurm_does_not_know_is_deleted(
    make_site: Callable[..., tuple[SlurmSite, Recorder]]
) -> None:
    site, recorder = make_site()
    unknown = drone("99999998")
    # alone, squeue exits 1 with "Invalid job id specified"
    assert site.status([unknown]) == {unknown.name: DELETED}
    assert len(recorder.calls) == 1


def test_squeue_refusing_a_list_over_one_unknown_id_falls_back_to_one_at_a_time(
    cluster: SlurmCluster, make_site: Callable[..., tuple[SlurmSite, Recorder]]
) -> None:
    """Some Slurm versions fail the whole list for one unknown id (exit 1, partial output);
    this one does not, so the refusal is played by a runner in front of the real squeue."""
    site, recorder = make_site()
    alive = deployed(site)
    started(cluster, alive)
    unknown = drone("99999997")

    def refusing(argv: Sequence[str], timeout: float,
                 env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
        if argv[0] == "squeue" and "," in argv[-1]:
            return subprocess.CompletedProcess(
                list(argv), 1, "", "slurm_load_jobs error: Invalid job id specified\n")
        return recorder(argv, timeout, env)

    site.runner = refusing
    recorder.calls.clear()
    assert site.status([alive, unknown]) == {alive.name: RUNNING, unknown.name: DELETED}
    assert [c[-1] for c in recorder.calls] == [f"--job={alive.remote_id}",
                                                f"--job={unknown.remote_id}"]


def test_slurm_job_states_map_as_in_tardis() -> None:
    assert [resource_status(s) for s in ("PENDING", "CONFIGURING", "REQUEUED")] == [BOOTING] * 3
    assert [resource_status(s) for s in ("RUNNING", "COMPLETING", "SIGNALING")] == [RUNNING] * 3
    assert [resource_status(s) for s in ("SUSPENDED", "STOPPED")] == [STOPPED] * 2
    assert [resource_status(s) for s in ("COMPLETED", "CANCELLED", "PREEMPTED", "TIMEOUT")] == [
        DELETED] * 4
    assert [resource_status(s) for s in ("FAILED", "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY",
                                         "DEADLINE")] == [ERROR] * 5


# -- errors -----------------------------------------------------------------------------------


def test_a_refused_submission_is_a_site_error_with_slurms_message(
    make_site: Callable[..., tuple[SlurmSite, Recorder]]
) -> None:
    site, _ = make_site(sbatch_options=["--partition=no-such-partition"])
    with pytest.raises(SiteError, match=r"sbatch .*failed \(exit 1\).*Invalid partition"):
        site.deploy(drone())


def test_a_missing_command_is_a_site_error_naming_it(
    make_site: Callable[..., tuple[SlurmSite, Recorder]]
) -> None:
    site, _ = make_site(squeue="/nonexistent/squeue")
    with pytest.raises(SiteError, match=r"/nonexistent/squeue.*command not found"):
        site.status([drone("1")])


def test_a_command_that_does_not_answer_is_a_site_error(
    make_site: Callable[..., tuple[SlurmSite, Recorder]]
) -> None:
    # a prefix puts a sleeping Python in front (squeue's arguments become its argv); it is
    # killed after the timeout
    site, _ = make_site(command_prefix=[sys.executable, "-c", "import time; time.sleep(5)"])
    site.timeout = 0.2
    with pytest.raises(SiteError, match=r"no answer within 0.2 s"):
        site.status([drone("1")])


def test_a_controller_that_is_down_is_a_site_error_with_slurms_message(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(cluster.conf.read_text().replace(f"SlurmctldPort={cluster.ctld_port}",
                                                     "SlurmctldPort=1")
                    + "MessageTimeout=1\n")
    site = SlurmSite(wrap="true", environment={"SLURM_CONF": str(conf)})
    with pytest.raises(SiteError, match=r"squeue .* failed \(exit 1\).*Unable to contact"):
        site.status([drone("1"), drone("2")])
    with pytest.raises(SiteError, match=r"scontrol hold 1 failed \(exit 1\): "):
        site.terminate(drone("1"), BOOTING)
    with pytest.raises(SiteError, match=r"scancel -v --state=RUNNING 1 failed"):
        site.terminate(drone("1"), RUNNING)


def test_a_site_needs_a_script_or_a_command() -> None:
    with pytest.raises(ValueError, match="exactly one of script"):
        SlurmSite()
    with pytest.raises(ValueError, match="exactly one of script"):
        SlurmSite(script=["/bin/drone"], wrap="sleep 1")


# -- stop and terminate -----------------------------------------------------------------------


def test_stop_cancels_the_job(cluster: SlurmCluster, site: SlurmSite) -> None:
    d = deployed(site)
    started(cluster, d)
    site.stop(d)
    cluster.wait_for_state(str(d.remote_id), "CANCELLED")
    assert site.status([d]) == {d.name: DELETED}
    site.stop(d)  # again, on a finished job: nothing happens, no error


def test_stop_with_a_signal_only_signals(cluster: SlurmCluster,
                                         make_site: Callable[..., tuple[SlurmSite, Recorder]]
                                         ) -> None:
    # the drone's script shuts down by itself (here: after a second) on SIGTERM
    site, recorder = make_site(
        stop_signal="TERM",
        wrap=f"trap 'sleep 1; exit 0' TERM; touch {markers(cluster)}/{{name}}; sleep 300 & wait")
    d = deployed(site)
    started(cluster, d)
    site.stop(d)
    assert recorder.calls[-1] == ["scancel", "--full", "--signal=TERM", str(d.remote_id)]
    assert cluster.job_state(str(d.remote_id)) == "RUNNING"
    cluster.wait_for_state(str(d.remote_id), "COMPLETED")


def test_terminate_expecting_running_kills_a_running_job(cluster: SlurmCluster,
                                                         site: SlurmSite) -> None:
    d = deployed(site)
    started(cluster, d)
    outcome = site.terminate(d, RUNNING)
    assert outcome.acted, outcome
    cluster.wait_for_state(str(d.remote_id), "CANCELLED")


def test_terminate_expecting_running_leaves_a_pending_job(
    cluster: SlurmCluster, make_site: Callable[..., tuple[SlurmSite, Recorder]]
) -> None:
    site, _ = make_site(sbatch_options=["--hold"])
    d = deployed(site)
    outcome = site.terminate(d, RUNNING)
    assert not outcome.acted
    assert outcome.detail == f"job {d.remote_id} is PENDING, not RUNNING: left alone"
    assert cluster.job_state(str(d.remote_id)) == "PENDING"


def test_a_drone_job_that_starts_between_probe_and_terminate_is_not_killed(
    cluster: SlurmCluster, make_site: Callable[..., tuple[SlurmSite, Recorder]]
) -> None:
    """The race of TARDIS issue #172: the status says Booting, the job starts running, then
    the drone, still believing Booting, terminates it. The fence leaves it running."""
    site, recorder = make_site(sbatch_options=["--hold"])
    d = deployed(site)
    job = str(d.remote_id)
    assert site.status([d]) == {d.name: BOOTING}  # the probe

    cluster.run("scontrol", "release", job)  # the site starts the drone's job
    started(cluster, d)

    recorder.calls.clear()
    outcome = site.terminate(d, expect=BOOTING)
    assert recorder.commands() == ["scontrol hold", "scancel", "squeue", "scontrol release"]

    assert not outcome.acted
    assert outcome.detail == f"job {job} is RUNNING, not PENDING: left alone"
    time.sleep(0.5)  # a kill would show by now (KillWait does not apply to SIGKILL)
    assert cluster.job_state(job) == "RUNNING"
    assert site.status([d]) == {d.name: RUNNING}
    # the hold that guarded the cancel was undone: the running job is not left held
    reason = cluster.run("squeue", "-h", "-o", "%r", f"--job={job}").strip()
    assert "Held" not in reason


def test_terminate_expecting_booting_removes_a_still_pending_job(
    cluster: SlurmCluster, make_site: Callable[..., tuple[SlurmSite, Recorder]]
) -> None:
    site, _ = make_site(sbatch_options=["--hold"])
    d = deployed(site)
    assert site.status([d]) == {d.name: BOOTING}

    outcome = site.terminate(d, expect=BOOTING)

    assert outcome.acted, outcome
    assert cluster.job_state(str(d.remote_id)) == "CANCELLED"
    assert cluster.run("squeue", "-h", "-t", "all", "-o", "%N",
                       f"--job={d.remote_id}").strip() == ""  # never ran on a node


def test_the_hold_keeps_a_job_from_starting_inside_scancels_own_window(
    cluster: SlurmCluster, make_site: Callable[..., tuple[SlurmSite, Recorder]]
) -> None:
    """scancel --state=PENDING decides on the client, then kills: a job that starts in
    between would die. Here the job becomes startable right after the hold (its dependency
    ends) and is given time to start; held, it does not, and the cancel removes it."""
    site, recorder = make_site()
    blocker = deployed(site)
    started(cluster, blocker)
    waiting_site, _ = make_site(sbatch_options=[f"--dependency=afterany:{blocker.remote_id}"])
    d = deployed(waiting_site)
    job = str(d.remote_id)
    cluster.wait_for_state(job, "PENDING")

    def dependency_ends() -> None:
        cluster.run("scancel", str(blocker.remote_id))
        cluster.wait_for_state(str(blocker.remote_id), "CANCELLED")
        time.sleep(1.0)  # an unheld job starts ~0.1 s after its dependency ends
        assert cluster.job_state(job) == "PENDING"

    recorder.after["scontrol hold"] = dependency_ends
    outcome = site.terminate(d, expect=BOOTING)

    assert not recorder.after, "the hook ran"
    assert outcome.acted, outcome
    assert cluster.job_state(job) == "CANCELLED"


def test_a_terminate_whose_scancel_fails_leaves_the_job_held_and_a_retry_finishes_it(
    cluster: SlurmCluster, make_site: Callable[..., tuple[SlurmSite, Recorder]]
) -> None:
    site, recorder = make_site(sbatch_options=["--begin=now+3600"])
    d = deployed(site)
    job = str(d.remote_id)

    def failing(argv: Sequence[str], timeout: float,
                env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
        if argv[0] == "scancel":
            return subprocess.CompletedProcess(
                list(argv), 1, "", "scancel: error: slurm_load_jobs error: Socket timed out\n")
        return recorder(argv, timeout, env)

    site.runner = failing
    with pytest.raises(SiteError, match=rf"Socket timed out \(job {job} was held first"):
        site.terminate(d, BOOTING)
    assert cluster.run("squeue", "-h", "-o", "%T|%r", f"--job={job}").strip() == \
        "PENDING|JobHeldAdmin"

    site.runner = recorder
    outcome = site.terminate(d, BOOTING)
    assert outcome.acted, outcome
    assert cluster.job_state(job) == "CANCELLED"


def test_without_the_hold_that_job_would_have_started(
    cluster: SlurmCluster, make_site: Callable[..., tuple[SlurmSite, Recorder]]
) -> None:
    """The control for the test above: the same dependency, no hold, and the job runs."""
    site, _ = make_site()
    blocker = deployed(site)
    started(cluster, blocker)
    waiting_site, _ = make_site(sbatch_options=[f"--dependency=afterany:{blocker.remote_id}"])
    d = deployed(waiting_site)
    cluster.wait_for_state(str(d.remote_id), "PENDING")
    cluster.run("scancel", str(blocker.remote_id))
    started(cluster, d, timeout=1.0)


def test_terminate_without_expectation_cancels_whatever_the_job_is(
    cluster: SlurmCluster, make_site: Callable[..., tuple[SlurmSite, Recorder]]
) -> None:
    site, _ = make_site()
    held_site, _ = make_site(sbatch_options=["--hold"])
    running, pending = deployed(site), deployed(held_site)
    started(cluster, running)
    assert site.terminate(running, None).acted
    assert site.terminate(pending, None).acted
    cluster.wait_for_state(str(running.remote_id), "CANCELLED")
    assert cluster.job_state(str(pending.remote_id)) == "CANCELLED"


def test_terminate_of_a_finished_or_unknown_job_does_not_act(
    cluster: SlurmCluster, make_site: Callable[..., tuple[SlurmSite, Recorder]]
) -> None:
    site, _ = make_site(wrap="true")
    finished = deployed(site)
    cluster.wait_for_state(str(finished.remote_id), "COMPLETED")
    for expect in (None, BOOTING, RUNNING):
        outcome = site.terminate(finished, expect)
        assert not outcome.acted, (expect, outcome)
        assert outcome.detail.startswith(f"job {finished.remote_id}"), (expect, outcome)
        assert not site.terminate(drone("99999996"), expect).acted
        assert not site.terminate(drone(None), expect).acted
    assert cluster.job_state(str(finished.remote_id)) == "COMPLETED"


def test_terminate_cannot_fence_on_a_status_scancel_cannot_filter(site: SlurmSite) -> None:
    with pytest.raises(ValueError, match="cannot fence"):
        site.terminate(drone("1"), "Unknown")
    assert not site.terminate(drone("1"), DELETED).acted


def test_terminate_fenced_on_error_cancels_nothing_and_spares_a_job_that_left_it(
    cluster: SlurmCluster, make_site: Callable[..., tuple[SlurmSite, Recorder]]
) -> None:
    failing, failing_calls = make_site(wrap="exit 3")
    failed = deployed(failing)
    cluster.wait_for_state(str(failed.remote_id), "FAILED")
    assert failing.status([failed]) == {failed.name: ERROR}
    outcome = failing.terminate(failed, ERROR)
    assert not outcome.acted
    assert outcome.detail == f"job {failed.remote_id} is FAILED: it has ended, nothing to cancel"
    assert "scancel" not in failing_calls.commands()
    site, recorder = make_site()
    running = deployed(site)
    started(cluster, running)
    recorder.calls.clear()
    outcome = site.terminate(running, ERROR)   # the decision saw Error; the job runs now
    assert not outcome.acted and "no longer in an error state: left alone" in outcome.detail
    assert recorder.commands() == ["squeue"]
    assert cluster.job_state(str(running.remote_id)) == "RUNNING"
