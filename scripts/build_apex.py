"""Build NVIDIA apex 25.05 from its own source and install it (``make apex``).

NVIDIA removed ``apex.amp`` and ``apex.parallel`` after tag 25.05 and never put apex on PyPI
(PyPI's ``apex`` is an unrelated package). The source comes from ``APEX_SRC`` (a directory or
a tarball of the 25.05 source, e.g. ``git archive 25.05`` carried to a machine without
network) or, without it, from ``git clone --branch 25.05``. The build tries, in order:

1. the C++ and CUDA extensions (``--cpp_ext --cuda_ext``; a CUDA toolkit and a CUDA build of
   torch needed, no GPU: it cross-compiles), and only the three that ``apex.amp`` and
   ``apex.parallel`` import (``apex_C``, ``amp_C``, ``syncbn``), not the ~30 others, for the
   visible GPUs' architectures (else ``TORCH_CUDA_ARCH_LIST``, else 9.0) and never one below
   what nvcc supports (25.05 hard-codes ``compute_70``, which CUDA 13 rejects),
2. the C++ extension only (``apex_C``: flatten/unflatten for apex.parallel),
3. Python only: amp O1/O2 and ``apex.parallel`` work without the extensions (slower).

It installs the first that builds (``--target DIR`` installs into DIR instead of the
interpreter) and says which; a ``ddp-apex`` record's notes say which build ran. Wheels are
cached under ``APEX_WHEEL_CACHE`` (default ``.cache/apex``) keyed by the source's digest, the
torch and nvcc versions and the architectures, so a second build takes seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from safe_tar import extract  # scripts/ is on the path: run as a script
from wheel_strip import strip_wheel

TAG = "25.05"
REPO = "https://github.com/NVIDIA/apex"
ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "apex"
CACHE = Path(os.environ.get("APEX_WHEEL_CACHE", ROOT / ".cache" / "apex"))
# What apex.amp (amp_C: loss scaling, multi-tensor ops) and apex.parallel (apex_C: flatten,
# syncbn: the Welford kernels) import; the other extensions serve code this project never runs.
KEEP_EXTENSIONS = ("apex_C", "amp_C", "syncbn")
ATTEMPTS = {  # name -> setup.py build options
    "cuda-extensions": ["--cpp_ext", "--cuda_ext"],
    "cpp-extension": ["--cpp_ext"],
    "python-only": [],
}


def log(msg: str) -> None:
    print(f"[make apex] {msg}", flush=True)


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    log("$ " + " ".join(cmd))
    return subprocess.run(cmd, **kwargs)


def fetch_source(given: str | None) -> Path:
    """A fresh copy of the 25.05 source in build/apex/src."""
    src = BUILD / "src"
    shutil.rmtree(src, ignore_errors=True)
    if given:
        path = Path(given).expanduser().resolve()
        if path.is_dir():
            shutil.copytree(path, src, ignore=shutil.ignore_patterns(".git"))
        elif path.is_file():
            src.mkdir(parents=True)
            extract(path, src)
            inner = [p for p in src.iterdir()]
            if len(inner) == 1 and inner[0].is_dir() and not (src / "setup.py").exists():
                src = inner[0]  # a tarball with a top folder (apex-25.05/...)
        else:
            sys.exit(f"APEX_SRC={given} is neither a folder nor a tarball")
    else:
        BUILD.mkdir(parents=True, exist_ok=True)
        done = run(["git", "clone", "--quiet", "--depth", "1", "--branch", TAG, REPO, str(src)])
        if done.returncode:
            sys.exit(f"cannot clone {REPO} tag {TAG}; give the source with APEX_SRC=DIR|TARBALL")
    if not (src / "apex" / "amp").is_dir() or not (src / "apex" / "parallel").is_dir():
        sys.exit(f"{src} is not apex 25.05: apex/amp and apex/parallel are missing")
    return src


def can_build_cuda() -> tuple[bool, str]:
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME
    except Exception as exc:  # pragma: no cover - torch is a requirement
        return False, f"torch: {exc}"
    if torch.version.cuda is None:
        return False, "torch is a CPU-only build"
    if CUDA_HOME is None:
        return False, "no CUDA toolkit (nvcc) found"
    return True, ""


def arch_list() -> str:
    """The visible GPUs' capabilities, else TORCH_CUDA_ARCH_LIST, else 9.0 (H100/H200).

    The GPUs come first: the lent machines' images set TORCH_CUDA_ARCH_LIST=9.0a, which
    named another wheel than the 9.0 one built beforehand on a machine without a GPU (the
    list is part of the cache key), so every lease compiled apex again (98-160 s)."""
    import torch

    if torch.cuda.is_available():
        caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
        return ";".join(f"{major}.{minor}" for major, minor in sorted(caps))
    if "TORCH_CUDA_ARCH_LIST" in os.environ:
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    return "9.0"


PATCH = """
# --- parallel-bench: only the extensions apex.amp / apex.parallel import, and only
# --- -gencode targets of the architectures asked for (nvcc 13 rejects compute_70).
_keep = {keep!r}
_archs = {archs!r}
ext_modules = [e for e in ext_modules if e.name in _keep]
for _e in ext_modules:
    _args = _e.extra_compile_args if isinstance(_e.extra_compile_args, dict) else {{}}
    _flags, _kept = list(_args.get("nvcc", [])), []
    while _flags:
        _f = _flags.pop(0)
        if _f == "-gencode" and _flags:
            _target = _flags.pop(0)
            if any("compute_" + a + "," in _target for a in _archs):
                _kept += [_f, _target]
            continue
        _kept.append(_f)
    if "nvcc" in _args:
        _args["nvcc"] = _kept

setup("""


def patch_setup(src: Path, archs: str) -> None:
    """Keep KEEP_EXTENSIONS and the asked-for architectures in a fresh copy's setup.py."""
    setup_py = src / "setup.py"
    text = setup_py.read_text()
    if text.count("\nsetup(") != 1:
        sys.exit(f"{setup_py}: cannot find its setup( call; is this apex 25.05?")
    # CUDA keeps binary compatibility within a major version (torch cu132 with nvcc 13.0).
    exact = "if (bare_metal_version != torch_binary_version):"
    if exact in text:
        text = text.replace(exact, "if bare_metal_version.major != torch_binary_version.major:")
    digits = [a.replace(".", "").replace("+PTX", "") for a in re.split(r"[;, ]+", archs) if a]
    setup_py.write_text(text.replace("\nsetup(", PATCH.format(keep=KEEP_EXTENSIONS,
                                                             archs=digits), 1))


def wheel_cuda_paths() -> dict[str, str]:
    """CPATH/LIBRARY_PATH additions for CUDA headers and libcudart from torch's pip wheels.

    A toolkit with only nvcc (as on CI) lacks cusparse.h and friends, which torch's headers
    include; the nvidia/cu13 wheel has them, and a libcudart.so link for the linker (the wheel
    ships only libcudart.so.13). Appended after the toolkit's own paths, so a full toolkit wins.
    """
    includes, libs = [], []
    for entry in map(Path, sys.path):
        for inc in sorted(entry.glob("nvidia/*/include")):
            if (inc / "cusparse.h").exists() or (inc / "cublas_v2.h").exists():
                includes.append(str(inc))
        for lib in sorted(entry.glob("nvidia/*/lib/libcudart.so.*")):
            links = BUILD / "cudart-link"
            links.mkdir(parents=True, exist_ok=True)
            link = links / "libcudart.so"
            link.unlink(missing_ok=True)
            link.symlink_to(lib)
            libs += [str(links), str(lib.parent)]
    paths = {}
    for name, found in (("CPATH", includes), ("LIBRARY_PATH", libs)):
        if found:
            paths[name] = os.pathsep.join(filter(None, [os.environ.get(name), *found]))
    return paths


def cache_key(src: Path, name: str, archs: str) -> str:
    """Source digest, torch, nvcc and architectures: what changes the built wheel."""
    import torch

    digest = hashlib.sha256()
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(src)).encode())
        digest.update(path.read_bytes())
    nvcc = ""
    if name == "cuda-extensions":
        from torch.utils.cpp_extension import CUDA_HOME

        out = subprocess.run([str(Path(CUDA_HOME or "") / "bin" / "nvcc"), "--version"],
                             capture_output=True, text=True).stdout
        nvcc = (re.findall(r"release ([\d.]+)", out) or ["none"])[0]
    arch = archs.replace(";", "_").replace(" ", "_") if name == "cuda-extensions" else "any"
    return (f"{name}-{digest.hexdigest()[:12]}-torch{torch.__version__.replace('+', '_')}"
            f"-nvcc{nvcc or 'none'}-arch{arch}")


def try_build(src: Path, name: str, archs: str) -> Path | None:
    out = CACHE / cache_key(src, name, archs)
    cached = sorted(out.glob("apex-*.whl"))
    if cached:
        log(f"{name} wheel cached in {out}; not rebuilt")
        return cached[-1]
    shutil.rmtree(out, ignore_errors=True)
    options = [f"--config-settings=--build-option={o}" for o in ATTEMPTS[name]]
    env = dict(os.environ, MAX_JOBS=str(os.cpu_count() or 2))
    if name == "cuda-extensions":
        env.update(wheel_cuda_paths(), TORCH_CUDA_ARCH_LIST=archs)
    log(f"trying the {name} build" + (f" for {archs}" if name == "cuda-extensions" else ""))
    done = run([sys.executable, "-m", "pip", "wheel", "--no-index", "--no-build-isolation",
                "--no-deps", *options, "-w", str(out), str(src)], env=env,
               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    (BUILD / f"{name}.log").write_text(done.stdout)
    wheels = sorted(out.glob("apex-*.whl"))
    if done.returncode or not wheels:
        tail = " | ".join(done.stdout.strip().splitlines()[-3:])
        log(f"{name} build failed (log build/apex/{name}.log): {tail[-300:]}")
        return None
    log(strip_wheel(wheels[-1]))  # its extensions link with -g
    return wheels[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=None,
                        help="install into this folder instead of the interpreter")
    parser.add_argument("--python-only", action="store_true",
                        help="skip the extension builds")
    args = parser.parse_args()
    src = fetch_source(os.environ.get("APEX_SRC"))
    archs = arch_list()
    patch_setup(src, archs)
    cuda_ok, why = can_build_cuda()
    names = list(ATTEMPTS)
    if args.python_only:
        names = ["python-only"]
    elif not cuda_ok:
        log(f"no CUDA extensions ({why})")
        names.remove("cuda-extensions")
    for name in names:
        wheel = try_build(src, name, archs)
        if wheel is not None:
            break
    else:
        sys.exit("apex did not build (logs in build/apex/)")
    where = ["--target", str(args.target.resolve()), "--upgrade"] if args.target else []
    done = run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                "--force-reinstall", *where, str(wheel)])
    if done.returncode:
        sys.exit("installing the apex wheel failed")
    env = dict(os.environ)
    if args.target:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(args.target.resolve()),
                                                          env.get("PYTHONPATH")]))
    check = run([sys.executable, "-c", "import sys; sys.path.insert(0, '.'); "
                 "from strategies.apex import apex_problem, apex_build; "
                 "p = apex_problem(); print(p or 'apex ' + apex_build()); sys.exit(bool(p))"],
                env=env, cwd=ROOT)
    if check.returncode:
        sys.exit("apex installed but not usable (see above)")
    log(f"installed NVIDIA apex {TAG}: {name}")


if __name__ == "__main__":
    main()
