"""Text rendering of an `EnvReport` plus its findings: rich panels on a terminal, and plain,
paste-into-an-issue text (ASCII tables, '## ' headings, no ANSI codes) everywhere else."""

from __future__ import annotations

import dataclasses
import io
import json
from typing import Any, Optional, Sequence

from rich import box
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ddpdoctor.env.report import EnvReport, GpuInfo
from ddpdoctor.env.topology import LEGEND, P2P_LEGEND
from ddpdoctor.findings import Finding
from ddpdoctor.report import ReportContext, render as render_findings
from ddpdoctor.terminal import escape_controls

NA = "n/a"
PLAIN_WIDTH = 132
# Plain text is never folded: a value as long as a line of NCCL_* settings stays on one line, so
# that grep and a pasted issue see it whole. (Tables are as wide as their content, not this.)
UNWRAPPED_WIDTH = 100_000


# json.dumps escapes C0 controls; with ensure_ascii=False (names stay readable) DEL, the C1 controls
# and the Unicode line separators would pass raw.
_JSON_CONTROL = {c: f"\\u{c:04x}" for c in (0x7F, *range(0x80, 0xA0), 0x2028, 0x2029)}


def to_json(report: EnvReport, findings: Sequence[Finding]) -> str:
    payload: dict[str, Any] = report.to_dict()
    payload["findings"] = [f.to_dict() for f in sorted(findings, key=Finding.sort_key)]
    return json.dumps(payload, indent=2, ensure_ascii=False, default=str).translate(_JSON_CONTROL)


def escaped(value: Any) -> Any:
    """`value` (a report, a finding, their fields) with every string's control characters escaped:
    launch variables, host and interface names come from the environment and may hold anything."""
    if isinstance(value, str):
        return escape_controls(value)
    if isinstance(value, list):
        return [escaped(v) for v in value]
    if isinstance(value, tuple):
        return tuple(escaped(v) for v in value)
    if isinstance(value, dict):
        return {escaped(k): escaped(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: escaped(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    return value


def to_text(
    report: EnvReport, findings: Sequence[Finding], color: bool, width: Optional[int] = None
) -> str:
    report, findings = escaped(report), [escaped(f) for f in findings]
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        force_terminal=color,
        no_color=not color,
        color_system="standard" if color else None,
        width=width or (PLAIN_WIDTH if color else UNWRAPPED_WIDTH),
        highlight=False,
        markup=False,
        emoji=False,
        legacy_windows=False,
    )
    table_box = box.SIMPLE_HEAD if color else box.ASCII
    for title, body in _sections(report, table_box):
        if color:
            console.print(Panel(body, title=title, title_align="left", box=box.ROUNDED))
        else:
            console.print(Text(f"## {title}"))
            console.print(body)
            console.print()
    if color:
        console.rule("Findings", align="left")
    else:
        console.print(Text("## Findings"))
    out = buffer.getvalue().rstrip("\n")
    found = render_findings(list(findings), "text", ReportContext(color=color))
    return f"{out}\n{found}" if found else out


def _sections(report: EnvReport, table_box: box.Box) -> list[tuple[str, RenderableType]]:
    sections: list[tuple[str, RenderableType]] = [
        ("Software", _software(report, table_box)),
        ("GPUs", _gpus(report, table_box)),
    ]
    if report.topology is not None:
        sections.append(("GPU topology", _topology(report, table_box)))
    sections.append(("Launch environment", _launch(report, table_box)))
    return sections


def _kv_table(rows: list[tuple[str, str]], table_box: box.Box) -> Table:
    table = Table(box=table_box, show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(Text(key), Text(value))
    return table


def _yes_no(flags: dict[str, Any]) -> str:
    return ", ".join(
        f"{name} {'yes' if ok else ('no' if ok is not None else NA)}" for name, ok in flags.items()
    ) or NA


def _software(report: EnvReport, table_box: box.Box) -> Table:
    s = report.software
    rows = [("Python", f"{s.python} ({s.platform})")]
    if s.torch is None:
        rows.append(("torch", s.torch_error or "not installed"))
    else:
        rows += [
            ("torch", s.torch),
            ("built with CUDA", s.torch_cuda or f"{NA} (CPU-only build)"),
            ("built with cuDNN", s.torch_cudnn or NA),
            ("NCCL", s.torch_nccl or f"{NA} (torch built without NCCL)"),
            (
                "backends",
                _yes_no(s.backends) if s.distributed_available else "torch.distributed unavailable",
            ),
        ]
    h = s.horovod
    if not h.installed:
        rows.append(("horovod", "not installed (optional: scripts/install-horovod builds it for this torch)"))
    else:
        rows.append(("horovod", h.version or "unknown version"))
        if h.frameworks:
            rows.append(("  frameworks", _yes_no(h.frameworks)))
        if h.controllers:
            rows.append(("  controllers", _yes_no(h.controllers)))
        if h.tensor_operations:
            rows.append(("  tensor operations", _yes_no(h.tensor_operations)))
        if h.error:
            rows.append(("  note", h.error))
    rows.append(("nvidia-ml-py", s.nvml.bindings_version or "not installed"))
    if s.nvml.available:
        driver = s.nvml.driver_version or NA
        if s.nvml.cuda_driver_version:
            driver += f" (supports CUDA {s.nvml.cuda_driver_version})"
        rows.append(("NVIDIA driver", driver))
    else:
        rows.append(("NVIDIA driver", s.nvml.message))
    return _kv_table(rows, table_box)


def _na(value: Any, unit: str = "") -> str:
    return NA if value is None else f"{value}{unit}"


def _gib(value: Optional[int]) -> str:
    return NA if value is None else f"{value / 2**30:.1f}"


def _pcie(gpu: GpuInfo) -> str:
    if gpu.pcie_gen is None and gpu.pcie_width is None:
        return NA
    return (
        f"Gen{_na(gpu.pcie_gen)} x{_na(gpu.pcie_width)} "
        f"/ Gen{_na(gpu.pcie_gen_max)} x{_na(gpu.pcie_width_max)}"
    )


def _ecc(gpu: GpuInfo) -> str:
    text = f"{_na(gpu.ecc_uncorrected_volatile)} / {_na(gpu.ecc_uncorrected_aggregate)}"
    extra = []
    if gpu.retired_pages is not None:
        extra.append(f"{gpu.retired_pages} retired")
    if gpu.retired_pages_pending:
        extra.append("retire pending")
    if gpu.remapped_rows_pending:
        extra.append("remap pending")
    if gpu.remapped_rows_failure:
        extra.append("remap FAILED")
    return text + (f" ({', '.join(extra)})" if extra else "")


def _gpus(report: EnvReport, table_box: box.Box) -> RenderableType:
    if not report.gpus:
        return Text(report.software.nvml.message)
    visible = report.launch.cuda_visible_devices.visible
    identity = Table(box=table_box)
    for column in ("GPU", "name", "UUID", "bus", "mem GiB", "temp", "power W"):
        identity.add_column(column, overflow="fold", no_wrap=column == "UUID")
    health = Table(box=table_box)
    for column in (
        "GPU",
        "PCIe now / max",
        "NVLinks up",
        "ECC uncorr. vol/agg",
        "compute mode",
        "MIG",
        "clock events",
    ):
        health.add_column(column, overflow="fold")
    for gpu in report.gpus:
        label = str(gpu.index) + ("" if visible is None or gpu.index in visible else " (hidden)")
        power = (
            f"{_na(gpu.power_draw_w)} / {_na(gpu.power_limit_w)}"
            if gpu.power_draw_w is not None or gpu.power_limit_w is not None
            else NA
        )
        identity.add_row(
            label,
            gpu.name or NA,
            gpu.uuid or NA,
            gpu.pci_bus_id or NA,
            f"{_gib(gpu.memory_used)} / {_gib(gpu.memory_total)}",
            _na(gpu.temperature_c, " C"),
            power,
        )
        mig = NA if gpu.mig_enabled is None else ("on" if gpu.mig_enabled else "off")
        events = NA if gpu.clock_event_reasons is None else (", ".join(gpu.clock_event_reasons) or "none")
        health.add_row(
            str(gpu.index),
            _pcie(gpu),
            _na(gpu.nvlinks_up),
            _ecc(gpu),
            gpu.compute_mode or NA,
            mig,
            events,
        )
    return Group(identity, health)


def _matrix(labels: list[str], cells: list[list[str]], table_box: box.Box) -> Table:
    table = Table(box=table_box)
    table.add_column("")
    for label in labels:
        table.add_column(label, justify="center")
    for label, row in zip(labels, cells):
        table.add_row(label, *row)
    return table


def _topology(report: EnvReport, table_box: box.Box) -> RenderableType:
    topo = report.topology
    assert topo is not None
    labels = [f"GPU{i}" for i in topo.gpus]
    # One legend entry a line, as nvidia-smi prints it.
    legend = "\n".join(f"  {k:<4} = {v}" for k, v in LEGEND.items())
    p2p_legend = "\n".join(f"  {k:<4} = {v}" for k, v in P2P_LEGEND.items())
    return Group(
        _matrix(labels, topo.matrix, table_box),
        Text(f"Legend:\n{legend}"),
        Text(""),
        Text("P2P read support (nvmlDeviceGetP2PStatus):"),
        _matrix(labels, topo.p2p_read, table_box),
        Text(f"Legend:\n{p2p_legend}"),
    )


def _launch(report: EnvReport, table_box: box.Box) -> RenderableType:
    launch = report.launch
    variables = sorted(launch.variables.items())
    var_table: RenderableType = (
        _kv_table(variables, table_box)
        if variables
        else Text("no rendezvous, CUDA, NCCL or torch.distributed variables are set")
    )
    master = launch.master
    if master.addr is None:
        master_line = "MASTER_ADDR unset (torchrun --standalone / c10d rendezvous sets it)"
    elif master.resolve_error:
        master_line = f"MASTER_ADDR {master.resolve_error}"
    else:
        where = "this host" if master.is_local else "another host"
        master_line = f"MASTER_ADDR={master.addr} -> {', '.join(master.resolved or [])} ({where})"
        if master.port is not None:
            if master.port_free is True:
                port = "free"
            elif master.port_free is False:
                port = master.port_note or "in use"
            else:
                port = master.port_note or "not checked"
            master_line += f"; MASTER_PORT={master.port}: {port}"
    interfaces = Table(box=table_box)
    for column in ("interface", "state", "addresses"):
        interfaces.add_column(column, overflow="fold")
    for interface in launch.interfaces:
        interfaces.add_row(
            interface.name,
            ("up" if interface.up else "down") + (" loopback" if interface.loopback else ""),
            ", ".join(interface.addresses) or "-",
        )
    nccl, gloo = launch.nccl_socket, launch.gloo_socket
    facts = _kv_table(
        [
            ("host", f"{launch.hostname}, {_na(launch.cpu_count)} CPUs"),
            ("visible GPUs", _visible_line(report)),
            ("rendezvous", master_line),
            ("NCCL sockets", f"{', '.join(nccl.chosen) or 'none'} ({nccl.note})"),
            ("gloo sockets", f"{', '.join(gloo.chosen) or 'none'} ({gloo.note})"),
        ],
        table_box,
    )
    return Group(
        facts,
        Text(""),
        var_table,
        Text(""),
        Text(f"Network interfaces (from {launch.interfaces_source or 'the caller'}):"),
        interfaces,
    )


def _visible_line(report: EnvReport) -> str:
    cvd = report.launch.cuda_visible_devices
    count = report.launch.visible_gpu_count
    where = (
        "CUDA_VISIBLE_DEVICES unset"
        if cvd.spec is None
        else f"CUDA_VISIBLE_DEVICES={cvd.spec!r}"
    )
    if cvd.visible:
        where += f" -> NVML GPUs {', '.join(str(i) for i in cvd.visible)}"
    return f"{_na(count)} ({where})"
