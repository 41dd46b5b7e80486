"""`ddpdoctor guard --analyze DIR`: the post mortem of a job that ran without the guard, from the Flight Recorder
dumps torch left (TORCH_FR_DUMP_TEMP_FILE=DIR/PREFIX, one file per rank). Findings on stdout, one line each (or
the JSON report), a summary line on stderr; exit 1 with findings, 0 without, 2 when there is nothing to read."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

from ddpdoctor.findings import Finding
from ddpdoctor.guard.flight.align import counts, judge
from ddpdoctor.guard.flight.dumps import Dump, DumpError, dump_files, read_dump
from ddpdoctor.guard.report import finding_dict, plain_line

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


@dataclass
class Analysis:
    where: str
    dumps: list[Dump]
    findings: list[Finding]
    warnings: list[str] = field(default_factory=list)

    def payload(self) -> dict[str, Any]:
        tally = counts(self.dumps)
        return {"dumps": self.where, "ranks": [d.rank for d in self.dumps], "groups": tally["groups"],
                "collectives": tally["collectives"], "warnings": self.warnings,
                "findings": [{**finding_dict(f), "evidence": f.details.get("evidence")} for f in self.findings]}


def analyze(where: str) -> Analysis:
    """Read and judge one set of dumps; DumpError when no usable dump is there. A file that cannot be read is
    left out with a warning (a rank killed while writing leaves half a dump), the others are still judged."""
    warnings: list[str] = []
    dumps: list[Dump] = []
    for rank, path in sorted(dump_files(where).items()):
        try:
            dump = read_dump(path, rank)
        except DumpError as error:
            warnings.append(f"{path} {error}; left out")
            continue
        if not dump.entries:
            warnings.append(f"{path}: rank {rank}'s recorder holds no entry (was TORCH_FR_BUFFER_SIZE set in it?); "
                            "left out")
        dumps.append(dump)
    if not any(d.entries for d in dumps):
        raise DumpError(f"{where}: no usable Flight Recorder dump" + (f" ({warnings[0]})" if warnings else ""))
    return Analysis(where, dumps, judge(dumps), warnings)


def main(where: str, output_format: str, report_file: Optional[str]) -> int:
    """The command's body: prints, and returns the exit status."""
    try:
        analysis = analyze(where)
    except DumpError as error:
        sys.stderr.write(f"ddpdoctor: error: {error}\n")
        return EXIT_ERROR
    for warning in analysis.warnings:
        sys.stderr.write(f"ddpdoctor: warning: {warning}\n")
    payload = analysis.payload()
    if report_file:
        try:
            with open(report_file, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(payload, indent=2) + "\n")
        except OSError as error:
            sys.stderr.write(f"ddpdoctor: error: cannot write {report_file}: {error.strerror or error}\n")
            return EXIT_ERROR
    if output_format == "json":
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
    else:
        for finding in analysis.findings:
            sys.stdout.write(plain_line(finding) + "\n")
    ranks = ", ".join(map(str, payload["ranks"]))
    found = (f"{len(analysis.findings)} finding{'s' if len(analysis.findings) != 1 else ''} "
             f"({', '.join(sorted({f.code for f in analysis.findings}))})" if analysis.findings else "no finding")
    sys.stderr.write(f"ddpdoctor guard --analyze: ranks {ranks}, {payload['collectives']} collectives in "
                     f"{payload['groups']} process group{'s' if payload['groups'] != 1 else ''}: {found}\n")
    return EXIT_FINDINGS if analysis.findings else EXIT_CLEAN
