"""A torch launcher agent (``torch.distributed.run``, i.e. torchrun, or the legacy
``torch.distributed.launch``) run exactly as ``python -m MODULE ARGS`` runs it: in a copy of
bench's own process (bench.launch.launchers: torch is imported already), or as
``python -m bench.launch.agent MODULE ARGS`` (bench probe), ended without the interpreter's teardown
(see bench.tools.quick_exit). A failure leaves as it would (torchrun's error report, its exit
code)."""

from __future__ import annotations

import importlib
import sys
import warnings

from bench.tools.collector import pause_collector, resume_collector
from bench.tools.quick_exit import exit_now


def run_agent(module: str, args: list[str]) -> int:
    """``python -m module args``: the agent's ``main``; an exception is its failure. The
    legacy launcher's deprecation warning (9 lines each run) is not printed: ddp-launch
    exists to measure that launcher, and its record's notes say it is deprecated."""
    warnings.filterwarnings("ignore", "The module torch.distributed.launch is deprecated",
                            FutureWarning)
    sys.argv = [module, *args]
    pause_collector()  # the agent's imports (bench.tools.collector); it then runs as usual
    agent = importlib.import_module(module)
    resume_collector()
    agent.main(args)
    return 0


if __name__ == "__main__":
    exit_now(run_agent(sys.argv[1], sys.argv[2:]))
