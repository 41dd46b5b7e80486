"""ENV015-ENV017: launch variables that are not integers, out of range or inconsistent."""

from __future__ import annotations

import pytest

from ddpdoctor.env import diagnose
from ddpdoctor.findings import Severity


def launch_findings(collect, environ: dict[str, str]) -> list[tuple[str, str]]:
    return [(f.code, f.message.split(":")[0]) for f in diagnose(collect(environ=environ)) if f.code in ("ENV015", "ENV016", "ENV017")]


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({"WORLD_SIZE": "abc", "RANK": "0", "LOCAL_RANK": "0"}, [("ENV015", "WORLD_SIZE='abc' is not a positive integer")]),
        ({"RANK": "-1", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}, [("ENV015", "RANK='-1' is not an integer from 0")]),
        ({"LOCAL_RANK": "1.5"}, [("ENV015", "LOCAL_RANK='1.5' is not an integer from 0")]),
        ({"WORLD_SIZE": "0"}, [("ENV015", "WORLD_SIZE='0' is not a positive integer")]),
        ({"LOCAL_WORLD_SIZE": ""}, [("ENV015", "LOCAL_WORLD_SIZE='' is not a positive integer")]),
        ({"RANK": "4", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}, [("ENV016", "RANK=4 is not below WORLD_SIZE=4")]),
        ({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, [("ENV016", "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2")]),
        ({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "4"}, [("ENV016", "LOCAL_WORLD_SIZE=4 is larger than WORLD_SIZE=2")]),
        ({"RANK": "0", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}, [("ENV016", "LOCAL_RANK=1 is larger than RANK=0")]),
        ({"RANK": "1", "WORLD_SIZE": "2"}, [("ENV017", "RANK=1 is set but LOCAL_RANK is not")]),
    ],
)
def test_bad_launch_variables_are_reported(collect, environ: dict[str, str], expected: list[tuple[str, str]]) -> None:
    assert launch_findings(collect, environ) == expected


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"},
        {"RANK": " 0 ", "LOCAL_RANK": "0", "WORLD_SIZE": "1"},
        {"LOCAL_RANK": "0"},  # spawn-style scripts set only what they read
        {"WORLD_SIZE": "8"},
    ],
    ids=["none", "torchrun-node-1-of-2", "padded", "local-rank-only", "world-size-only"],
)
def test_consistent_launch_variables_are_quiet(collect, environ: dict[str, str]) -> None:
    assert launch_findings(collect, environ) == []


def test_severities_come_from_the_pages(collect) -> None:
    findings = diagnose(collect(environ={"RANK": "x", "WORLD_SIZE": "2"}))
    by_code = {f.code: f.severity for f in findings if f.code in ("ENV015", "ENV017")}
    assert by_code == {"ENV015": Severity.ERROR, "ENV017": Severity.WARNING}
