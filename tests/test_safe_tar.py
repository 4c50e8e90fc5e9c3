"""scripts/safe_tar.py: a source tarball unpacks on every supported Python, and one whose
members could write outside the destination is refused whole, with or without tarfile's
"data" filter (Debian 12's Python 3.11.2 has none)."""

from __future__ import annotations

import io
import sys
import tarfile

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from safe_tar import extract  # a script's helper


def _tarball(path, *members):
    with tarfile.open(path, "w:gz") as tar:
        for name, kind in members:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
            else:
                data = name.encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("has_filter", [True, False])
def test_a_source_tarball_unpacks_and_an_escaping_one_is_refused(has_filter, tmp_path,
                                                                 monkeypatch):
    if not has_filter:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python's tarfile has no data filter")
    good = _tarball(tmp_path / "good.tar.gz", ("pkg-1.0", "dir"), ("pkg-1.0/setup.py", "file"))
    extract(good, tmp_path / "out")
    assert (tmp_path / "out" / "pkg-1.0" / "setup.py").read_text() == "pkg-1.0/setup.py"
    absolute = tmp_path / "absolute.txt"  # outside every destination below
    for i, bad in enumerate([("../escaped.txt", "file"), (str(absolute), "file"),
                             ("pkg-1.0/link", "link")]):
        archive = _tarball(tmp_path / f"bad{i}.tar.gz", ("pkg-1.0/ok.py", "file"), bad)
        try:
            extract(archive, tmp_path / f"bad{i}")
            refused = False
        except (SystemExit, tarfile.TarError):  # the filter's refusals are TarErrors
            refused = True
        # nothing lands outside the destination: refused, or (the filter) put inside it
        assert not (tmp_path / "escaped.txt").exists() and not absolute.exists()
        if not has_filter:  # the check by hand refuses the whole tarball, writing nothing
            assert refused and not (tmp_path / f"bad{i}").exists(), bad
