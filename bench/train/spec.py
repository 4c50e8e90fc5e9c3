"""``WorkerSpec``: what the launching process hands every rank, as one JSON file."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.config.run_config import RunConfig
from bench.config.strategy_parts import Topology
from bench.records.files import write_atomic
from bench.train.scratch import Scratch


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a rank needs that it cannot find in its environment (RANK, WORLD_SIZE...)."""

    config: RunConfig  # the plan's config: defaults resolved, validated
    topology: Topology
    record_path: Path
    scratch: Scratch
    workers_per_process: int  # loader workers of this process (per replica x replicas here)
    record: dict[str, Any]  # the record's skeleton, for rank 0 when the file is not here

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "topology": dataclasses.asdict(self.topology),
            "record_path": str(self.record_path),
            "scratch": str(self.scratch.root),
            "workers_per_process": self.workers_per_process,
            "record": self.record,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerSpec:
        return cls(
            config=RunConfig.from_dict(data["config"]),
            topology=Topology(**data["topology"]),
            record_path=Path(data["record_path"]),
            scratch=Scratch(Path(data["scratch"])),
            workers_per_process=int(data["workers_per_process"]),
            record=data["record"],
        )

    def write(self) -> Path:
        """Into the scratch folder; returns the file's path (what launchers pass on)."""
        write_atomic(self.scratch.spec, self.to_json())
        return self.scratch.spec

    @classmethod
    def read(cls, path: str | Path) -> WorkerSpec:
        return cls.from_json(json.loads(Path(path).read_text()))
