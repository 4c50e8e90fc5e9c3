"""fork_dying_with_me, which runs torch's launcher agent in a copy of bench: the copy gets
its own session, the environment given, a fresh interpreter's signal handling and a pipe for
its stderr; it exits with the body's code and leaves bench's atexit handlers to bench."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

_SCRIPT = """
import atexit, os, signal, subprocess, sys
from bench.tools.lifetime import fork_dying_with_me
marks = sys.argv[1]
atexit.register(lambda: open(marks, "a").write(f"atexit {os.getpid()}\\n"))
signal.signal(signal.SIGTERM, lambda *_: None)  # bench's own handler, not the copy's

def body():
    sys.stderr.write(f"session {os.getsid(0) == os.getpid()} env {os.environ.get('ONLY')} "
                     f"{len(os.environ)} term {signal.getsignal(signal.SIGTERM) == signal.SIG_DFL}")
    return 3

child = fork_dying_with_me(body, {"ONLY": "this"})
print(child.stderr.read().decode(), child.wait(), flush=True)
sleeper = fork_dying_with_me(lambda: __import__("time").sleep(60) or 0, {})
try:
    sleeper.wait(timeout=0.2)
except subprocess.TimeoutExpired:
    os.killpg(sleeper.pid, signal.SIGKILL)
    print("timed out", sleeper.wait(), flush=True)
"""


def test_the_copy_runs_the_body_alone_and_leaves_atexit_to_the_parent(tmp_path):
    marks = tmp_path / "marks"
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(marks)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    assert first == "session True env this 1 term True 3", proc.stdout
    assert second == "timed out -9", proc.stdout
    assert marks.read_text().count("atexit") == 1  # the parent's, once
