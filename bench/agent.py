"""``python -m bench.agent MODULE ARGS``: a torch launcher agent (``torch.distributed.run``,
i.e. torchrun, or the legacy ``torch.distributed.launch``) run exactly as ``python -m MODULE
ARGS`` runs it, then ended without the interpreter's teardown (see bench.quick_exit). A
failure leaves as it would (torchrun's error report, its exit code)."""

from __future__ import annotations

import importlib
import sys

from bench.quick_exit import exit_now

if __name__ == "__main__":
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    importlib.import_module(module).main()
    exit_now(0)
