"""`ddpdoctor env` reports Horovod's build as `horovodrun --check-build` does -- checked against
the real thing where Horovod is installed -- and says plainly when it is missing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.env.software import collect_horovod

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "probe"))
from hvd_helpers import require_horovod  # noqa: E402


def _check_build() -> dict[str, dict[str, bool]]:
    proc = subprocess.run([sys.executable, "-m", "horovod.runner.launch", "--check-build"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    sections: dict[str, dict[str, bool]] = {}
    current = ""
    for line in proc.stdout.splitlines():
        if line.strip().endswith(":") and not line.startswith(" "):
            current = line.strip().rstrip(":")
            sections[current] = {}
        match = re.match(r"\s+\[(X| )\] (\w+)", line)
        if match and current:
            sections[current][match.group(2)] = match.group(1) == "X"
    return sections


def test_horovod_build_matches_horovodrun_check_build() -> None:
    require_horovod()
    info = collect_horovod()
    truth = _check_build()
    assert info.installed and info.error is None
    assert info.frameworks == truth["Available Frameworks"]
    assert info.controllers == truth["Available Controllers"]
    assert info.tensor_operations == truth["Available Tensor Operations"]
    assert info.frameworks["PyTorch"] and info.controllers["Gloo"]  # what scripts/install-horovod builds


def test_missing_horovod_is_said_plainly(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from ddpdoctor.env import collect_env
    from ddpdoctor.env.render import to_text

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "horovod" else real_find_spec(name, *a))
    report = collect_env()
    assert report.software.horovod.installed is False
    text = to_text(report, [], color=False)
    assert "| horovod" in text and "not installed (optional: scripts/install-horovod" in text
