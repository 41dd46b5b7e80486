"""`ddpdoctor env`: the environment doctor for distributed jobs.

Public API (the probe calls it): `collect_env`, `diagnose`, `summary_lines`, `EnvReport`.
Nothing here imports torch at module level: torch is imported lazily inside `collect_env`.
"""

from __future__ import annotations

from ddpdoctor.env.collect import collect_env
from ddpdoctor.env.diagnose import diagnose
from ddpdoctor.env.report import EnvReport
from ddpdoctor.env.summary import summary_lines

__all__ = ["EnvReport", "collect_env", "diagnose", "summary_lines"]
