"""A real single-node Slurm for tests: a munged of its own (own key, own socket), slurmctld and
slurmd, all in the foreground as children of the test process (they get SIGTERM should it
die), with a slurm.conf in a directory of their own under ``$TMPDIR/lifecycle-slurm`` on a
free port pair; client commands find it through SLURM_CONF. Nothing is shared with a system
Slurm or munged, so two test runs can each have a cluster at once.

Each cluster records its owner (the test process) and its daemons' process ids in its
directory. A new cluster first cleans up after runs whose owner is dead: it stops their
daemons (by recorded pid, only if the command line still names that run's directory) and
the slurmstepd processes that outlived them (recognised by that run's SLURM_CONF in their
environment) with the jobs under them, and removes the directory."""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

BINARIES = ("sbatch", "squeue", "scancel", "scontrol", "sinfo", "slurmctld", "slurmd", "munged")
ROOT = Path(tempfile.gettempdir()) / "lifecycle-slurm"
PR_SET_PDEATHSIG = 1


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if _which(name) is None]


def _which(name: str) -> str | None:
    # slurmctld, slurmd and munged live in sbin, which a non-login PATH may lack
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/local/sbin"
    return shutil.which(name, path=path)


class ClusterError(RuntimeError):
    pass


@dataclass
class SlurmCluster:
    """A running single-node cluster; ``env`` points the client commands at it."""

    directory: Path
    conf: Path
    node: str
    ctld_port: int
    slurmd_port: int
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    startup_seconds: float = 0.0

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True, timeout: float = 15) -> str:
        """Run a client command against this cluster; its stdout."""
        done = subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            raise ClusterError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def job_state(self, job_id: str) -> str:
        """The job's state as squeue prints it ('' when squeue no longer knows it)."""
        done = subprocess.run(
            ["squeue", "-h", "-t", "all", "-o", "%T", f"--job={job_id}"],
            env=self.env, capture_output=True, text=True, timeout=15, check=False,
        )
        return done.stdout.strip()

    def wait_for_state(self, job_id: str, *states: str, timeout: float = 15) -> str:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in states:
                return state
            time.sleep(0.05)
        raise ClusterError(f"job {job_id} is {state or 'gone'}, not {'/'.join(states)} "
                           f"after {timeout} s\n{self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        out = []
        for name in ("slurmctld", "slurmd"):
            path = self.directory / "log" / f"{name}.log"
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {path}\n" + "\n".join(tail))
        return "\n".join(out)

    def clear(self, timeout: float = 30) -> None:
        """Cancel every job and wait until squeue lists none (pending, running or
        completing): the tests after meet none of them, and have the node's CPUs."""
        if not self.run("squeue", "-h", "-o", "%A").strip():
            return
        self.run("scancel", "--user", pwd.getpwuid(os.getuid()).pw_name)
        deadline = time.monotonic() + timeout
        while left := self.run("squeue", "-h", "-o", "%A|%T").split():
            if time.monotonic() > deadline:
                raise ClusterError(f"jobs still listed {timeout} s after scancel: "
                                   f"{' '.join(left)}\n{self.log_tail()}")
            time.sleep(0.05)

    def stop(self, remove: bool = True) -> None:
        """Cancel what still runs, stop the daemons by pid, remove the directory (with
        ``remove=False``, empty it for another start but for the logs)."""
        if self.processes.get("slurmctld") and self.processes["slurmctld"].poll() is None:
            with contextlib.suppress(Exception):
                self.clear(timeout=5)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.processes.pop(name, None)
            if proc is not None:
                _stop_process(proc.pid, proc)
        if remove:
            shutil.rmtree(self.directory, ignore_errors=True)
            return
        for sub in ("state", "spool", "run", "munge"):
            shutil.rmtree(self.directory / sub, ignore_errors=True)
            (self.directory / sub).mkdir(mode=0o755)


def start_cluster(timeout: float = 30) -> SlurmCluster:
    """Start munged if needed, then slurmctld and slurmd on free ports; wait until the node
    is idle."""
    if os.geteuid() != 0:
        raise ClusterError("starting slurmctld/slurmd needs root (SlurmUser=root)")
    missing = missing_binaries()
    if missing:
        raise ClusterError(f"Slurm/munge binaries missing: {', '.join(missing)}")
    began = time.monotonic()
    cleanup_leftovers()
    ROOT.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="run-", dir=ROOT))
    directory.chmod(0o755)  # munged wants its socket's directories searchable by all
    (directory / "owner").write_text(str(os.getpid()))
    for sub in ("state", "spool", "run", "log", "munge"):
        (directory / sub).mkdir(mode=0o755)
    node = socket.gethostname().split(".")[0]
    conf = directory / "slurm.conf"
    for attempt in range(1, PORT_ATTEMPTS + 1):
        # a pair that was free a moment ago may be taken by another test run's cluster
        # before its daemons bind it: then the next pair
        ctld_port, slurmd_port = _free_port_pair()
        conf.write_text(_slurm_conf(directory, node, ctld_port, slurmd_port))
        cluster = SlurmCluster(directory, conf, node, ctld_port, slurmd_port)
        try:
            _start(cluster, "munged", _munged_argv(directory))
            _wait_munged(cluster)
            for name in ("slurmctld", "slurmd"):
                _start(cluster, name, [str(_which(name)), "-D", "-f", str(conf)])
            _wait_idle(cluster, began + timeout)
        except ClusterError as exc:
            cluster.stop(remove=False)
            if "Address already in use" not in str(exc) or attempt == PORT_ATTEMPTS:
                cluster.stop()
                raise
            continue
        except BaseException:
            cluster.stop()
            raise
        break
    cluster.startup_seconds = time.monotonic() - began
    return cluster


def _slurm_conf(d: Path, node: str, ctld_port: int, slurmd_port: int) -> str:
    return f"""\
ClusterName=lifecycle
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge/munge.socket
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=1
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
NodeName={node} NodeAddr=127.0.0.1 CPUs=8 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def cleanup_leftovers() -> None:
    """Clean up after earlier runs whose owner process is dead (see the module docstring)."""
    if not ROOT.is_dir():
        return
    for directory in ROOT.glob("run-*"):
        if _live(directory):
            continue
        for owned in (directory / "run").glob("*.owned"):
            with contextlib.suppress(ValueError, OSError):
                pid = int(owned.read_text().strip())
                if str(directory) in _cmdline(pid):
                    _stop_process(pid, None)
    _kill_stale_jobs()
    for directory in ROOT.glob("run-*"):
        if not _live(directory):
            shutil.rmtree(directory, ignore_errors=True)


def _live(directory: Path) -> bool:
    """Whether the run in ``directory`` may still be in use: its owner is alive, or it has
    no owner yet and was created in the last minute."""
    try:
        owner = int((directory / "owner").read_text().strip())
    except (OSError, ValueError):
        try:
            return time.time() - directory.stat().st_mtime < 60
        except OSError:
            return False
    return _alive(owner)


def _kill_stale_jobs() -> None:
    """The slurmstepd processes (and the jobs under them) that outlived a dead run's slurmd:
    recognised by the SLURM_CONF of that run in their environment."""
    stepds: list[int] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or not _cmdline(int(proc.name)).startswith("slurmstepd"):
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for entry in environ:
            if entry.startswith(b"SLURM_CONF=" + str(ROOT).encode() + b"/"):
                run = Path(entry.split(b"=", 1)[1].decode()).parent
                if not _live(run):
                    stepds.append(int(proc.name))
    if not stepds:
        return
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if proc.name.isdigit() and _parent(int(proc.name)) in stepds:
                os.killpg(os.getpgid(int(proc.name)), signal.SIGKILL)
    for pid in stepds:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _stop_process(pid: int, proc: subprocess.Popen[bytes] | None) -> None:
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(wait)
                return
        else:
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.05)
            if not _alive(pid):
                return


def _alive(pid: int) -> bool:
    """Running (a zombie, waiting for a parent that is not us to reap it, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


PORT_ATTEMPTS = 5


def _free_port_pair() -> tuple[int, int]:
    """Two adjacent free ports, from a random place in a wide range: clusters of test runs
    started at the same moment rarely pick the same pair (and retry when they do)."""
    bases = list(range(20000, 40000, 2))
    random.SystemRandom().shuffle(bases)
    for base in bases[:500]:
        if _port_free(base) and _port_free(base + 1):
            return base, base + 1
    raise ClusterError("no free port pair for slurmctld/slurmd between 20000 and 40000")


def _munged_argv(directory: Path) -> list[str]:
    munge = directory / "munge"
    key = munge / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o400)
    return [str(_which("munged")), "--foreground", f"--socket={munge}/munge.socket",
            f"--key-file={key}", f"--pid-file={munge}/munged.pid",
            f"--log-file={directory}/log/munged.log", f"--seed-file={munge}/munged.seed"]


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the test process dies (Linux prctl)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _start(cluster: SlurmCluster, name: str, argv: list[str]) -> None:
    with open(cluster.directory / "log" / f"{name}.out", "wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=cluster.env, start_new_session=True, preexec_fn=_die_with_parent,
        )
    cluster.processes[name] = proc
    (cluster.directory / "run" / f"{name}.owned").write_text(str(proc.pid))


def _wait_munged(cluster: SlurmCluster) -> None:
    socket_path = cluster.directory / "munge" / "munge.socket"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if socket_path.exists():
            return
        proc = cluster.processes["munged"]
        if proc.poll() is not None:
            out = (cluster.directory / "log" / "munged.out").read_text(errors="replace")
            raise ClusterError(f"munged exited with {proc.returncode}: {out.strip()}")
        time.sleep(0.02)
    raise ClusterError(f"munged did not create {socket_path} within 10 s")


def _wait_idle(cluster: SlurmCluster, deadline: float) -> None:
    state = ""
    while time.monotonic() < deadline:
        for name, proc in cluster.processes.items():
            if proc.poll() is not None:
                raise ClusterError(f"{name} exited with {proc.returncode}\n{cluster.log_tail()}")
        done = subprocess.run(
            ["sinfo", "-h", "-N", "-n", cluster.node, "-o", "%t"],
            env=cluster.env, capture_output=True, text=True, timeout=10, check=False,
        )
        state = done.stdout.strip()
        if done.returncode == 0 and state == "idle":
            return
        time.sleep(0.05)
    raise ClusterError(f"node {cluster.node} is {state!r}, not idle\n{cluster.log_tail()}")


@contextlib.contextmanager
def running_cluster() -> Iterator[SlurmCluster]:
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()
