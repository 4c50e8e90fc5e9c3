"""Build NVIDIA apex 25.05 from its own source and install it (``make apex``).

NVIDIA removed ``apex.amp`` and ``apex.parallel`` after tag 25.05 and never put apex on PyPI
(PyPI's ``apex`` is an unrelated package). The source comes from ``APEX_SRC`` (a directory or
a tarball of the 25.05 source, e.g. ``git archive 25.05`` carried to a machine without
network) or, without it, from ``git clone --branch 25.05``. The build tries, in order:

1. the C++ and CUDA extensions (``--cpp_ext --cuda_ext``; a GPU and a CUDA toolkit needed;
   kernels for the visible GPUs' architectures only, ``TORCH_CUDA_ARCH_LIST`` overrides),
2. the C++ extension only (``apex_C``: flatten/unflatten for apex.parallel),
3. Python only: amp O1/O2 and ``apex.parallel`` work without the extensions (slower).

It installs the first that builds (``--target DIR`` installs into DIR instead of the
interpreter) and says which; a ``ddp-apex`` record's notes say which build ran.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

TAG = "25.05"
REPO = "https://github.com/NVIDIA/apex"
ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "apex"
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
            with tarfile.open(path) as tar:
                tar.extractall(src, filter="data")
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
    if not torch.cuda.is_available():
        return False, "no GPU visible"
    if CUDA_HOME is None:
        return False, "no CUDA toolkit (nvcc) found"
    return True, ""


def arch_list() -> str:
    import torch

    caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
    return ";".join(f"{major}.{minor}" for major, minor in sorted(caps))


def try_build(src: Path, name: str, out: Path) -> Path | None:
    shutil.rmtree(out, ignore_errors=True)
    options = [f"--config-settings=--build-option={o}" for o in ATTEMPTS[name]]
    env = dict(os.environ, MAX_JOBS=str(os.cpu_count() or 2))
    if name == "cuda-extensions" and "TORCH_CUDA_ARCH_LIST" not in env:
        env["TORCH_CUDA_ARCH_LIST"] = arch_list()
    log(f"trying the {name} build")
    done = run([sys.executable, "-m", "pip", "wheel", "--no-index", "--no-build-isolation",
                "--no-deps", *options, "-w", str(out), str(src)], env=env,
               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    (BUILD / f"{name}.log").write_text(done.stdout)
    wheels = sorted(out.glob("apex-*.whl"))
    if done.returncode or not wheels:
        tail = " | ".join(done.stdout.strip().splitlines()[-3:])
        log(f"{name} build failed (log build/apex/{name}.log): {tail[-300:]}")
        return None
    return wheels[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=None,
                        help="install into this folder instead of the interpreter")
    parser.add_argument("--python-only", action="store_true",
                        help="skip the extension builds")
    args = parser.parse_args()
    src = fetch_source(os.environ.get("APEX_SRC"))
    cuda_ok, why = can_build_cuda()
    names = list(ATTEMPTS)
    if args.python_only:
        names = ["python-only"]
    elif not cuda_ok:
        log(f"no CUDA extensions ({why})")
        names.remove("cuda-extensions")
    for name in names:
        wheel = try_build(src, name, BUILD / "wheels" / name)
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
