"""A real one-node Slurm on this machine, for the tests and for users who want to try
`bench slurm` / `bench sweep --slurm` before their cluster: munged (unless one already
runs), slurmctld and slurmd in the foreground as this process's children, with their
configuration, state, spool, logs and pids in one folder; stopped by the pids it wrote,
never by name. Needs root and Debian's slurm-wlm and munge (`apt-get install slurm-wlm
munge`).

    python3 scripts/slurm_local.py up FOLDER     # prints `export SLURM_CONF=...`
    python3 scripts/slurm_local.py down FOLDER

``NamespaceCluster`` is a Slurm of several nodes on this machine, for the tests: each node a
network namespace of benchmarks/testbed.py (its own address on a shared link), slurmctld
beside node 0's slurmd, and every node's processes seeing an /etc/hosts of their own that
names the nodes and gives this machine's host name the node's address (what gloo binds to).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DAEMONS = ("slurmctld", "slurmd", "munged", "sinfo", "sbatch", "srun")
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")


def missing() -> str | None:
    """Why a local Slurm cannot start here, or None."""
    absent = [name for name in DAEMONS if shutil.which(name) is None
              and not Path(f"/usr/sbin/{name}").exists()]
    if absent:
        return (f"{', '.join(absent)} not installed (Debian: apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        return "slurmd must run as root here (it starts tasks as the submitting user)"
    return None


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def config(folder: Path, cpus: int) -> str:
    """A one-node cluster on ports free now (so it never meets another local Slurm)."""
    host = socket.gethostname()
    return "\n".join([
        "ClusterName=bench-local", f"SlurmctldHost={host}", "SlurmUser=root",
        "AuthType=auth/munge", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill", "ReturnToService=2", "MpiDefault=none",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        f"StateSaveLocation={folder / 'state'}", f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}", f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}", f"SlurmdLogFile={folder / 'slurmd.log'}",
        "JobCompType=jobcomp/none", "KillWait=5", "MinJobAge=300",
        "SlurmctldTimeout=30", "SlurmdTimeout=30", "InactiveLimit=0",
        f"NodeName={host} CPUs={cpus} State=UNKNOWN",
        f"PartitionName=local Nodes={host} Default=YES MaxTime=INFINITE State=UP "
        "OverSubscribe=FORCE:4",
        # a site's usual partition: jobs share a node's free cores, and --exclusive (which
        # FORCE above overrides) gives a job the node whole
        f"PartitionName=shared Nodes={host} MaxTime=INFINITE State=UP OverSubscribe=NO",
        "",
    ])


def env_for(folder: Path) -> dict[str, str]:
    """The environment Slurm's commands need to find this cluster."""
    return {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}


def _wait(what: str, check, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise RuntimeError(f"local Slurm: {what} within {timeout:.0f} s")


def _on_every_cpu() -> None:
    """A node's daemons own the whole node. Started from a process pinned to some cores (a
    pytest-xdist worker is), slurmd gave its tasks only those: a task of 2 CPUs got 1."""
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or a smaller cpuset
        os.sched_setaffinity(0, range(os.cpu_count() or 1))


def up(folder: Path, cpus: int | None = None, timeout: float = 60.0) -> dict[str, int]:
    """Start the daemons (their pids are written to FOLDER/pids.json as they start) and wait
    until `sinfo` shows the node idle; on any failure, stop what was started."""
    why = missing()
    if why:
        raise RuntimeError(f"local Slurm cannot start: {why}")
    folder.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool"):
        (folder / sub).mkdir(exist_ok=True)
    cpus = cpus or os.cpu_count() or 1
    (folder / "slurm.conf").write_text(config(folder, cpus))
    pids: dict[str, int] = {}
    started = time.monotonic()

    def keep(name: str, proc: subprocess.Popen) -> None:
        pids[name] = proc.pid
        (folder / "pids.json").write_text(json.dumps(pids))

    try:
        if not MUNGE_SOCKET.exists():
            Path("/run/munge").mkdir(parents=True, exist_ok=True)
            munged = subprocess.Popen([_binary("munged"), "--foreground", "--force"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True)
            keep("munged", munged)
            _wait("munged's socket", MUNGE_SOCKET.exists, timeout)
        env = env_for(folder)
        for name in ("slurmctld", "slurmd"):
            with open(folder / f"{name}.out", "w") as log:
                proc = subprocess.Popen([_binary(name), "-D", "-f", str(folder / "slurm.conf")],
                                        stdout=log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True, preexec_fn=_on_every_cpu)
            keep(name, proc)
            time.sleep(0.5)
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited at once: "
                                   f"{(folder / f'{name}.out').read_text()[-2000:]}")

        def idle() -> bool:
            out = subprocess.run([_binary("sinfo"), "-h", "-o", "%T"], env=env,
                                 capture_output=True, text=True)
            return out.returncode == 0 and out.stdout.strip() == "idle"

        _wait("the node idle in sinfo", idle, timeout)
    except BaseException:
        down(folder)
        raise
    pids["seconds"] = round(time.monotonic() - started, 1)
    (folder / "pids.json").write_text(json.dumps(pids))
    return pids


def down(folder: Path, grace: float = 10.0) -> None:
    """Stop exactly the daemons ``up`` started (their pids from FOLDER/pids.json), slurmd
    first, then slurmctld and munged; each gets SIGTERM, then SIGKILL. Then what their jobs
    left: a job still running when slurmd stops keeps its slurmstepd and its tasks (a test
    that failed mid-job left bench ranks holding port 20001, and the next cluster's first
    job died of EADDRINUSE); every process whose environment names this cluster's
    slurm.conf is ended the same way."""
    path = folder / "pids.json"
    if not path.exists():
        return
    pids = json.loads(path.read_text())
    for name in ("slurmd", "slurmctld", "munged"):
        if pids.get(name):
            _stop(pids[name], grace)
    # SIGTERM, then SIGKILL to what outlived the grace. A signal is delivered, not yet
    # done: after each, wait until they are gone or zombies (under load a killed slurmstepd
    # and its tasks were still alive when this returned: a test saw 6 of them).
    for how in (signal.SIGTERM, signal.SIGKILL):
        for pid in left_by_jobs(folder):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, how)
        deadline = time.monotonic() + grace
        while left_by_jobs(folder) and time.monotonic() < deadline:
            time.sleep(0.1)
    path.unlink()


def left_by_jobs(folder: Path) -> list[int]:
    """The live processes (this one and its ancestors aside) whose environment holds
    SLURM_CONF=FOLDER/slurm.conf: slurmstepd and the tasks of this cluster's jobs."""
    mark = b"\0" + f"SLURM_CONF={folder / 'slurm.conf'}".encode() + b"\0"
    spared, pid = set(), os.getpid()
    while pid > 1:
        spared.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or a kernel thread
            continue
        if mark in b"\0" + environ + b"\0" and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _stop(pid: int, grace: float = 10.0) -> None:
    """SIGTERM, up to ``grace`` seconds to end (reaped where it is this process's child),
    then SIGKILL."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child (a `down` from another process)
            done = 0 if _alive(pid) else pid
        if done:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _alive(pid: int) -> bool:
    """Whether daemon ``pid`` runs (a zombie does not); a process reaped between the two
    looks is gone, not an error."""
    try:
        os.kill(pid, 0)
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except (ProcessLookupError, FileNotFoundError):
        return False


class NamespaceCluster:
    """A ``nodes``-node Slurm on this machine, the nodes ``n0``, ``n1``... in network
    namespaces joined by a link of ``rate_mbit`` (benchmarks/testbed.py, whose reaper ends
    whatever still runs in them when it closes, kill -9 of this process included). Slurm's
    commands run in a node with ``command(node, argv)`` and ``env()``. Its processes enter
    the node's network namespace alone (``ip netns exec`` would mount a sysfs without the
    cgroup tree slurmd needs) and a private mount namespace where the node's hosts file is
    bound over /etc/hosts."""

    def __init__(self, folder: Path, nodes: int = 2, rate_mbit: float = 10000,
                 index: int = 60, timeout: float = 60.0) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from benchmarks.testbed import Testbed

        self.folder, self.nodes, self.timeout = folder, nodes, timeout
        self.net = Testbed(nodes=nodes, rate_mbit=rate_mbit, index=index)
        self.pids: dict[str, int] = {}
        self.seconds = math.nan

    def name(self, node: int) -> str:
        return f"n{node}"

    def config(self) -> str:
        host, folder = socket.gethostname(), self.folder
        names = f"n[0-{self.nodes - 1}]"
        return "\n".join([
            "ClusterName=bench-nodes", f"SlurmctldHost={host}({self.net.address(0)})",
            "SlurmUser=root", "AuthType=auth/munge", "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU", "ReturnToService=2", "MpiDefault=none",
            # each node has an address of its own: the same ports on every one
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            f"StateSaveLocation={folder / 'state'}", f"SlurmdSpoolDir={folder / 'spool-%n'}",
            f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
            f"SlurmdPidFile={folder / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={folder / 'slurmctld.log'}",
            f"SlurmdLogFile={folder / 'slurmd-%n.log'}",
            "JobCompType=jobcomp/none", "KillWait=5", "MinJobAge=300",
            "SlurmctldTimeout=30", "SlurmdTimeout=30", "InactiveLimit=0",
            *[f"NodeName={self.name(k)} NodeAddr={self.net.address(k)} CPUs=1 State=UNKNOWN"
              for k in range(self.nodes)],
            f"PartitionName=nodes Nodes={names} Default=YES MaxTime=INFINITE State=UP", ""])

    def command(self, node: int, argv: list[str]) -> list[str]:
        """``argv`` on ``node``: its network, its /etc/hosts."""
        hosts = self.folder / f"hosts-{self.name(node)}"
        return ["nsenter", f"--net=/run/netns/{self.net.namespace(node)}", "unshare",
                "--mount", "--propagation", "private", "sh", "-c",
                f'mount --bind "{hosts}" /etc/hosts && exec "$@"', "sh", *argv]

    def env(self) -> dict[str, str]:
        return env_for(self.folder)

    def __enter__(self) -> NamespaceCluster:
        why = missing()
        if why:
            raise RuntimeError(f"local Slurm cannot start: {why}")
        started = time.monotonic()
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "state").mkdir(exist_ok=True)
        self.net.__enter__()
        try:
            host = socket.gethostname()
            for k in range(self.nodes):
                (self.folder / f"spool-{self.name(k)}").mkdir(exist_ok=True)
                (self.folder / f"hosts-{self.name(k)}").write_text(
                    f"127.0.0.1 localhost\n{self.net.address(k)} {host}\n"
                    + "".join(f"{self.net.address(j)} {self.name(j)}\n"
                              for j in range(self.nodes)))
            (self.folder / "slurm.conf").write_text(self.config())
            if not MUNGE_SOCKET.exists():
                Path("/run/munge").mkdir(parents=True, exist_ok=True)
                self.pids["munged"] = subprocess.Popen(
                    [_binary("munged"), "--foreground", "--force"], stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, start_new_session=True).pid
                _wait("munged's socket", MUNGE_SOCKET.exists, self.timeout)
            conf = str(self.folder / "slurm.conf")
            daemons = [("slurmctld", 0, [_binary("slurmctld"), "-D", "-f", conf])] + [
                (f"slurmd-{self.name(k)}", k,
                 [_binary("slurmd"), "-D", "-N", self.name(k), "-f", conf])
                for k in range(self.nodes)]
            for name, node, argv in daemons:
                with open(self.folder / f"{name}.out", "w") as log:
                    proc = subprocess.Popen(self.command(node, argv), stdout=log,
                                            stderr=subprocess.STDOUT, env=self.env(),
                                            start_new_session=True)
                self.pids[name] = proc.pid  # nsenter, unshare and sh exec it: its own pid
                time.sleep(0.5)
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited at once: "
                                       f"{(self.folder / f'{name}.out').read_text()[-2000:]}")

            def idle() -> bool:
                out = subprocess.run(self.command(0, [_binary("sinfo"), "-h", "-o", "%T"]),
                                     env=self.env(), capture_output=True, text=True)
                return out.returncode == 0 and out.stdout.split() == ["idle"]

            _wait(f"{self.nodes} nodes idle in sinfo", idle, self.timeout)
        except BaseException:
            self.__exit__()
            raise
        self.seconds = round(time.monotonic() - started, 1)
        return self

    def __exit__(self, *exc: object) -> None:
        """The slurmds, slurmctld and a munged this started, by pid; then the namespaces."""
        order = [n for n in self.pids if n.startswith("slurmd")] + ["slurmctld", "munged"]
        for name in order:
            if self.pids.get(name):
                _stop(self.pids[name])
        self.net.close()


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("up", "down"):
        print(__doc__, file=sys.stderr)
        return 2
    folder = Path(argv[1]).resolve()
    if argv[0] == "up":
        pids = up(folder)
        print(f"local Slurm up in {pids['seconds']} s (pids in {folder / 'pids.json'}); "
              f"export SLURM_CONF={folder / 'slurm.conf'}")
        # the daemons must outlive this process: they run in their own sessions
        return 0
    down(folder)
    print("local Slurm down")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
