"""The cached Horovod GPU wheel is keyed by the CUDA architectures it has kernels for: the
one cross-compiled here for sm_90 must never be installed on an A100 (sm_80), where its
kernels fail with "no kernel image" at the first collective."""

from __future__ import annotations

import sys

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
