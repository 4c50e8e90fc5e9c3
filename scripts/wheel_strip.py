"""Take the debug information out of the compiled libraries in a wheel.

Horovod's CMake build and apex's extensions link with ``-g``: Horovod's library is 69 MB with
its debug sections and 2.5 MB without, apex's three are 37 MB and 4.5 MB. The wheels built
for the GPU machine travel there in a folder of at most 64 MiB, working tree included, and
nothing reads their debug sections. ``strip --strip-debug`` keeps the symbols and the CUDA
device code (.nv_fatbin); the wheel's RECORD is written again with the new hashes and sizes.

    python scripts/wheel_strip.py WHEEL...   (strips in place; a stripped wheel is left alone)
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _stripped(data: bytes, strip: str) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        lib = Path(tmp) / "lib.so"
        lib.write_bytes(data)
        subprocess.run([strip, "--strip-debug", str(lib)], check=True)
        return lib.read_bytes()


def strip_wheel(wheel: Path) -> str:
    """Strip every ``.so`` in ``wheel`` in place; returns a line saying what it did."""
    before = wheel.stat().st_size
    strip = shutil.which("strip")
    if strip is None:
        return f"{wheel.name}: no strip on PATH, debug sections kept"
    with zipfile.ZipFile(wheel) as old:
        entries = [(info, old.read(info)) for info in old.infolist()]
    changed, records = False, []
    for i, (info, data) in enumerate(entries):
        if info.filename.endswith(".so") or ".so." in info.filename:
            smaller = _stripped(data, strip)
            if len(smaller) < len(data):
                entries[i], changed = (info, smaller), True
    if not changed:
        return f"{wheel.name}: no debug sections ({before / 2**20:.1f} MiB)"
    record = next(info.filename for info, _ in entries
                  if info.filename.endswith(".dist-info/RECORD"))
    for info, data in entries:
        if info.filename != record and not info.is_dir():
            records.append(_record_line(info.filename, data))
    records.append(f"{record},,")
    fd, tmp_name = tempfile.mkstemp(suffix=".whl", dir=wheel.parent)
    os.close(fd)
    with zipfile.ZipFile(tmp_name, "w", zipfile.ZIP_DEFLATED) as new:
        for info, data in entries:
            if info.filename == record:
                data = ("\n".join(records) + "\n").encode()
            new.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    os.chmod(tmp_name, wheel.stat().st_mode)  # mkstemp's file is private (0600)
    os.replace(tmp_name, wheel)
    return (f"{wheel.name}: debug sections stripped, {before / 2**20:.1f} MiB -> "
            f"{wheel.stat().st_size / 2**20:.1f} MiB")


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python scripts/wheel_strip.py WHEEL...")
    for name in sys.argv[1:]:
        print(f"[wheel_strip] {strip_wheel(Path(name))}")


if __name__ == "__main__":
    main()
