"""`make install` on a disk without room for torch says so in one line before it creates
anything: pip would fail minutes in with "No space left on device" and leave half an
environment (CI once did, 48 s in, on a disk that other checkouts had filled)."""

from __future__ import annotations

import shutil
import subprocess
import sys

from conftest import ROOT


def test_install_on_a_full_disk_is_one_line_and_creates_nothing(tmp_path):
    venv = tmp_path / "deep" / "venv"
    free_gib = shutil.disk_usage(tmp_path).free / 2**30
    proc = subprocess.run(["make", "-s", "install", f"VENV={venv}", f"PYTHON={sys.executable}",
                           f"INSTALL_GIB={free_gib * 2 + 1:.0f}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if line.startswith("make install:")]
    assert len(ours) == 1, proc.stderr
    assert f"GiB free on the disk of {tmp_path}" in ours[0], ours[0]
    assert "VENV=DIR" in ours[0]
    assert not (tmp_path / "deep").exists()
    assert proc.stdout == ""


def test_room_enough_lets_the_install_go_on(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_space.py"),
                           str(tmp_path / "venv"), "0.001"], capture_output=True, text=True)
    assert (proc.returncode, proc.stderr) == (0, "")


def test_an_environment_already_there_is_updated_whatever_the_disk_has(tmp_path):
    """A reinstall (pyproject.toml changed) reuses most of the environment: the check is
    for the first install, and must not stop an update that fits."""
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").write_text("")
    free_gib = shutil.disk_usage(tmp_path).free / 2**30
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_space.py"),
                           str(tmp_path / "venv"), f"{free_gib * 2 + 1:.0f}"],
                          capture_output=True, text=True)
    assert (proc.returncode, proc.stderr) == (0, "")
