"""`make apex` cross-compiles apex 25.05's CUDA extensions on a machine without a GPU
(nvcc 13 and torch's CUDA wheels are enough): only the three that apex.amp and
apex.parallel import, for sm_90, linked against the CUDA runtime; a second build is a
cache hit. Needs the 25.05 source (APEX_SRC, or `make gpu-deps`'s tarball) and nvcc."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow

SOURCE = os.environ.get("APEX_SRC") or str(ROOT / ".cache" / "gpu-deps" / "apex-25.05.tar.gz")


def _build(target) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "scripts/build_apex.py", "--target", str(target)], cwd=ROOT,
        env=dict(os.environ, APEX_SRC=SOURCE, TORCH_CUDA_ARCH_LIST="9.0"),
        capture_output=True, text=True, timeout=1800)


def test_apex_cuda_extensions_cross_compile_and_link(tmp_path):
    import torch

    if not os.path.exists(SOURCE):
        pytest.skip(f"apex 25.05 source not here ({SOURCE}): set APEX_SRC or `make gpu-deps`")
    if shutil.which("nvcc") is None or torch.version.cuda is None:
        pytest.skip("needs nvcc and a CUDA build of torch")
    first = _build(tmp_path / "one")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "installed NVIDIA apex 25.05: cuda-extensions" in first.stdout
    built = sorted(p.name.split(".")[0] for p in (tmp_path / "one").glob("*.so"))
    assert built == ["amp_C", "apex_C", "syncbn"]  # not the ~30 others
    for name in ("amp_C", "syncbn"):
        lib = next((tmp_path / "one").glob(f"{name}.*.so"))
        needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True,
                                text=True).stdout
        assert "libcudart.so" in needed and "libc10_cuda.so" in needed, needed
    again = _build(tmp_path / "two")  # same source, torch, nvcc, archs: the cached wheel
    assert again.returncode == 0 and "cached" in again.stdout, again.stdout[-2000:]
