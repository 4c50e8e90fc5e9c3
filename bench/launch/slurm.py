"""More than one machine: Slurm's variables, rendezvous ids, and sbatch scripts."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass
from typing import Any

SLURM_VARS = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_NODELIST")


@dataclass
class SlurmTask:
    """This process as one task of an ``srun`` step: one rank."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    nodes: int
    master_addr: str
    job_id: str
    step_id: str

    def default_port(self) -> int:
        """Every task derives the same port from the job id, in 20000-32767: below Linux's
        ephemeral ports (32768-60999), one of which a task that connects before the store
        listens may be given as its own and connect to itself."""
        digits = re.sub(r"\D", "", self.job_id) or "0"
        return 20000 + int(digits) % 12768


def note_forced_sharing(command: str, partition: str | None) -> None:
    """Where ``partition`` shares its nodes by force, ``command`` (bench sweep, bench
    slurm) says on stderr that the --exclusive it was given does nothing there."""
    from bench.tools import terminal

    forced = forced_sharing(partition)
    if forced:
        print(terminal.fill(f"{command}: note: {forced}", subsequent_indent="  "),
              file=sys.stderr)


def forced_sharing(partition: str | None) -> str | None:
    """A note where ``partition`` (None: the cluster's default) shares its nodes by force
    (``OverSubscribe=FORCE``): Slurm then ignores a job's --exclusive, and other jobs share
    its nodes' cores while it is timed. None where it does not, or where ``scontrol`` cannot
    say (not on a Slurm machine)."""
    import shutil
    import subprocess

    if shutil.which("scontrol") is None:
        return None
    try:
        shown = subprocess.run(["scontrol", "-o", "show", "partition", *filter(None, [partition])],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in shown.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if partition is None and fields.get("Default") != "YES":
            continue
        if fields.get("OverSubscribe", "").startswith("FORCE"):
            return (f"partition {fields.get('PartitionName', partition)} shares its nodes by "
                    f"force (OverSubscribe={fields['OverSubscribe']}): Slurm ignores "
                    "--exclusive there, and other jobs share the nodes' cores while they are "
                    "timed; choose another --partition")
    return None


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``gpu[03-05,07],cpu1`` -> ``gpu03``."""
    head = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist.strip())
    if head is None:
        raise ValueError(f"cannot read SLURM_JOB_NODELIST {nodelist!r}")
    prefix, ranges = head.group(1), head.group(3)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def _tasks_per_node(env: dict[str, str], world: int, nodes: int) -> int:
    # SLURM_TASKS_PER_NODE looks like "4(x2)" or "4,3"; the local node's count is what counts.
    for name in ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        value = env.get(name)
        if value:
            found = re.match(r"(\d+)", value)
            if found:
                return int(found.group(1))
    return max(1, world // max(1, nodes))


def slurm_task(env: dict[str, str] | None = None) -> SlurmTask | None:
    """The Slurm task this process is: one of the several tasks of an ``srun`` step. None
    elsewhere, and also where Slurm's variables are set but this process is no such task:
    sbatch's batch step (no SLURM_STEP_ID) and a one-task step (``srun --pty bash``) set
    SLURM_PROCID and SLURM_NTASKS (the job's count) too; bench then launches its ranks
    itself (``slurm_note`` says so)."""
    env = dict(os.environ if env is None else env)
    if not all(env.get(name) for name in SLURM_VARS):
        return None
    step_tasks = env.get("SLURM_STEP_NUM_TASKS")
    if not env.get("SLURM_STEP_ID") or not step_tasks or int(step_tasks) < 2:
        return None
    world = int(step_tasks)
    nodes = int(env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES") or 1)
    return SlurmTask(
        rank=int(env["SLURM_PROCID"]),
        world_size=world,
        local_rank=int(env["SLURM_LOCALID"]),
        local_world_size=_tasks_per_node(env, world, nodes),
        nodes=nodes,
        master_addr=first_host(env["SLURM_JOB_NODELIST"]),
        job_id=env.get("SLURM_JOB_ID", "0"),
        step_id=env.get("SLURM_STEP_ID", "0"),
    )


def in_batch_step(env: dict[str, str] | None = None) -> bool:
    """Whether this process is a Slurm job's batch script (not one of its srun steps)."""
    env = dict(os.environ if env is None else env)
    return bool(env.get("SLURM_JOB_ID")) and not env.get("SLURM_STEP_ID")


def slurm_note(env: dict[str, str] | None = None) -> str | None:
    """Why Slurm's variables, where they are set, are not followed (``slurm_task`` None):
    the line bench prints before launching its ranks itself; None outside Slurm."""
    env = dict(os.environ if env is None else env)
    if not env.get("SLURM_JOB_ID") or slurm_task(env) is not None:
        return None
    job = env["SLURM_JOB_ID"]
    if in_batch_step(env):
        return (f"in Slurm job {job}'s batch step: launching the ranks here (for one Slurm "
                "task per rank, start bench with srun)")
    return (f"in a one-task step of Slurm job {job}: launching the ranks here "
            f"(SLURM_NTASKS={env.get('SLURM_NTASKS', '?')} is the job's, not this step's)")


def slurm_cpus_per_task(env: dict[str, str] | None = None) -> int | None:
    """The CPUs Slurm gave this task (SLURM_CPUS_PER_TASK), or None where it did not say."""
    env = dict(os.environ if env is None else env)
    value = env.get("SLURM_CPUS_PER_TASK", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


# Options each machine sets for itself: where its files are (its own disk's dataset and
# results, its MLPerf log), how many loader workers its cores feed, its progress bar, its
# rank. Two nodes of one run may differ in them.
PER_MACHINE = frozenset({"node_rank", "progress", "output", "data_dir", "download", "workers",
                         "mllog", "master_port"})


def default_rdzv_id(endpoint: str, config: dict[str, Any]) -> str:
    """The same id on every node that runs the same run against the same endpoint: from
    every option but those each machine sets for itself (``PER_MACHINE``). With them, a
    node given another --output or --data-dir waited 10 minutes under an id of its own and
    failed with torchrun's RendezvousTimeoutError."""
    shared = {k: v for k, v in config.items() if k not in PER_MACHINE}
    text = json.dumps([endpoint, shared], sort_keys=True, default=str)
    return "rdzv" + hashlib.sha1(text.encode()).hexdigest()[:10]


def sbatch_header(*options: tuple[str, str | int | bool | None]) -> list[str]:
    """A script's first lines: ``#!/bin/bash``, then ``#SBATCH --name=value`` for each
    (name, value) given a value, ``#SBATCH --name`` for each given True, in order (None and
    False: the option left out). One writer for bench slurm's script and bench sweep's
    arrays, so both ask Slurm in the same words."""
    lines = ["#!/bin/bash"]
    for name, value in options:
        if value is True:
            lines.append(f"#SBATCH --{name}")
        elif value is not None and value is not False:
            lines.append(f"#SBATCH --{name}={sbatch_value(name, str(value))}")
    return lines


def sbatch_value(name: str, value: str) -> str:
    """``value`` as an #SBATCH line holds it: in double quotes where it has a space (sbatch
    splits the line at spaces otherwise, and refused a script whose --chdir or --output
    lay under a folder with a space in its name: 'Invalid directive found in batch script');
    a value with a double quote or a line break cannot be written there (ConfigError)."""
    from bench.tools.errors import ConfigError

    if '"' in value or "\n" in value or "\r" in value:
        raise ConfigError(f"#SBATCH --{name} cannot be written for {value!r}: an sbatch line "
                          "cannot hold a double quote or a line break; use a folder without one")
    return f'"{value}"' if any(c.isspace() for c in value) else value


SRUN_CPUS_LINES = ["# since Slurm 22.05 srun inherits --cpus-per-task only through this variable",
                   'export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK}"']


def sbatch_script(*, strategy: str, nodes: int, gpus: int, time: str, job_name: str,
                  run_args: list[str], partition: str | None = None,
                  cpus_per_task: int | None = None, python: str | None = None,
                  workdir: str | None = None, cpu: bool = False,
                  exclusive: bool = False) -> str:
    """A ready sbatch script: one task per GPU (``cpu``: per CPU process, and no GPUs asked
    for, which a CPU-only slurmd refuses), ``srun`` starts them, each is one rank. Each task
    runs the interpreter that runs bench now (a bare ``python`` may be another one, or
    none, on the compute nodes), unless ``python`` names another. ``exclusive``: the
    nodes whole, shared with no other job."""
    python = python or sys.executable
    lines = sbatch_header(
        ("job-name", job_name), ("nodes", nodes), ("ntasks-per-node", gpus),
        ("gpus-per-node", None if cpu else gpus), ("time", time),
        ("cpus-per-task", cpus_per_task or None), ("partition", partition),
        ("exclusive", exclusive),
        ("chdir", workdir or None),  # relative paths in the run's options mean what they meant here
        ("output", "%x-%j.out"))
    lines += [
        "",
        "# Each srun task is one rank; bench maps SLURM_PROCID / SLURM_STEP_NUM_TASKS /",
        "# SLURM_LOCALID to rank / world size / local rank and rendezvouses on the first node.",
        "set -euo pipefail",
        *(SRUN_CPUS_LINES if cpus_per_task else []),
        " ".join(
            ["srun", shlex.quote(python), "-m", "bench", "run", "--strategy", strategy,
             "--gpus", str(gpus), "--nodes", str(nodes), *map(shlex.quote, run_args)]
        ),
        "",
    ]
    return "\n".join(lines)
