"""Synthetic Flight Recorder dumps, shaped like the ones torch 2.13 writes (see tests/guard/fr_job.py for real ones)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Optional, Sequence

SITE = "/venv/lib/python3.11/site-packages/torch"


def entry(seq: int, op: str = "all_reduce", sizes: Sequence[Sequence[int]] = ((2,),), dtype: str = "Float",
          line: int = 10, group: tuple[str, str] = ("0", "default_pg"), state: str = "scheduled",
          record_id: Optional[int] = None, is_p2p: bool = False, out_sizes: Optional[Sequence[Sequence[int]]] = None,
          frames: Optional[list[dict[str, Any]]] = None) -> dict[str, Any]:
    return {
        "record_id": seq - 1 if record_id is None else record_id, "pg_id": int(group[0]), "process_group": group,
        "collective_seq_id": 0 if is_p2p else seq, "p2p_seq_id": seq if is_p2p else 0, "op_id": seq,
        "profiling_name": f"gloo:{op}", "time_created_ns": 1, "input_sizes": [list(s) for s in sizes],
        "input_dtypes": [dtype] * len(sizes), "output_sizes": [list(s) for s in (out_sizes or sizes)],
        "output_dtypes": [dtype] * len(out_sizes or sizes), "state": state, "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None, "retired": True, "is_p2p": is_p2p, "timeout_ms": 1800000,
        "frames": frames if frames is not None else [
            {"name": op, "filename": f"{SITE}/distributed/distributed_c10d.py", "line": 3245},
            {"name": "wrapper", "filename": f"{SITE}/distributed/c10d_logger.py", "line": 83},
            {"name": "main", "filename": "/job/train.py", "line": line},
            {"name": "run", "filename": "/usr/lib/python3.11/multiprocessing/process.py", "line": 108},
        ],
    }


def dump(entries: list[dict[str, Any]], pg_config: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    return {"version": "2.10", "comm_lib_version": "", "entries": entries,
            "pg_config": pg_config if pg_config is not None else {"": {"name": "", "desc": "", "ranks": "[]"}},
            "pg_status": {}}


def write(directory: Path, per_rank: dict[int, dict[str, Any]], prefix: str = "fr_") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for rank, data in per_rank.items():
        (directory / f"{prefix}{rank}").write_bytes(pickle.dumps(data))
    return directory
