"""Launch variables fuzzed: whatever the environment holds, `env` reports it without an internal
error, and no control character of it reaches the output raw."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ddpdoctor.env import diagnose
from ddpdoctor.env.launch import NAMED_VARIABLES
from ddpdoctor.env.render import to_json, to_text

# Raw control characters: C0 but the newline, DEL, C1, and the Unicode line separators.
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
JUNK = st.sampled_from(["", " ", " 0 ", "-0", "+3", "1e3", "0x10", "1.5", "\u0661", "9" * 30, "9" * 4400, "nan",
                        "\x1b[2J\x1b[31m", "a\rb", "\x9b31m", "0\n1", "-1", "127.0.0.1", "localhost", "GPU-", "MIG-"])
# Small numbers, and numbers past any 64-bit sentinel a comparison might default to.
NUMBERS = st.one_of(st.integers(-3, 10), st.integers(2 ** 62, 10 ** 30)).map(str)
VALUES = st.one_of(JUNK, NUMBERS, st.text(max_size=24)).map(lambda v: v.replace("\0", ""))
NAMES = [*NAMED_VARIABLES, "NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "TORCHELASTIC_RUN_ID", "HOROVOD_RANK",
         "TORCH_DISTRIBUTED_DEBUG"]
# Each variable set or not, independently: every pair of present and missing ones comes up.
ENVIRONS = st.fixed_dictionaries({}, optional={name: VALUES for name in NAMES})


def _loopback_only(host: Any, *args: Any, **kwargs: Any) -> list[Any]:
    # No name service in a test: literal loopback resolves, anything else does not.
    if host in ("127.0.0.1", "localhost"):
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", 0))]
    raise socket.gaierror("not resolved in tests")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(environ=ENVIRONS)
def test_any_launch_variables_are_reported_without_an_internal_error(collect, monkeypatch, environ) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", _loopback_only)
    report = collect(environ=environ)
    findings = diagnose(report, nproc=2)
    text = to_text(report, findings, color=False)
    assert not RAW_CONTROL.search(text), RAW_CONTROL.search(text)
    data = to_json(report, findings)
    assert not RAW_CONTROL.search(data)
    assert json.loads(data)["launch"]["variables"] == {k: environ[k] for k in sorted(environ)
                                                       if k in report.launch.variables}
    to_text(report, findings, color=True, width=100)  # rich's path, too


def test_the_reported_case_huge_local_rank_without_rank_is_a_report_not_an_internal_error() -> None:
    import os

    env = {**os.environ, "LOCAL_RANK": "9" * 30, "NCCL_DEBUG": "\x1b[31mINFO"}
    env.pop("RANK", None)
    result = subprocess.run([sys.executable, "-m", "ddpdoctor", "env"], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode in (0, 1), result.stderr
    assert "internal error" not in result.stderr
    assert "NCCL_DEBUG | \\x1b[31mINFO" in result.stdout and "\x1b" not in result.stdout


@pytest.mark.parametrize("variable, value, escaped", [("RANK", "1\x1b[31m", "RANK=1\\x1b[31m is set"),
                                                      ("RANK", "7\r", "RANK=7\\r is set")])
def test_env017_escapes_what_it_quotes(collect, variable: str, value: str, escaped: str) -> None:
    report = collect(environ={variable: value, "WORLD_SIZE": "8"})
    text = to_text(report, diagnose(report), color=False)
    assert escaped in text


@pytest.mark.parametrize("variable", ["CUDA_VISIBLE_DEVICES", "MASTER_PORT"])
@pytest.mark.parametrize("value", ["9" * 4400, "\u00b2", "1\u00b2", "-" + "9" * 30])
def test_numbers_int_refuses_are_reported_not_raised(collect, monkeypatch, variable, value) -> None:
    """str.isdigit() accepts what int() refuses: superscript digits, and more than 4,300 digits (found
    by the fuzz above, for CUDA_VISIBLE_DEVICES)."""
    monkeypatch.setattr(socket, "getaddrinfo", _loopback_only)
    environ = {variable: value, "MASTER_ADDR": "127.0.0.1"}
    report = collect(environ=environ)
    findings = diagnose(report, nproc=2)
    assert to_text(report, findings, color=False)
    if variable == "MASTER_PORT":
        assert "is not a TCP port number" in report.launch.master.port_note
