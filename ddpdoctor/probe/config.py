"""What every rank is told: one typed configuration, built by the parent (or, under an external
launcher, from the command line and environment) and carried to the ranks as JSON.

Modelled on torch elastic's `LaunchConfig`: a frozen dataclass with defaults, so that options,
launchers, worker and report agree on one set of names instead of a dict's string keys.
No torch here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Optional

from ddpdoctor.probe.faults import FaultSpec, parse_faults
from ddpdoctor.probe.registry import TORCH, default_names_for

CONFIG_ENV = "DDPDOCTOR_PROBE_CONFIG"
OUT_DIR_ENV = "DDPDOCTOR_PROBE_OUT"


@dataclass(frozen=True)
class RankConfig:
    framework: str = TORCH
    backend: str = "auto"  # torch: auto/nccl/gloo; Horovod: its own controller
    device: str = "auto"
    timeout: float = 5.0  # seconds each check (and each collective) may take
    join_timeout: float = 60.0
    faults: tuple[FaultSpec, ...] = ()
    checks: tuple[str, ...] = field(default_factory=lambda: default_names_for(TORCH))
    out_dir: Optional[str] = None  # where each rank writes rank-<R>.json for the parent
    run_id: str = "external"
    # True when rank 0 prints the report itself (an external launcher); False under our parent.
    report: bool = True
    output_format: str = "text"
    # Horovod ranks exchange results through a TCPStore; under our parent the parent hosts it.
    store_addr: Optional[str] = None
    store_port: int = 0
    # The link map's message size in bytes (0: its default for the device).
    link_bytes: int = 0

    def to_json(self) -> str:
        data = asdict(self)
        data["faults"] = [str(f) for f in self.faults]
        data["checks"] = list(self.checks)
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> "RankConfig":
        data: dict[str, Any] = json.loads(text)
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RankConfig":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if "faults" in known:
            known["faults"] = parse_faults([str(f) for f in known["faults"]])
        if "checks" in known:
            known["checks"] = tuple(known["checks"])
        return cls(**known)

    def with_(self, **changes: Any) -> "RankConfig":
        return replace(self, **changes)
