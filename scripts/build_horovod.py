"""Build Horovod 0.28.1 for the installed torch and install it (``make horovod``), offline.

``pip install horovod`` fails against torch >= 2.1: the 0.28.1 release compiles as C++14,
torch 2.1+ headers need C++17 and the newest need C++20. The build has two phases, so that
the offline path is the path taken every time:

1. **Fill** a wheelhouse folder (default ``.cache/horovod-wheelhouse/``, ignored by git) with
   Horovod's source distribution and the wheels of its build and run-time dependencies. This
   is the only step that touches the network, and it is skipped when the folder is already
   complete (``COMPLETE-py3.X`` lists what it holds). ``--python-version 3.12`` fills it for
   another interpreter, e.g. a GPU machine without network: copy the folder there.
2. **Build** with the package index switched off (``PIP_NO_INDEX=1``, ``--find-links``): raise
   the C++ standard (and the CUDA one, pinned to 11) in a fresh copy of the source, and build a
   wheel with Gloo on and MPI, TensorFlow and MXNet off:

   - GPU mode (a GPU is visible and a CUDA toolkit is found): NCCL GPU operations, the NCCL
     that torch's wheel ships (found under site- or dist-packages; CMake wants a
     ``libnccl.so`` beside its ``libnccl.so.2``, so a link folder is made), kernels for the
     visible GPUs' architectures only (``HOROVOD_BUILD_CUDA_CC_LIST`` overrides).
   - CPU mode (otherwise): no CUDA code at all. ``HOROVOD_BUILD_MODE=cpu|gpu`` overrides.
     A GPU machine without a toolkit installs a GPU-mode wheel from the cache when one was
     built for its torch and Python elsewhere (``HOROVOD_BUILD_MODE=gpu`` cross-compiles it
     for sm_90 where nvcc is; ``make gpu-wheels`` does so for the GPU machine).

The wheel is kept in ``.cache/horovod/`` under a name with the torch version and mode (and in
GPU mode the CUDA architectures it has kernels for, checked against the visible GPUs before a
cached wheel is installed: an sm_90 wheel on an A100 would fail with "no kernel image"), so a
second ``make horovod`` installs it in seconds (``HOROVOD_WHEEL_CACHE`` moves that folder,
e.g. into a folder carried to a GPU machine). ``--target DIR`` installs into DIR (for an
interpreter you may not install into; put DIR on PYTHONPATH). Horovod's source is never
committed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from safe_tar import extract  # scripts/ is on the path: run as a script
from wheel_strip import strip_wheel

VERSION = "0.28.1"
PYTHON_TAG = f"cp{sys.version_info.major}{sys.version_info.minor}"  # of the wheels built here
ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "horovod"
CACHE = Path(os.environ.get("HOROVOD_WHEEL_CACHE", ROOT / ".cache" / "horovod"))
TOOLS = BUILD / "tools"  # build dependencies, with --target
WHEELHOUSE = ROOT / ".cache" / "horovod-wheelhouse"
SDIST = f"horovod-{VERSION}.tar.gz"
# setup.py's build needs (no build isolation: it must see torch) and Horovod's run-time needs.
BUILD_DEPS = ["wheel", "setuptools", "cmake>=3.18,<4"]
RUNTIME_DEPS = ["cloudpickle", "psutil", "pyyaml", "packaging", "cffi"]


def log(msg: str) -> None:
    print(f"[make horovod] {msg}", flush=True)


def run(cmd: list[str], **kwargs) -> None:
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, **kwargs)


def pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", *args]


# --- phase 1: the wheelhouse -------------------------------------------------------------

def marker(house: Path, python_version: str) -> Path:
    return house / f"COMPLETE-py{python_version}"


def is_complete(house: Path, python_version: str) -> bool:
    mark = marker(house, python_version)
    if not mark.exists():
        return False
    return all((house / name).exists() for name in mark.read_text().split())


def fill(house: Path, python_version: str) -> None:
    """Download the sdist and the dependency wheels for ``python_version`` (network)."""
    if is_complete(house, python_version):
        log(f"wheelhouse {house} is complete for Python {python_version}; nothing downloaded")
        return
    house.mkdir(parents=True, exist_ok=True)
    if not (house / SDIST).exists():
        run(pip("download", "--quiet", "--no-deps", "--no-binary", ":all:", "-d", str(house),
                f"horovod=={VERSION}"))
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    target = [] if python_version == here else ["--python-version", python_version]
    run(pip("download", "--quiet", "--only-binary", ":all:", *target, "-d", str(house),
            *BUILD_DEPS, *RUNTIME_DEPS))
    names = sorted(p.name for p in house.iterdir() if p.suffix in (".whl", ".gz"))
    marker(house, python_version).write_text("\n".join(names) + "\n")
    log(f"wheelhouse {house} filled for Python {python_version}: {len(names)} files")


# --- phase 2: the offline build ------------------------------------------------------------

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


def visible_capabilities() -> list[str]:
    """Compute capabilities of the visible GPUs, e.g. ['90'] (empty without one)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return []
        caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
        return sorted(f"{major}{minor}" for major, minor in caps)
    except Exception:
        return []


def choose_mode(torch_has_cuda: bool) -> tuple[str, Path | None]:
    forced = os.environ.get("HOROVOD_BUILD_MODE", "").lower()
    toolkit = cuda_toolkit_root()
    if forced not in ("", "cpu", "gpu"):
        sys.exit("HOROVOD_BUILD_MODE must be cpu or gpu")
    if forced == "gpu" or (not forced and visible_capabilities() and toolkit and torch_has_cuda):
        if toolkit is None:
            sys.exit("GPU build asked for but no CUDA toolkit found; set CUDA_HOME")
        return "gpu", toolkit
    reason = "forced" if forced else (
        "no GPU visible" if toolkit else "no CUDA toolkit found"
    )
    log(f"CPU-only build ({reason}); Gloo collectives, CUDA tensors staged through host memory")
    return "cpu", None


def patch_source(src: Path, std: int, mode: str) -> None:
    def sub(rel: str, pattern: str, repl: str, what: str) -> None:
        path = src / rel
        text, n = re.subn(pattern, repl, path.read_text())
        if n == 0:
            sys.exit(f"cannot patch {rel}: {what} not found")
        path.write_text(text)
        log(f"patched {rel}: {what}")

    for rel in ("CMakeLists.txt", "horovod/torch/CMakeLists.txt"):
        sub(rel, r"set\(CMAKE_CXX_STANDARD 14\)", f"set(CMAKE_CXX_STANDARD {std})",
            f"C++14 -> C++{std}")
    # GCC 13+ no longer includes <string>/<cstdint>/<stdexcept> through other standard
    # headers; 0.28.1 relies on that (seen on the GPU machine's GCC: "std::string does not
    # name a type", "logic_error is not a member of std").
    sub("horovod/common/group_table.h", r"#include <unordered_map>",
        "#include <cstdint>\n#include <string>\n#include <unordered_map>",
        "<string> and <cstdint> included")
    sub("horovod/common/common.h", r"#include <functional>",
        "#include <functional>\n#include <stdexcept>", "<stdexcept> included")
    # setup.py builds RelWithDebInfo (-O3 -g once Horovod's CMakeLists raises -O2): the debug
    # information was a fifth of the build's CPU (261 -> 213 CPU-s in CPU mode) and stripped
    # from the wheel afterwards (strip_wheel); -g changes no generated code. It is not made
    # (Gloo, added to the build below these lines, inherits the flags).
    marker_line = ('string(REPLACE "-O2" "-O3" CMAKE_CXX_FLAGS_RELWITHDEBINFO '
                   '"${CMAKE_CXX_FLAGS_RELWITHDEBINFO}")')
    sub("CMakeLists.txt", re.escape(marker_line), marker_line.replace("\\", "\\\\") + "".join(
        f'\nstring(REPLACE "-g" "" CMAKE_{lang}_FLAGS_RELWITHDEBINFO '
        f'"${{CMAKE_{lang}_FLAGS_RELWITHDEBINFO}}")' for lang in ("C", "CXX", "CUDA")),
        "no debug information")
    # nvcc of CUDA 12+ rejects --std=c++11 next to today's headers.
    sub("horovod/common/ops/cuda/CMakeLists.txt", r"set\(CMAKE_CUDA_STANDARD 11\)",
        "set(CMAKE_CUDA_STANDARD 17)", "CUDA C++11 -> C++17")
    # FindPytorch asks torch seven questions (eight with ROCm), each in a Python of its own
    # that imports torch (12.8 of the configure's 19 s here): one answers them all (FIND_PYTORCH).
    find = src / "cmake" / "Modules" / "FindPytorch.cmake"
    if find.read_text().count("execute_process(COMMAND ${PY_EXE}") != 8:
        sys.exit("cannot patch cmake/Modules/FindPytorch.cmake: not 0.28.1's eight questions")
    find.write_text(FIND_PYTORCH.replace("@CPU_ONLY@", str(mode == "cpu")))
    log("patched cmake/Modules/FindPytorch.cmake: torch asked once")
    if mode == "cpu":
        # Horovod builds CUDA code whenever torch is a CUDA build and a toolkit exists; in CPU
        # mode FindPytorch says this torch has no CUDA (above), and no CUDA compiler is
        # looked for (nvcc on PATH: 4.7 s of compiling CMake's test files)
        sub("CMakeLists.txt", r"check_language\(CUDA\)\nif\(NOT CMAKE_CUDA_COMPILER\)",
            "if(FALSE)  # CPU mode (parallel-bench): no CUDA compiler", "CPU-only")


# Horovod 0.28.1's FindPytorch.cmake, its seven ``python -c "import torch; ..."`` calls made
# one: the Python writes the answers as a CMake file, which the module includes. The rest is
# the original's (Pytorch_EXT, the libraries found, the C++11 ABI flag).
FIND_PYTORCH = r"""# FindPytorch for parallel-bench's Horovod build (scripts/build_horovod.py): sets
#  PYTORCH_FOUND Pytorch_INCLUDE_DIRS Pytorch_LIBRARY_DIRS Pytorch_LIBRARIES
#  Pytorch_COMPILE_FLAGS Pytorch_VERSION Pytorch_CUDA Pytorch_ROCM Pytorch_CXX11
list(APPEND CMAKE_PREFIX_PATH ${Pytorch_ROOT})
set(_answers "${CMAKE_BINARY_DIR}/pytorch_answers.cmake")
file(REMOVE "${_answers}")
execute_process(COMMAND ${PY_EXE} -c "
import os, sys
sys.stdout = sys.stderr = open(os.devnull, 'w')  # torch's warnings
import torch
from torch.utils import cpp_extension as c
cuda = torch.version.cuda is not None and c.CUDA_HOME is not None and not @CPU_ONLY@
rocm = torch.version.hip is not None and c.ROCM_HOME is not None
ext = (c.CUDAExtension if cuda or rocm else c.CppExtension)('', [])
answers = dict(Pytorch_VERSION=torch.__version__, Pytorch_CUDA=str(cuda).upper(),
               Pytorch_ROCM=str(rocm).upper(),
               Pytorch_COMPILE_FLAGS=' '.join(c.COMMON_HIPCC_FLAGS) if rocm else '',
               Pytorch_EXT='CUDAExtension' if cuda or rocm else 'CppExtension',
               Pytorch_INCLUDE_DIRS=';'.join(ext.include_dirs),
               Pytorch_LIBRARY_DIRS=';'.join(ext.library_dirs),
               _Pytorch_LIBRARIES=';'.join(ext.libraries),
               Pytorch_CXX11=str(torch.compiled_with_cxx11_abi()).upper())
q = lambda v: v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))
with open(sys.argv[1], 'w') as f:
    f.writelines(f'set({k} {chr(34)}{q(v)}{chr(34)})' + chr(10) for k, v in answers.items())
" "${_answers}")
if(EXISTS "${_answers}")
    include("${_answers}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Pytorch REQUIRED_VARS Pytorch_VERSION VERSION_VAR Pytorch_VERSION)
if(NOT PYTORCH_FOUND)
    return()
endif()
foreach(_LIB IN LISTS _Pytorch_LIBRARIES)
    find_library(FOUND_LIB_${_LIB} NAMES ${_LIB} HINTS ${Pytorch_LIBRARY_DIRS})
    list(APPEND Pytorch_LIBRARIES ${FOUND_LIB_${_LIB}})
endforeach()
if (Pytorch_CXX11)
    set(Pytorch_COMPILE_FLAGS "${Pytorch_COMPILE_FLAGS} -D_GLIBCXX_USE_CXX11_ABI=1")
else()
    set(Pytorch_COMPILE_FLAGS "${Pytorch_COMPILE_FLAGS} -D_GLIBCXX_USE_CXX11_ABI=0")
endif()
mark_as_advanced(Pytorch_INCLUDE_DIRS Pytorch_LIBRARY_DIRS Pytorch_LIBRARIES Pytorch_COMPILE_FLAGS
                 Pytorch_VERSION Pytorch_CUDA Pytorch_ROCM Pytorch_CXX11)
"""


def find_wheel_nccl() -> Path | None:
    """The folder (holding include/nccl.h and lib/libnccl.so*) of the NCCL wheel torch uses,
    wherever this interpreter installs packages (site-packages or Debian's dist-packages)."""
    for entry in map(Path, sys.path):
        for header in sorted(entry.glob("nvidia/**/include/nccl.h")):
            home = header.parent.parent
            if list((home / "lib").glob("libnccl.so*")):
                return home
    return None


def nccl_link_folder(home: Path) -> Path:
    """include/ and lib/ with a ``libnccl.so`` link: CMake's find_library(nccl) wants the
    unversioned name, the wheel ships only ``libnccl.so.2``."""
    links = BUILD / "nccl"
    shutil.rmtree(links, ignore_errors=True)
    (links / "lib").mkdir(parents=True)
    (links / "include").symlink_to(home / "include")
    real = sorted((home / "lib").glob("libnccl.so*"))[0]
    (links / "lib" / "libnccl.so").symlink_to(real)
    return links


def install_build_deps(house: Path, *, separate: bool) -> None:
    """From the wheelhouse into the interpreter, or (``separate``, when it may not be
    installed into) into ``build/horovod/tools``, which the build then puts on its paths."""
    offline = ["--no-index", "--find-links", str(house)]
    if not separate:
        run(pip("install", "--quiet", *offline, *BUILD_DEPS))
        return
    run(pip("install", "--quiet", *offline, "--target", str(TOOLS), "--upgrade", *BUILD_DEPS))


def build_env(mode: str, toolkit: Path | None, house: Path,
              archs: list[str] | None = None) -> dict[str, str]:
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
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(house),
        # GCC 13+ no longer pulls <string>, <stdexcept>, <cstdint> in through other standard
        # headers, and 0.28.1 relies on that in several files: include them everywhere.
        CXXFLAGS=" ".join(filter(None, [os.environ.get("CXXFLAGS"), "-include cstdint",
                                         "-include stdexcept", "-include string"])),
    )
    if TOOLS.exists():
        env["PATH"] = f"{TOOLS / 'bin'}{os.pathsep}{env['PATH']}"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TOOLS), env.get("PYTHONPATH")]))
    for key in ("HOROVOD_GPU_OPERATIONS", "HOROVOD_GPU_ALLREDUCE", "HOROVOD_GPU_BROADCAST"):
        env.pop(key, None)
    if mode == "gpu":
        assert toolkit is not None
        env.update(HOROVOD_GPU_OPERATIONS="NCCL", HOROVOD_CUDA_HOME=str(toolkit),
                   CUDA_HOME=str(toolkit), CUDAToolkit_ROOT=str(toolkit))
        env["HOROVOD_BUILD_CUDA_CC_LIST"] = ",".join(archs or build_archs())
        log(f"CUDA architectures: {env['HOROVOD_BUILD_CUDA_CC_LIST']}")
        home = find_wheel_nccl()
        if home is not None:  # else Horovod's CMake finds a system NCCL itself
            links = nccl_link_folder(home)
            env.update(HOROVOD_NCCL_INCLUDE=str(links / "include"),
                       HOROVOD_NCCL_LIB=str(links / "lib"), HOROVOD_NCCL_LINK="SHARED")
            log(f"NCCL from {home}")
    else:
        env.pop("CUDA_HOME", None)
        env.pop("HOROVOD_CUDA_HOME", None)
    return env


def build_wheel(house: Path, out: Path, std: int, mode: str, toolkit: Path | None,
                archs: list[str]) -> None:
    src_root = BUILD / "src"
    shutil.rmtree(src_root, ignore_errors=True)  # a fresh copy: the patches apply once
    src_root.mkdir(parents=True)
    extract(house / SDIST, src_root)
    src = src_root / f"horovod-{VERSION}"
    patch_source(src, std, mode)
    run(pip("wheel", "--no-index", "--no-build-isolation", "--no-deps", "-w", str(out),
            str(src)), env=build_env(mode, toolkit, house, archs))
    for wheel in out.glob(f"horovod-{VERSION}-{PYTHON_TAG}-*.whl"):  # CMake links with -g
        log(strip_wheel(wheel))


def install(wheel: Path, house: Path, target: Path | None) -> None:
    offline = ["--no-index", "--find-links", str(house)]
    where = ["--target", str(target), "--upgrade"] if target else []
    run(pip("install", "--quiet", *offline, *where, *RUNTIME_DEPS))
    run(pip("install", "--quiet", *offline, *where, "--no-deps", "--force-reinstall",
            str(wheel)))


def verify(target: Path | None) -> None:
    env = dict(os.environ)
    if target:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), env.get("PYTHONPATH")]))
    run([sys.executable, "-c",
         "import horovod.torch as hvd; print('gloo_built:', hvd.gloo_built(), "
         "'nccl_built:', hvd.nccl_built())"], env=env)
    run([sys.executable, "-m", "horovod.runner.launch", "--check-build"], env=env)


def build_archs() -> list[str]:
    """The CUDA architectures a GPU build compiles kernels for: HOROVOD_BUILD_CUDA_CC_LIST,
    else the visible GPUs', else 90 (no GPU here: cross-compiled for the H100/H200)."""
    given = os.environ.get("HOROVOD_BUILD_CUDA_CC_LIST", "")
    archs = [a.strip().replace(".", "") for a in given.split(",") if a.strip()]
    return sorted(set(archs or visible_capabilities() or ["90"]))


def wheel_tag(torch_version: str, mode: str, std: int, archs: list[str] = ()) -> str:
    """The cache folder of the wheels built for this torch, mode, C++ standard and (GPU
    mode) CUDA architectures: a wheel with sm_90 kernels only fails on an A100 with "no
    kernel image", so the architectures are part of the key."""
    tag = f"torch{torch_version.replace('+', '_')}-{mode}-cxx{std}"
    return f"{tag}-sm{'-'.join(sorted(archs))}" if mode == "gpu" else tag


def wheel_archs(folder: Path) -> set[str]:
    """The architectures a GPU cache folder's wheels were built for (none: an older
    folder, whose key did not say them)."""
    found = re.search(r"-sm([\d-]+)$", folder.name)
    return set(found.group(1).split("-")) if found else set()


def cached_wheels(torch_version: str, mode: str, std: int,
                  archs: list[str] = ()) -> list[Path]:
    """Wheels in the cache for this torch, mode and C++ standard, built for this Python; in
    GPU mode from a folder whose architectures include every one of ``archs``."""
    pattern = f"horovod-{VERSION}-{PYTHON_TAG}-*.whl"
    if mode != "gpu":
        return sorted((CACHE / wheel_tag(torch_version, mode, std)).glob(pattern))
    for folder in sorted(CACHE.glob(wheel_tag(torch_version, "gpu", std) + "*")):  # -sm*
        if set(archs) <= wheel_archs(folder):
            wheels = sorted(folder.glob(pattern))
            if wheels:
                return wheels
    return []


def missing_archs(wheel: Path, visible: list[str]) -> list[str]:
    """The visible GPUs' architectures a GPU wheel has no kernels for."""
    return sorted(set(visible) - wheel_archs(wheel.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheelhouse", type=Path, default=WHEELHOUSE,
                        help="folder of the sdist and dependency wheels (filled when incomplete)")
    parser.add_argument("--fill-only", action="store_true",
                        help="only fill the wheelhouse (the step that needs the network)")
    parser.add_argument("--python-version", default=None,
                        help="fill for this interpreter version (e.g. 3.12), with --fill-only")
    parser.add_argument("--target", type=Path, default=None,
                        help="install into this folder instead of the interpreter")
    args = parser.parse_args()
    house = args.wheelhouse.resolve()
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if args.python_version and not args.fill_only:
        sys.exit("--python-version fills a wheelhouse for another machine: add --fill-only")
    fill(house, args.python_version or here)
    if args.fill_only:
        return

    torch_version, torch_dir, torch_has_cuda = torch_info()
    std = cxx_standard(torch_dir)
    mode, toolkit = choose_mode(torch_has_cuda)
    visible = visible_capabilities()
    if (mode == "cpu" and not os.environ.get("HOROVOD_BUILD_MODE") and torch_has_cuda
            and visible and cached_wheels(torch_version, "gpu", std)):
        log("no CUDA toolkit here, but the cache holds a GPU wheel built elsewhere for this "
            "torch and Python: installing it (NCCL and the CUDA runtime come from torch's "
            "wheels)")
        mode = "gpu"
    archs = build_archs() if mode == "gpu" else []
    tag = wheel_tag(torch_version, mode, std, archs)
    shutil.rmtree(TOOLS, ignore_errors=True)
    cached = cached_wheels(torch_version, mode, std, (visible or archs) if mode == "gpu" else [])
    if mode == "gpu" and not cached and toolkit is None:  # a wheel for other GPUs only
        built = cached_wheels(torch_version, "gpu", std)
        sys.exit(f"the cached Horovod GPU wheel {built[-1].parent.name} has no kernels for "
                 f"this machine's GPUs (sm_{', sm_'.join(missing_archs(built[-1], visible))}"
                 "): build it where nvcc is with HOROVOD_BUILD_CUDA_CC_LIST naming them "
                 "(e.g. 80,90), or install a CUDA toolkit here")
    if not cached:
        install_build_deps(house, separate=args.target is not None)
        log(f"building Horovod {VERSION} for torch {torch_version}: {mode} mode, C++{std}"
            f"{', sm_' + ', sm_'.join(archs) if archs else ''}, package index off")
        build_wheel(house, CACHE / tag, std, mode, toolkit, archs)
        cached = cached_wheels(torch_version, mode, std, archs)
    else:
        shown = cached[-1]  # HOROVOD_WHEEL_CACHE may lie outside the checkout
        log(f"using the cached wheel "
            f"{shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown}")
    wheel, target = cached[-1], args.target.resolve() if args.target else None
    stamp = Path(sys.prefix) / "horovod-installed.txt"  # this interpreter's, not --target's
    if target is None:
        if installed_from(stamp, wheel):
            log("installed from this wheel and verified before; nothing to do")
            return
        stamp.unlink(missing_ok=True)  # until this install is verified
    install(wheel, house, target)
    verify(target)
    if target is None:
        stamp.write_text(wheel_id(wheel))


def wheel_id(wheel: Path) -> str:
    """The wheel file as it is now: its path, size and modification time."""
    info = wheel.stat()
    return f"{wheel.resolve()} {info.st_size} {info.st_mtime_ns}\n"


def installed_from(stamp: Path, wheel: Path) -> bool:
    """Whether this interpreter holds Horovod from ``wheel`` (its stamp, written once the
    install was verified, names that very file) and still finds it: a second install and
    check would only take 10 s of every `make test`."""
    try:
        return (stamp.read_text() == wheel_id(wheel)
                and importlib.util.find_spec("horovod.torch") is not None)
    except (OSError, ImportError, ValueError):
        return False


if __name__ == "__main__":
    main()
