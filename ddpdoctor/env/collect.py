"""`collect_env`: one pass over software, NVML, topology and the launch environment."""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from ddpdoctor.env import nvml as nv
from ddpdoctor.env.gpus import collect_gpus
from ddpdoctor.env.launch import collect_launch
from ddpdoctor.env.report import EnvReport, GpuInfo, Interface, NvmlStatus, TopologyInfo
from ddpdoctor.env.software import collect_software
from ddpdoctor.env.topology import collect_topology


def collect_env(
    nvml: Optional[object] = None,
    *,
    environ: Optional[Mapping[str, str]] = None,
    interfaces: Optional[list[Interface]] = None,
) -> EnvReport:
    """Collect everything `ddpdoctor env` reports. Never raises for a missing GPU, driver,
    NVML or torch: each shows up as a reason string in the report instead.

    `nvml` is the NVML module to use (default: `import pynvml`); tests pass a recorded fake.
    `environ` defaults to `os.environ`; `interfaces` to the host's own.
    """
    environ = dict(os.environ if environ is None else environ)
    software = collect_software()
    module: Optional[Any] = nvml
    message: Optional[str] = None
    if module is None:
        module, message = nv.load_module()
    gpus: Optional[list[GpuInfo]] = None
    topology: Optional[TopologyInfo] = None
    if module is None:
        software.nvml = NvmlStatus(available=False, message=message or "NVML: unavailable")
    else:
        session, software.nvml = nv.open_session(module)
        if session is not None:
            try:
                gpus, handles = collect_gpus(session)
                topology = collect_topology(session, gpus, handles)
            finally:
                nv.close_session(session)
    launch = collect_launch(
        environ,
        gpus,
        software.torch_device_count,
        interfaces=interfaces,
        interfaces_source="given" if interfaces is not None else "",
    )
    return EnvReport(software=software, gpus=gpus or [], topology=topology, launch=launch)
