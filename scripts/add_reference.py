"""Give records from before bench kept ``initial_reference_fingerprint`` their reference, once,
as data: the weights the record's seed and model draw (bench.models.parameters.initial_params_sha1).

The report used to draw that reference itself whenever a record lacked it, which built the
model the record named: a record naming ``os:system`` ran a command in the reader's shell.
The report now only reads the field; this script is run by hand, on records you trust, and
builds only the models bench itself defines (resnet18-cifar, torchvision:NAME), never a
user's factory. Each record it fills says so in ``initial_reference_note``.

    python scripts/add_reference.py results/runs/*.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from bench.models.parameters import initial_params_sha1
from bench.models.registry import ModelSpec, stable
from bench.records.files import write_atomic


def main(paths: list[str]) -> int:
    filled = 0
    for name in paths:
        path = Path(name)
        rec = json.loads(path.read_text())
        if not rec.get("initial_param_fingerprint") or rec.get("initial_reference_fingerprint"):
            continue
        spec = ModelSpec.from_record(rec)
        if not stable(spec.name):
            print(f"skipped {path}: {spec.name} is a user's model; it is never built here")
            continue
        rec["initial_reference_fingerprint"] = initial_params_sha1(int(rec.get("seed", 0)), spec)
        rec["initial_reference_note"] = (f"drawn after the run by scripts/add_reference.py "
                                         f"under torch {torch.__version__}: the run predates "
                                         "the field")
        write_atomic(path, rec)
        filled += 1
    print(f"{filled} record(s) given their reference")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
