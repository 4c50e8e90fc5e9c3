"""Bad input: one line naming the fix, exit code 2, and nothing written."""

from __future__ import annotations

import os
import shutil
import socket

import pytest
from conftest import ROOT, run_bench

from bench.tools.errors import ConfigError
from strategies import names

BASE = ["--cpu", "--epochs", "1", "--data", "synthetic", "--train-limit", "64",
        "--test-limit", "8", "--width", "0.125", "--batch-size", "32", "--no-progress"]


def _corrupt_copy(cifar_dir, tmp_path):
    target = tmp_path / "corrupt"
    shutil.copytree(cifar_dir, target)
    (target / "cifar-100-python" / "train").write_bytes(b"\x80\x02garbage")
    return target


# Ranks that even 0.3 GiB each (less than the smallest model's rank holds), and loader
# workers that even 50 MiB each, would not fit in this machine's memory; --batch-size 32 is
# refused for those ranks too, should that check be gone.
_MEMORY = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
_BEYOND_MEMORY = str(int(_MEMORY / (0.3 * 2**30)) + 1)
_WORKERS_BEYOND = str(int(_MEMORY / (50 * 2**20)) + 1)

CASES = {
    "unknown strategy": (["run", "--strategy", "nope", *BASE], "choose one of: dp, ddp"),
    "a strategy misspelt": (["run", "--strategy", "fdsp", *BASE],
                            "unknown strategy 'fdsp'; did you mean fsdp"),
    "an image folder not given": (["run", "--strategy", "ddp", "--cpu", "--data", "imagefolder"],
                                  "--data imagefolder needs --data-dir DIR"),
    "unknown option": (["run", "--strategy", "ddp", "--frobnicate", *BASE],
                       "--frobnicate; see `bench run --help`"),
    "unknown option to report": (["report", "--frobnicate", "--results", "{here}"],
                                 "see `bench report --help`"),
    "report: two folders": (["report", "{here}", "--results", "{here}/other"],
                            "two results given"),
    "unknown option to a sweep": (
        ["sweep", "--strategies", "ddp", "--gpus", "1", "--frobnicate", *BASE],
        "--frobnicate; neither `bench sweep --help` nor `bench run --help` lists it"),
    "unknown option to verify": (["verify", "--frobnicate", *BASE],
                                 "neither `bench verify --help` nor `bench run --help`"),
    "zero gpus": (["run", "--strategy", "ddp", *BASE, "--gpus", "0"], "--gpus must be"),
    "negative epochs": (["run", "--strategy", "ddp", *BASE, "--epochs", "-2"], "--epochs"),
    "gpu without --cpu": (
        ["run", "--strategy", "ddp", "--gpus", "2", "--data", "synthetic"], "--cpu"),
    "batch not divisible": (
        ["run", "--strategy", "ddp", *BASE, "--gpus", "3"], "multiple of 3"),
    "ghost BatchNorm groups that do not split a replica's batch": (
        ["run", "--strategy", "ddp", *BASE, "--gpus", "2", "--ghost-bn", "3"],
        "--ghost-bn 3 does not split a replica's micro-batch of 16 images"),
    "ghost BatchNorm of no images": (["run", "--strategy", "ddp", *BASE, "--ghost-bn", "0"],
                                     "--ghost-bn takes the images a group holds"),
    "ghost BatchNorm with BatchNorm over the global batch": (
        ["run", "--strategy", "ddp", *BASE, "--gpus", "2", "--ghost-bn", "2", "--cpu-syncbn"],
        "--cpu-syncbn over the global batch: drop one"),
    "train set smaller than a batch": (
        ["run", "--strategy", "dp", *BASE, "--train-limit", "16"], "--train-limit"),
    "fp16 on cpu": (
        ["run", "--strategy", "ddp", *BASE, "--precision", "fp16"], "--precision bf16"),
    "missing dataset offline": (
        ["run", "--strategy", "ddp", "--cpu", "--data", "cifar100", "--data-dir", "{empty}",
         "--no-download"], "CIFAR-100 is not in"),
    "download fails": (
        ["run", "--strategy", "ddp", "--cpu", "--data", "cifar100", "--data-dir", "{empty}"],
        "--data synthetic"),
    "corrupt dataset": (
        ["run", "--strategy", "ddp", "--cpu", "--data", "cifar100", "--data-dir", "{corrupt}",
         "--no-download"], "corrupt CIFAR-100 file"),
    "unwritable output": (
        ["run", "--strategy", "dp", *BASE, "--output", "{file}/sub"], "--output"),
    "port in use": (["run", "--strategy", "ddp", *BASE, "--master-port", "{port}"], "in use"),
    "fsdp channels_last": (
        ["run", "--strategy", "fsdp", *BASE, "--gpus", "2", "--channels-last"],
        "drop --channels-last"),
    "fsdp fused sgd": (
        ["run", "--strategy", "fsdp", *BASE, "--gpus", "2", "--optimizer-impl", "fused"],
        "--optimizer-impl foreach"),
    "tf32 value": (["run", "--strategy", "ddp", *BASE, "--tf32", "maybe"], "--tf32"),
    # both ran, and switched nothing, while the command line and a sweep's key said so
    "tf32 on cpu": (["run", "--strategy", "ddp", *BASE, "--tf32", "on"],
                    "--tf32 is a CUDA switch"),
    "cudnn benchmark off on cpu": (["run", "--strategy", "ddp", *BASE, "--no-cudnn-benchmark"],
                                   "--no-cudnn-benchmark is a CUDA switch"),
    "target out of range": (["run", "--strategy", "dp", *BASE, "--target-top1", "120"],
                            "--target-top1"),
    "stop without target": (["run", "--strategy", "dp", *BASE, "--stop-at-target"],
                            "--stop-at-target needs --target-top1"),
    "abbreviated option": (["run", "--strategy", "ddp", *BASE, "--epoch", "2"], "--epoch"),
    "nan weight decay": (["run", "--strategy", "ddp", *BASE, "--weight-decay", "nan"],
                         "--weight-decay must be a finite number"),
    "infinite lr": (["run", "--strategy", "ddp", *BASE, "--lr", "inf"],
                    "--lr must be a finite number"),
    # finite, and infinite in the bytes DDP counts a bucket in: every rank failed to build
    "bucket beyond any model": (["run", "--strategy", "ddp", *BASE, "--bucket-cap-mb", "1e308"],
                                "--bucket-cap-mb must lie in (0, 1048576]"),
    "infinite timeout": (["run", "--strategy", "ddp", *BASE, "--timeout", "inf"],
                         "--timeout must be a finite number"),
    "negative seed": (["run", "--strategy", "ddp", *BASE, "--seed", "-1"], "--seed must lie"),
    "nan warm-up": (["run", "--strategy", "ddp", *BASE, "--warmup-epochs", "nan"],
                    "--warmup-epochs must be a finite number"),
    "negative weight decay": (["run", "--strategy", "ddp", *BASE, "--weight-decay", "-1"],
                              "--weight-decay must be 0 or more"),
    "nccl on cpu": (["run", "--strategy", "ddp", *BASE, "--backend", "nccl"],
                    "--backend nccl needs CUDA"),
    "difficulty out of range": (["run", "--strategy", "dp", *BASE, "--synthetic-difficulty",
                                 "2"], "--synthetic-difficulty must lie in [0, 1]"),
    "negative probe steps": (["run", "--strategy", "dp", *BASE, "--comm-probe-steps", "-1"],
                             "--comm-probe-steps"),
    "negative loader probe": (["run", "--strategy", "dp", *BASE, "--loader-probe-steps", "-1"],
                              "--loader-probe-steps must be 0 or more"),
    "loader sweep of the gpu loader": (["loader", *BASE, "--loader", "gpu", "--workers", "2"],
                                       "--loader gpu has no loader workers"),
    "loader sweep without steps": (["loader", *BASE, "--steps", "0"], "--steps must be"),
    "loader sweep's worker list": (["loader", *BASE, "--workers", "2,x"], "comma-separated"),
    "loader sweep over nodes": (["loader", *BASE, "--nodes", "2", "--rdzv-endpoint",
                                 "localhost:29500"], "drop --nodes"),
    "loader sweep of a bad run": (["loader", *BASE, "--gpus", "3"], "multiple of 3"),
    "mllog in a missing folder": (["run", "--strategy", "dp", *BASE, "--mllog",
                                   "{empty}/run.log"], "--mllog"),
    # the path as typed, not with the run id put in: a user never typed 'run-id'
    "mllog's pattern in a missing folder": (["run", "--strategy", "dp", *BASE, "--mllog",
                                             "{empty}/{{run_id}}.log"], "/{run_id}.log: "),
    "mllog's run id in its folder": (["run", "--strategy", "dp", *BASE, "--mllog",
                                      "{here}/{{run_id}}/x.log"],
                                     "goes in the file's name, not its folder's, e.g. "),
    "mllog names a folder": (["run", "--strategy", "dp", *BASE, "--mllog", "{here}"],
                             "is a folder; name a file"),
    "sweep mllog without run id": (["sweep", "--strategies", "dp", "--gpus", "1", *BASE,
                                    "--mllog", "{here}/run.log"], "needs {run_id} in its name"),
    "project: unknown network": (["project", "{here}", "--network", "nope"],
                                 "--network must be one of"),
    # an empty folder: the option is refused before the folder's records are looked for
    "project: one bus bandwidth of two": (["project", "{here}", "--intra-busbw", "5"],
                                          "--intra-busbw and --inter-busbw go together"),
    "project: more GPUs than any cluster": (
        ["project", "{here}", "--gpus", "8,99999999999999999999"],
        "--gpus goes up to 1,048,576"),
    # it named no command: the probe it needs is `bench probe --output` into that folder
    "project: a probe's network without a probe": (
        ["project", "results/gpu-check/2026-11-27-h200/accuracy", "--network", "probe"],
        "run `bench probe --output results/gpu-check/2026-11-27-h200/accuracy` on the runs'"),
    "project: a node of 4,096 GPUs": (["project", "{here}", "--gpus-per-node", "4096"],
                                      "--gpus-per-node goes up to 1,024"),
    "report: reference at N=0": (["report", "--results", "{here}", "--reference", "ddp:0"],
                                 "--reference must be STRATEGY[:N] with N at least 1"),
    "rendezvous port out of range": (["run", "--strategy", "ddp", *BASE, "--nodes", "2",
                                      "--rdzv-endpoint", "localhost:99999"],
                                     "the port in 1..65535"),
    "a host of no slots": (["run", "--strategy", "horovod", *BASE, "--hosts", "localhost:0"],
                           "each with 1 slot or more"),
    "sweep into a file": (["sweep", "--strategies", "ddp", "--gpus", "1", *BASE, "--output",
                           "{file}/sub"], "choose another --output"),
    "probe into a file": (["probe", "--cpu", "--output", "{file}/sub"],
                          "choose another --output"),
    # both started torchrun, whose ranks failed with its traceback and report (--max-size 0,
    # refused later, keeps them unstarted should their check be gone)
    "probe: negative timeout": (["probe", "--cpu", "--timeout", "-1", "--max-size", "0",
                                 "--output", "{empty}"], "--timeout must be positive seconds"),
    "probe: node rank beyond the nodes": (
        ["probe", "--cpu", "--gpus", "1", "--nodes", "2", "--node-rank", "2", "--rdzv-endpoint",
         "localhost:29400", "--max-size", "0", "--output", "{empty}"], "--node-rank must lie"),
    "probe of no sizes": (["probe", "--cpu", "--max-size", "0", "--output", "{empty}"],
                          "--max-size must be positive"),
    "probe: a negative contention batch": (
        ["probe", "--cpu", "--contention-batch", "-1", "--output", "{empty}"],
        "--contention-batch must be 0 (not measured) or 2 or more images a rank"),
    # a BatchNorm1d after the pooling cannot train on one image: every rank's traceback
    "probe: a contention batch of one image": (
        ["probe", "--cpu", "--contention-batch", "1", "--output", "{empty}"],
        "--contention-batch must be 0 (not measured) or 2 or more images a rank (got 1)"),
    "more ranks than memory": (["run", "--strategy", "ddp", *BASE, "--gpus", _BEYOND_MEMORY],
                               "lower --gpus"),
    # should the check be gone, too few images for a batch still refuses them all unstarted
    "loader workers beyond memory": (["loader", *BASE, "--workers", f"2,{_WORKERS_BEYOND}",
                                      "--train-limit", "16"], "lower --workers"),
    "run's workers beyond memory": (["run", "--strategy", "ddp", *BASE, "--workers",
                                     _WORKERS_BEYOND, "--train-limit", "16"], "lower --workers"),
    "slurm: no cores per task": (["slurm", "--nodes", "1", "--gpus", "2", "--strategy", "ddp",
                                  "--cpus-per-task", "0", "--out", "{empty}/job.sbatch"],
                                 "--cpus-per-task must be at least 1"),
    "slurm: a job name of two words": (
        ["slurm", "--nodes", "1", "--gpus", "2", "--strategy", "ddp", "--job-name", "my job",
         "--out", "{empty}/job.sbatch"], "--job-name takes letters"),
    "slurm script into a folder": (["slurm", "--nodes", "1", "--gpus", "2", "--strategy", "ddp",
                                    "--out", "{here}"], "is a folder; name a file"),
    "project plot in a missing folder": (["project", "{here}", "--plot", "{empty}/x.png"],
                                         "does not exist; create that folder"),
    "report into a missing readme": (["report", "--results", "{here}", "--update-readme",
                                      "{empty}/README.md"], "--update-readme"),
    "compare: bad threshold": (["compare", "{empty}", "{empty}", "--threshold", "0"],
                               "--threshold"),
    "compare: no threshold at all": (["compare", "{empty}", "{empty}", "--threshold", "inf"],
                                     "--threshold is a finite percentage"),
    "verify: every strategy refuses": (
        ["verify", "--cpu", "--strategies", "fsdp", "--channels-last"], "drop --channels-last"),
}


def _bench_in_process(args: list[str], capsys) -> tuple[int, str, str]:
    """``bench ARGS`` through the CLI's own entry point, in this process: bad input is
    refused before anything starts, so this is the command's whole path without the 2 s of
    importing torch again for each of the cases (the real command: the test below)."""
    from bench.cli import main

    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_bad_input_through_the_real_command(tmp_path):
    proc = run_bench("run", "--strategy", "nope", *BASE, "--output", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "bench: error: unknown strategy 'nope'; choose one of: " + ", ".join(names())]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_one_line(case, cifar_dir, tmp_path, capsys, monkeypatch):
    args, fragment = CASES[case]
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    (tmp_path / "a-file").write_text("x")
    out = tmp_path / "out"
    values = {
        "empty": str(tmp_path / "empty"),
        "corrupt": str(_corrupt_copy(cifar_dir, tmp_path)) if case == "corrupt dataset" else "",
        "file": str(tmp_path / "a-file"),
        "port": str(blocker.getsockname()[1]),
        "here": str(tmp_path),
    }
    args = [a.format(**values) for a in args]
    if "--output" not in args and args[0] not in ("compare", "project", "report"):
        args += ["--output", str(out)]
    monkeypatch.setenv("BENCH_CIFAR100_URL", "http://127.0.0.1:9/cifar-100-python.tar.gz")
    monkeypatch.chdir(ROOT)
    try:
        code, _, stderr = _bench_in_process(args, capsys)
    finally:
        blocker.close()
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("bench: error: ") and fragment in lines[0], lines[0]
    assert not out.exists(), "bad input must leave nothing behind"
    assert not (tmp_path / "empty").exists(), "nor a folder made before the refusal"


def test_an_output_path_too_long_and_a_data_dir_loop_are_one_line(tmp_path, capsys,
                                                                   monkeypatch):
    """A 4,055-character --output was an ENAMETOOLONG traceback with 23 folders left, a
    --data-dir symlink loop with download allowed an ELOOP traceback: now one line each,
    exit 2, and nothing left."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("BENCH_CIFAR100_URL", "http://127.0.0.1:9/cifar-100-python.tar.gz")
    top = tmp_path / "long"
    deep = top / "/".join(["d" * 200] * 19) / ("e" * 150)
    assert 4000 < len(str(deep)) < 4096  # a path the kernel takes, too long for a record
    code, _, stderr = _bench_in_process(["run", "--strategy", "ddp", *BASE, "--output",
                                         str(deep)], capsys)
    assert code == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert "cannot write results to" in stderr and "choose another --output" in stderr
    assert not top.exists(), "every folder it made is gone"
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    code, _, stderr = _bench_in_process(
        ["run", "--strategy", "ddp", "--cpu", "--data", "cifar100", "--data-dir",
         str(tmp_path / "a"), "--output", str(tmp_path / "out")], capsys)
    assert code == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert "could not be downloaded" in stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("what", ["--out", "--html", "--plot", "--mllog", "imagefolder",
                                  "cifar100", "report", "compare", "project"])
def test_a_name_too_long_for_the_file_system_is_one_line(what, tmp_path, capsys, monkeypatch):
    """A path with a name past the file system's 255 bytes: its check stat()ed it and raised
    ENAMETOOLONG as a traceback (a file a command writes: `bench slurm --out`, `bench report
    --html`, `bench project --plot`, `bench run --mllog`; an ImageFolder's --data-dir; the
    results `bench report`, `compare` and `project` read), and a CIFAR-100 --data-dir
    started the run, which failed 'cannot write files ... choose another --output'. Each is
    one line naming the fix, exit 2, and nothing written."""
    if what == "--mllog":
        pytest.importorskip("mlperf_logging", reason="--mllog needs the mlperf-logging package")
    monkeypatch.chdir(tmp_path)  # (the run's default --output: results/ here)
    name = str(tmp_path / ("a" * 300))
    run = ["run", "--strategy", "ddp", *BASE, "--output", str(tmp_path / "out")]
    args = {"--out": ["slurm", "--strategy", "ddp", "--nodes", "1", "--gpus", "1", "--cpu",
                      "--out", name + ".sbatch"],
            "--html": ["report", str(ROOT / "results"), "--no-write", "--html",
                       name + ".html"],
            "--plot": ["project", str(ROOT / "results"), "--plot", name + ".png"],
            "--mllog": [*run, "--mllog", name + ".log"],
            "imagefolder": [*run, "--data", "imagefolder", "--data-dir", name],
            "cifar100": [*run, "--data", "cifar100", "--no-download", "--data-dir", name],
            "report": ["report", name],
            "compare": ["compare", name, str(ROOT / "results")],
            "project": ["project", name]}[what]
    code, _, stderr = _bench_in_process(args, capsys)
    assert code == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert "a name in it is longer than the file system allows (255 bytes); choose a shorter " \
           "one" in stderr, stderr
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


SRUN_TASK = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
             "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": "7", "SLURM_NNODES": "1",
             "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2"}


@pytest.mark.parametrize("how", ["run under srun", "bench slurm"])
def test_what_cannot_be_an_srun_task_is_refused_alike(how, tmp_path):
    if how == "bench slurm":
        proc = run_bench("slurm", "--nodes", "1", "--gpus", "2", "--strategy", "ddp-spawn",
                         "--out", str(tmp_path / "job"))
    else:
        proc = run_bench("run", "--strategy", "ddp-spawn", "--gpus", "2", *BASE,
                         "--output", str(tmp_path / "out"), env=SRUN_TASK)
    assert proc.returncode == 2, proc.stderr
    assert ("ddp-spawn cannot run that way: use ddp, ddp-amp, ddp-zero, ddp-apex, fsdp"
            in proc.stderr)
    assert list(tmp_path.iterdir()) == []


def test_every_option_has_help_with_its_default_and_version_names_torch():
    """Each command's options, as `bench NAME --help` builds them (a command's options are
    added only when it is the one given: this test once built none and checked nothing).
    An option with a default says it: `--time` gave no hint that it was an hour."""
    import argparse
    import importlib

    import torch

    from bench.cli import COMMANDS, build_parser

    flags = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction,
             argparse._HelpAction)
    unsaid, options = [], 0
    for name in COMMANDS:
        parser = build_parser(importlib.import_module(f"bench.commands.{name}"))
        subparsers = next(a for a in parser._actions
                          if isinstance(a, argparse._SubParsersAction))
        for action in subparsers.choices[name]._actions:
            assert action.help, f"bench {name} {action.option_strings} has no help"
            options += 1
            if (action.help != argparse.SUPPRESS and not isinstance(action, flags)
                    and action.default not in (None, argparse.SUPPRESS)
                    and "default" not in action.help):
                unsaid.append(f"bench {name} {action.option_strings[0]}")
    assert options > 100, options  # run alone has 64
    assert not unsaid, unsaid
    proc = run_bench("--version")
    assert proc.returncode == 0 and f"torch {torch.__version__}" in proc.stdout


def test_a_rank_without_a_gpu_of_its_own_is_named():
    from strategies.ddp import gpu_index

    assert [gpu_index(r, 4) for r in range(4)] == [0, 1, 2, 3]
    assert gpu_index(3, 1) == 0  # a Slurm task bound to its one GPU
    with pytest.raises(ConfigError, match="local rank 2 has no GPU of its own"):
        gpu_index(2, 2)  # two GPUs, three ranks: the third would share (NCCL refuses)
