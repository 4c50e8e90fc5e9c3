"""ddp-amp, ddp-launch and ddp-apex on CPU with real processes."""

from __future__ import annotations

import math
import subprocess
import sys

from conftest import (
    FAST,
    ROOT,
    assert_comm_probe,
    assert_ok,
    bf16_in_cpu_flags,
    only_record,
    records,
    run_bench,
)


def _run(strategy: str, gpus: int, cifar_dir, out, *extra: str):
    return run_bench(
        "run", "--strategy", strategy, "--gpus", str(gpus), "--cpu", "--epochs", "2",
        "--data", "cifar100", "--data-dir", str(cifar_dir), "--no-download",
        "--output", str(out), *FAST, *extra,
    )


def test_ddp_amp_bf16_on_two_cpu_ranks(cifar_dir, tmp_path):
    # bf16 is the CPU default; 5 probe steps, as 20 took 6 s of emulated bf16 on 2 cores
    proc = _run("ddp-amp", 2, cifar_dir, tmp_path, "--comm-probe-steps", "5")
    assert_ok(proc)
    rec = only_record(tmp_path)
    # A CPU without bf16 arithmetic emulates it (24x slower than fp32 for ResNet-18 on an
    # AVX2 AMD EPYC): the run says so before it starts, and its record keeps it
    native = bf16_in_cpu_flags()
    if native is not None:
        assert rec["env"]["cpu_bf16"] is native, rec["env"]
        said = " ".join(proc.stderr.split())
        noted = [n for n in rec["notes"] if "no bf16 arithmetic" in n]
        assert ("this CPU has no bf16 arithmetic" in said) is (not native), proc.stderr
        assert len(noted) == (0 if native else 1), rec["notes"]
    assert rec["precision"] == "bf16" and rec["launcher"] == "torchrun"
    assert rec["config"]["precision"] == "bf16"
    assert all(math.isfinite(e["train_loss"]) for e in rec["per_epoch"])
    assert rec["replicas_identical"] is True
    assert rec["per_epoch"][-1]["test_images"] == 10
    assert_comm_probe(rec, steps=5)


def test_ddp_amp_refuses_fp32(cifar_dir, tmp_path):
    proc = _run("ddp-amp", 2, cifar_dir, tmp_path, "--precision", "fp32")
    assert proc.returncode == 2 and "--strategy ddp" in proc.stderr
    assert not records(tmp_path)


def test_ddp_launch_uses_the_legacy_launcher(cifar_dir, tmp_path):
    proc = _run("ddp-launch", 2, cifar_dir, tmp_path)
    assert_ok(proc)
    rec = only_record(tmp_path)
    assert rec["launcher"] == "torch.distributed.launch" and rec["processes"] == 2
    assert any("deprecated" in n for n in rec["notes"])
    # The rank really got its local rank through the --local-rank argument.
    assert any("--local-rank" in n or "--local_rank" in n for n in rec["notes"]), rec["notes"]
    assert rec["replicas_identical"] is True


def test_ddp_apex_is_unavailable_here_with_the_reason(cifar_dir, tmp_path):
    listing = run_bench("list")
    assert_ok(listing)
    assert max(map(len, listing.stdout.splitlines())) <= 120, listing.stdout  # 120 columns
    # on a terminal of 80 (COLUMNS says so where the output is a pipe) the descriptions go
    # on as many lines as they need, whole
    narrow = run_bench("list", env={"COLUMNS": "80"}).stdout
    assert max(map(len, narrow.splitlines())) <= 80, narrow
    assert ("DDP + ZeroRedundancyOptimizer (optimizer state sharded: ZeRO-1)"
            in " ".join(narrow.split())), narrow
    reason = listing.stdout[listing.stdout.index("  ddp-apex:"):]
    assert "CUDA" in reason and "25.05" in reason and "make apex" in reason
    if bf16_in_cpu_flags() is not None:  # and whether ddp-amp's bf16 is emulated here
        assert ("this CPU has no bf16 arithmetic" in listing.stdout) is (
            not bf16_in_cpu_flags()), listing.stdout
    proc = _run("ddp-apex", 2, cifar_dir, tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert "unavailable" in proc.stderr and "25.05" in proc.stderr
    rec = only_record(tmp_path)
    assert rec["status"] == "unavailable" and "apex" in rec["error"]
    assert rec["per_epoch"] == []
    # Nothing else is written: the one record and no temp files.
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [f"{rec['run_id']}.json"]


def _apex_problem_with(tmp_path, files: dict[str, str]) -> str:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    code = "from strategies.apex import apex_problem; print(apex_problem())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": ""})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_apex_check_tells_the_unrelated_pypi_package(tmp_path):
    msg = _apex_problem_with(tmp_path, {"apex/__init__.py": "", "apex/pyramid.py": ""})
    assert "unrelated PyPI package" in msg


def test_apex_check_tells_a_too_new_nvidia_apex(tmp_path):
    msg = _apex_problem_with(
        tmp_path, {"apex/__init__.py": "", "apex/optimizers/__init__.py": "",
                   "apex/normalization/__init__.py": ""},
    )
    assert "newer than 25.05" in msg


def test_apex_check_accepts_an_old_nvidia_apex(tmp_path):
    msg = _apex_problem_with(
        tmp_path, {"apex/__init__.py": "", "apex/amp/__init__.py": "",
                   "apex/parallel/__init__.py": ""},
    )
    assert msg == "None"


def test_ddp_apex_on_cpu_with_apex_installed_says_cuda_and_no_build(tmp_path):
    """Where NVIDIA apex is installed (built here for a GPU machine: `make apex`), ddp-apex
    on CPU lacks only CUDA: advice to build apex would send the user the wrong way."""
    for rel in ("apex/__init__.py", "apex/amp/__init__.py", "apex/parallel/__init__.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    code = "import strategies; print(strategies.get('ddp-apex').requires('cpu'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": ""})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "apex AMP needs CUDA, and this runs on CPU", out.stdout
