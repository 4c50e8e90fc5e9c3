"""What every bench process pays: it ends without the interpreter's teardown
(bench.tools.quick_exit) and loses nothing an exit must do (the code, buffered output, atexit
handlers, running threads); it records torchvision's version without importing it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import ROOT

SCRIPT = """
import atexit, sys, threading, time
from pathlib import Path
from bench.tools.quick_exit import exit_now

out = Path(sys.argv[1])

class Torn:
    def __del__(self):  # runs only when the interpreter takes its modules apart
        (out / "torn-down").write_text("yes")

kept = Torn()
atexit.register(lambda: (out / "atexit").write_text("ran"))
print("buffered line")  # stdout is a pipe: block-buffered, not yet written
if sys.argv[2] == "thread":
    threading.Thread(target=lambda: (time.sleep(0.5), (out / "thread").write_text("done"))
                     ).start()
exit_now(3)
"""


def _run(tmp_path: Path, mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT), str(tmp_path), mode],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT)})


def test_the_exit_keeps_code_output_and_atexit_but_skips_the_teardown(tmp_path):
    proc = _run(tmp_path, "plain")
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "buffered line\n"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert not (tmp_path / "torn-down").exists()  # what costs ~0.8 s once torch is imported


def test_a_running_thread_is_waited_for(tmp_path):
    proc = _run(tmp_path, "thread")
    assert proc.returncode == 3, proc.stderr
    assert (tmp_path / "thread").read_text() == "done"
    assert (tmp_path / "atexit").read_text() == "ran" and proc.stdout == "buffered line\n"


def test_torchvision_version_is_read_without_importing_it():
    code = ("import sys; from bench.records.environment import torchvision_version;"
            " v = torchvision_version();"
            " loaded = 'torchvision' in sys.modules; import torchvision;"
            " print(v == torchvision.__version__, loaded)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env={"PYTHONPATH": str(ROOT)})
    assert proc.stdout.split() == ["True", "False"], proc.stderr


def test_bench_list_and_the_launcher_do_not_import_torch_dynamo():
    """torch._dynamo costs 1.2 s to import on 2 cores; only a rank needs it (DDP's
    constructor and the optimizer import it there). The launcher imported it through
    strategies/cpu_syncbn.py's torch.compiler.disable: every multi-process run started 1.2 s
    later, and `bench list` took 1.2 s more, for nothing."""
    code = ("import atexit, sys; import bench.launch.run;"
            " atexit.register(lambda: print('loaded:', 'torch._dynamo' in sys.modules));"
            " sys.argv = ['bench', 'list']; from bench.cli import entry; entry()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert "ddp-amp" in proc.stdout  # bench list built every strategy
    assert proc.stdout.splitlines()[-1] == "loaded: False", proc.stdout
