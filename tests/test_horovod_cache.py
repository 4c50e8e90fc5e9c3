"""The cached Horovod GPU wheel is keyed by the CUDA architectures it has kernels for: the
one cross-compiled here for sm_90 must never be installed on an A100 (sm_80), where its
kernels fail with "no kernel image" at the first collective."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import build_horovod  # a script, beside its helper wheel_strip

TORCH, STD = "2.11.0+cu130", 20


def _wheel(cache, archs: str | None):
    folder = cache / (f"torch2.11.0_cu130-gpu-cxx{STD}" + (f"-sm{archs}" if archs else ""))
    folder.mkdir(parents=True)
    wheel = folder / f"horovod-{build_horovod.VERSION}-{build_horovod.PYTHON_TAG}-x.whl"
    wheel.write_bytes(b"")
    return wheel


def test_the_key_names_the_architectures(monkeypatch):
    assert build_horovod.wheel_tag(TORCH, "gpu", STD, ["90", "80"]) == \
        "torch2.11.0_cu130-gpu-cxx20-sm80-90"
    assert build_horovod.wheel_tag(TORCH, "cpu", STD) == "torch2.11.0_cu130-cpu-cxx20"
    monkeypatch.setenv("HOROVOD_BUILD_CUDA_CC_LIST", "8.0, 90")
    assert build_horovod.build_archs() == ["80", "90"]
    monkeypatch.delenv("HOROVOD_BUILD_CUDA_CC_LIST")
    monkeypatch.setattr(build_horovod, "visible_capabilities", lambda: [])
    assert build_horovod.build_archs() == ["90"]  # no GPU here: the H100/H200's


@pytest.mark.parametrize("visible, found", [(["90"], True), (["80"], False),
                                            (["80", "90"], False)])
def test_a_cached_wheel_serves_only_gpus_it_has_kernels_for(visible, found, tmp_path,
                                                            monkeypatch):
    monkeypatch.setattr(build_horovod, "CACHE", tmp_path)
    _wheel(tmp_path, None)  # an older folder: it never said its architectures
    sm90 = _wheel(tmp_path, "90")
    got = build_horovod.cached_wheels(TORCH, "gpu", STD, visible)
    assert got == ([sm90] if found else [])
    assert build_horovod.missing_archs(sm90, visible) == sorted(set(visible) - {"90"})
    both = _wheel(tmp_path, "80-90")
    assert build_horovod.cached_wheels(TORCH, "gpu", STD, visible)[-1] in (sm90, both)


@pytest.mark.parametrize("mode", ["cpu", "gpu"])
def test_find_pytorch_asked_once_answers_as_torch_does(mode, tmp_path):
    """The FindPytorch the build writes (one Python instead of seven, each importing torch)
    gives CMake what torch's own extension helpers say: the version, CUDA only in GPU mode
    with a toolkit, the extension's include folders and libraries, found on disk."""
    import shutil
    import subprocess

    import torch
    from torch.utils import cpp_extension

    cmake = shutil.which("cmake", path=str(Path(sys.executable).parent)) or shutil.which("cmake")
    if cmake is None:
        pytest.skip("no cmake here (make horovod installs it into the virtual environment)")
    cuda = mode == "gpu" and torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    (tmp_path / "FindPytorch.cmake").write_text(
        build_horovod.FIND_PYTORCH.replace("@CPU_ONLY@", str(mode == "cpu")))
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.13)\nproject(probe NONE)\n"
        'list(APPEND CMAKE_MODULE_PATH "${CMAKE_SOURCE_DIR}")\n'
        "find_package(Pytorch REQUIRED)\n"
        'foreach(v Pytorch_VERSION Pytorch_CUDA Pytorch_INCLUDE_DIRS Pytorch_LIBRARIES '
        'Pytorch_COMPILE_FLAGS)\n  message(STATUS "${v}=${${v}}")\nendforeach()\n')
    proc = subprocess.run([cmake, "-S", str(tmp_path), "-B", str(tmp_path / "build"),
                           f"-DPY_EXE={sys.executable}"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = dict(line.removeprefix("-- ").split("=", 1) for line in proc.stdout.splitlines()
                if line.startswith("-- Pytorch_"))
    ext = (cpp_extension.CUDAExtension if cuda else cpp_extension.CppExtension)("", [])
    assert said["Pytorch_VERSION"] == torch.__version__
    assert said["Pytorch_CUDA"] == str(cuda).upper()
    assert said["Pytorch_INCLUDE_DIRS"].split(";") == ext.include_dirs
    # each library as CMake found it (torch's own in its lib folder), or its NOTFOUND
    # placeholder as the original module gave (the CUDA runtime outside torch's wheel here)
    found = said["Pytorch_LIBRARIES"].split(";")
    names = [lib.removeprefix("FOUND_LIB_").removesuffix("-NOTFOUND")
             if lib.endswith("-NOTFOUND") else Path(lib).name[3:].split(".so")[0]
             for lib in found]
    assert names == ext.libraries, found
    assert all(Path(lib).is_file() for lib in found if Path(lib).name.startswith("libtorch"))
    abi = int(torch.compiled_with_cxx11_abi())
    assert said["Pytorch_COMPILE_FLAGS"].split() == [f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
