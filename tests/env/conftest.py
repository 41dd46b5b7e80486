"""Shared fixtures for the `ddpdoctor env` tests: the recorded NVML fake and fixed interfaces."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Optional

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fake_nvml  # noqa: E402

from ddpdoctor.env import collect_env  # noqa: E402
from ddpdoctor.env.report import EnvReport, Interface  # noqa: E402

# Interfaces handed to collect_env instead of the host's. Addresses are data only: nothing in the
# tests resolves or binds anything but loopback (192.0.2.0/24 is TEST-NET-1, RFC 5737).
INTERFACES = [
    Interface("lo", up=True, loopback=True, addresses=["127.0.0.1", "::1"]),
    Interface("docker0", up=True, loopback=False, addresses=["192.0.2.200"]),
    Interface("eth0", up=True, loopback=False, addresses=["192.0.2.10", "fe80::1"]),
]


@pytest.fixture(autouse=True)
def _loopback_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    # gloo's default interface comes from resolving the hostname; keep that on loopback.
    monkeypatch.setattr("ddpdoctor.env.network.hostname", lambda: "localhost")


@pytest.fixture
def dgx() -> fake_nvml.FakeNvml:
    return fake_nvml.dgx1_v100()


Collect = Callable[..., EnvReport]


@pytest.fixture
def collect() -> Collect:
    def run(
        nvml: Optional[object] = None,
        environ: Optional[dict[str, str]] = None,
        interfaces: Optional[list[Interface]] = None,
    ) -> EnvReport:
        return collect_env(
            nvml=nvml if nvml is not None else fake_nvml.dgx1_v100(),
            environ=environ or {},
            interfaces=INTERFACES if interfaces is None else interfaces,
        )

    return run
