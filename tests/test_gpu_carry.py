"""What travels to a lent GPU machine: the built wheels lose their debug sections and still
work, and the size of the working tree plus what it carries is checked against 64 MiB
before a lease (over it, the machine refuses the call)."""

from __future__ import annotations

import base64
import ctypes
import hashlib
import shutil
import subprocess
import sys
import zipfile

import pytest
from conftest import ROOT

SCRIPTS = ROOT / "scripts"


def _wheel_with_a_debug_library(tmp_path):
    """A wheel holding a C library built with -g (and a big debug section), as Horovod's and
    apex's builds leave theirs."""
    source = tmp_path / "answer.c"
    body = "\n".join(f"static int unused_{i}(int x) {{ return x * {i} + {i}; }}"
                     for i in range(2000))
    source.write_text(body + "\nint answer(void) { return 42 + unused_1(0) - 1; }\n")
    lib = tmp_path / "answer.so"
    subprocess.run(["gcc", "-g3", "-O0", "-shared", "-fPIC", "-o", str(lib), str(source)],
                   check=True)
    wheel = tmp_path / "answer-1.0-py3-none-linux_x86_64.whl"
    files = {"answer/__init__.py": b"", "answer/answer.so": lib.read_bytes(),
             "answer-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
                                            b"Root-Is-Purelib: false\nTag: py3-none-linux_x86_64\n",
             "answer-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: answer\n"
                                               b"Version: 1.0\n"}
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as out:
        for name, data in files.items():
            out.writestr(name, data)
        out.writestr("answer-1.0.dist-info/RECORD", "")
    return wheel, lib.stat().st_size


def _sections(lib) -> list[str]:
    out = subprocess.run(["readelf", "-SW", str(lib)], check=True, capture_output=True,
                         text=True).stdout
    return [line.split("]", 1)[1].split()[0] for line in out.splitlines()
            if line.strip().startswith("[") and "]" in line and line.split("]", 1)[1].strip()]


@pytest.mark.skipif(not all(map(shutil.which, ("gcc", "strip", "readelf"))),
                    reason="needs gcc and binutils (strip, readelf) to build and strip a library")
def test_a_stripped_wheel_is_smaller_installs_and_its_library_still_works(tmp_path):
    wheel, lib_size = _wheel_with_a_debug_library(tmp_path)
    wheel.chmod(0o644)
    done = subprocess.run([sys.executable, str(SCRIPTS / "wheel_strip.py"), str(wheel)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    with zipfile.ZipFile(wheel) as whl:
        stripped = whl.read("answer/answer.so")
        record = whl.read("answer-1.0.dist-info/RECORD").decode().splitlines()
    assert len(stripped) < lib_size
    assert wheel.stat().st_mode & 0o777 == 0o644  # readable by others, as it was
    assert ".debug_info" in _sections(tmp_path / "answer.so")  # the library as built
    (tmp_path / "stripped.so").write_bytes(stripped)
    assert not [s for s in _sections(tmp_path / "stripped.so") if s.startswith(".debug")]
    # RECORD names every other file with its new hash and size
    entries = {line.split(",")[0]: line.split(",")[1:] for line in record}
    digest = base64.urlsafe_b64encode(hashlib.sha256(stripped).digest()).rstrip(b"=").decode()
    assert entries["answer/answer.so"] == [f"sha256={digest}", str(len(stripped))]
    assert entries["answer-1.0.dist-info/RECORD"] == ["", ""]
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                    "--no-deps", "--target", str(target), str(wheel)], check=True)
    assert ctypes.CDLL(str(target / "answer" / "answer.so")).answer() == 42
    # a second pass changes nothing
    before = wheel.read_bytes()
    subprocess.run([sys.executable, str(SCRIPTS / "wheel_strip.py"), str(wheel)], check=True,
                   capture_output=True)
    assert wheel.read_bytes() == before


def _carry_size(repo, *carry):
    return subprocess.run([sys.executable, str(SCRIPTS / "carry_size.py"), *carry], cwd=repo,
                          capture_output=True, text=True)


def test_what_travels_to_the_gpu_machine_is_summed_and_checked_against_64_mib(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text(".cache/\n")  # 8 bytes
    (repo / "tracked.bin").write_bytes(b"x" * 2**20)
    (repo / "untracked.bin").write_bytes(b"y" * 2**20)  # not ignored: it travels too
    subprocess.run(["git", "-C", str(repo), "add", "tracked.bin", ".gitignore"], check=True)
    deps = repo / ".cache" / "gpu-deps"
    deps.mkdir(parents=True)
    (deps / "wheel.whl").write_bytes(b"z" * 3 * 2**20)
    (repo / ".cache" / "other.bin").write_bytes(b"w" * 2**20)  # ignored, not carried
    done = _carry_size(repo, ".cache/gpu-deps")
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("working tree 2.0 MiB + .cache/gpu-deps 3.0 MiB = 5.0 MiB of 64 MiB"
            in done.stdout), done.stdout
    with open(deps / "big.whl", "wb") as big:  # sparse: 62 MiB on paper, none on disk
        big.truncate(62 * 2**20)
    done = _carry_size(repo, ".cache/gpu-deps")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "= 67.0 MiB of 64 MiB" in done.stdout and "over by 3.0 MiB" in done.stdout
    assert "62.0 MiB  .cache/gpu-deps/big.whl" in done.stdout
    missing = _carry_size(repo, ".cache/nothing")
    assert missing.returncode == 1 and "make gpu-deps" in missing.stderr
