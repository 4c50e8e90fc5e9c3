"""Build Horovod 0.28.1 for the installed torch and install it (``make horovod``).

``pip install horovod`` fails against torch >= 2.1: the 0.28.1 release compiles as C++14,
torch 2.1+ headers need C++17 and the newest need C++20. This script downloads the registry's
source distribution into ``build/horovod/``, raises the C++ standard in a copy of it, and
builds a wheel with Gloo on and MPI, TensorFlow and MXNet off:

- GPU mode (a GPU is visible and a CUDA toolkit is found): NCCL GPU operations.
- CPU mode (otherwise, e.g. a toolkit but no GPU): no CUDA code at all.
  ``HOROVOD_BUILD_MODE=cpu|gpu`` overrides the choice.

The wheel is kept in ``.cache/horovod/`` (ignored by git) under a name that includes the torch
version and mode, so a second ``make horovod`` installs it in seconds. Horovod's source is
never committed.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

VERSION = "0.28.1"
ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "horovod"
CACHE = ROOT / ".cache" / "horovod"


def log(msg: str) -> None:
    print(f"[make horovod] {msg}", flush=True)


def run(cmd: list[str], **kwargs) -> None:
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, **kwargs)


def torch_info() -> tuple[str, Path, bool]:
    import torch

    return torch.__version__, Path(torch.__file__).parent, torch.version.cuda is not None


def cxx_standard(torch_dir: Path) -> int:
    """The C++ standard the installed torch headers demand (20 for the newest, else 17)."""
    header = torch_dir / "include" / "torch" / "csrc" / "api" / "include" / "torch" / "all.h"
    text = header.read_text() if header.exists() else ""
    return 20 if "C++20" in text else 17


def cuda_toolkit_root() -> Path | None:
    """The toolkit folder: $CUDA_HOME / $CUDA_PATH, /usr/local/cuda, or one that holds a real
    nvcc (the nvcc on PATH may be a wrapper outside the toolkit)."""
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env) and (Path(os.environ[env]) / "bin" / "nvcc").exists():
            return Path(os.environ[env])
    candidates = [Path("/usr/local/cuda"), *sorted(Path("/usr/local").glob("cuda-*"))]
    for path in candidates:
        if (path / "bin" / "nvcc").exists() and (path / "include" / "cuda_runtime.h").exists():
            return path.resolve()
    return None


def gpu_visible() -> bool:
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        if out.returncode == 0 and "GPU" in out.stdout:
            return True
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def choose_mode(torch_has_cuda: bool) -> tuple[str, Path | None]:
    forced = os.environ.get("HOROVOD_BUILD_MODE", "").lower()
    toolkit = cuda_toolkit_root()
    if forced not in ("", "cpu", "gpu"):
        sys.exit("HOROVOD_BUILD_MODE must be cpu or gpu")
    if forced == "gpu" or (not forced and gpu_visible() and toolkit and torch_has_cuda):
        if toolkit is None:
            sys.exit("GPU build asked for but no CUDA toolkit found; set CUDA_HOME")
        return "gpu", toolkit
    reason = "forced" if forced else (
        "no GPU visible" if toolkit else "no CUDA toolkit found"
    )
    log(f"CPU-only build ({reason}); Gloo collectives on CPU tensors")
    return "cpu", None


def patch_source(src: Path, std: int, mode: str) -> None:
    for rel in ("CMakeLists.txt", "horovod/torch/CMakeLists.txt"):
        path = src / rel
        text, n = re.subn(r"set\(CMAKE_CXX_STANDARD 14\)", f"set(CMAKE_CXX_STANDARD {std})",
                          path.read_text())
        if n == 0:
            sys.exit(f"cannot patch {rel}: no CMAKE_CXX_STANDARD 14 in it")
        path.write_text(text)
        log(f"patched {rel}: C++14 -> C++{std}")
    if mode == "cpu":
        # Horovod builds CUDA code whenever torch is a CUDA build and a toolkit exists; in CPU
        # mode tell its CMake that this torch has no CUDA.
        find = src / "cmake" / "Modules" / "FindPytorch.cmake"
        text = find.read_text()
        marker = 'string(TOUPPER "${Pytorch_CUDA}" Pytorch_CUDA)'
        if marker not in text:
            sys.exit("cannot patch FindPytorch.cmake for a CPU-only build")
        find.write_text(text.replace(marker, marker + '\nset(Pytorch_CUDA "FALSE")'))
        log("patched cmake/Modules/FindPytorch.cmake: CPU-only")


def build_env(mode: str, toolkit: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HOROVOD_WITH_PYTORCH="1",
        HOROVOD_WITH_GLOO="1",
        HOROVOD_WITHOUT_MPI="1",
        HOROVOD_WITHOUT_TENSORFLOW="1",
        HOROVOD_WITHOUT_MXNET="1",
        MAKEFLAGS=f"-j{os.cpu_count() or 2}",
        CMAKE_POLICY_VERSION_MINIMUM="3.5",  # Gloo's old cmake_minimum_required, on CMake 4
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    for key in ("HOROVOD_GPU_OPERATIONS", "HOROVOD_GPU_ALLREDUCE", "HOROVOD_GPU_BROADCAST"):
        env.pop(key, None)
    if mode == "gpu":
        assert toolkit is not None
        env.update(
            HOROVOD_GPU_OPERATIONS="NCCL",
            HOROVOD_CUDA_HOME=str(toolkit),
            CUDA_HOME=str(toolkit),
            CUDAToolkit_ROOT=str(toolkit),
        )
        nccl = glob.glob(str(Path(sys.prefix) / "lib" / "python3*" / "site-packages" /
                             "nvidia" / "nccl"))
        if nccl:  # the NCCL that torch's wheel ships
            env.update(HOROVOD_NCCL_INCLUDE=f"{nccl[0]}/include",
                       HOROVOD_NCCL_LIB=f"{nccl[0]}/lib", HOROVOD_NCCL_LINK="SHARED")
    else:
        env.pop("CUDA_HOME", None)
        env.pop("HOROVOD_CUDA_HOME", None)
    return env


def verify() -> None:
    run([sys.executable, "-c",
         "import horovod.torch as hvd; print('gloo_built:', hvd.gloo_built(), "
         "'nccl_built:', hvd.nccl_built())"])
    horovodrun = Path(sys.executable).parent / "horovodrun"
    run([str(horovodrun), "--check-build"])


def main() -> None:
    torch_version, torch_dir, torch_has_cuda = torch_info()
    std = cxx_standard(torch_dir)
    mode, toolkit = choose_mode(torch_has_cuda)
    tag = f"torch{torch_version.replace('+', '_')}-{mode}-cxx{std}"
    CACHE.mkdir(parents=True, exist_ok=True)
    cached = sorted((CACHE / tag).glob(f"horovod-{VERSION}-*.whl"))
    pip = [sys.executable, "-m", "pip"]
    # Build and run-time needs of horovod's setup.py (no build isolation: it must see torch).
    run([*pip, "install", "--quiet", "cloudpickle", "psutil", "pyyaml", "packaging", "cffi",
         "wheel", "setuptools", "cmake>=3.18,<4"])
    if not cached:
        log(f"building Horovod {VERSION} for torch {torch_version}: {mode} mode, C++{std}")
        shutil.rmtree(BUILD, ignore_errors=True)
        BUILD.mkdir(parents=True)
        run([*pip, "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             "-d", str(BUILD), f"horovod=={VERSION}"])
        with tarfile.open(next(BUILD.glob(f"horovod-{VERSION}.tar.gz"))) as tar:
            tar.extractall(BUILD)
        src = BUILD / f"horovod-{VERSION}"
        patch_source(src, std, mode)
        run([*pip, "wheel", "--no-build-isolation", "--no-deps", "-w", str(CACHE / tag),
             str(src)], env=build_env(mode, toolkit))
        cached = sorted((CACHE / tag).glob(f"horovod-{VERSION}-*.whl"))
    else:
        log(f"using the cached wheel {cached[-1].relative_to(ROOT)}")
    run([*pip, "install", "--quiet", "--no-deps", "--force-reinstall", str(cached[-1])])
    verify()


if __name__ == "__main__":
    main()
