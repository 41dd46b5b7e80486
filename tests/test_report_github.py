"""The github reporter: workflow commands, one per finding, escaped as @actions/core does."""

from __future__ import annotations

from ddpdoctor.findings import Edit, Finding, Fix, Severity
from ddpdoctor.report import ReportContext, render
from ddpdoctor.report.github import escape_data, escape_property


def _render(findings: list[Finding]) -> str:
    return render(findings, "github", ReportContext(catalog={}))


def test_one_command_per_finding_with_level_per_severity() -> None:
    findings = [
        Finding("DDP101", "no-set-epoch", Severity.WARNING, "sampler.set_epoch() never called",
                "train.py", 30, 5, 30, 18),
        Finding("DDP002", "syncbn-after-ddp", Severity.ERROR,
                "SyncBatchNorm conversion applied after DDP", "train.py", 12, 9, 12, 55,
                Fix("Convert before wrapping", True, (Edit(12, 1, 12, 55, ""),))),
        Finding("DDP201", "print-on-all-ranks", Severity.INFO, "print() runs on every rank",
                "src/util.py", 3, 1, 3, 6),
    ]
    assert _render(findings).splitlines() == [
        "::notice file=src/util.py,line=3,col=1,endLine=3,endColumn=6,"
        "title=DDP201 (print-on-all-ranks)::print() runs on every rank",
        "::error file=train.py,line=12,col=9,endLine=12,endColumn=55,"
        "title=DDP002 (syncbn-after-ddp)::SyncBatchNorm conversion applied after DDP",
        "::warning file=train.py,line=30,col=5,endLine=30,endColumn=18,"
        "title=DDP101 (no-set-epoch)::sampler.set_epoch() never called",
    ]


def test_escaping_of_message_path_and_title() -> None:
    finding = Finding(
        "DDP003", "odd:name,here", Severity.ERROR,
        "100% of ranks\r\nwait here: forever, or not",
        "my dir/a,b:c é.py", 2, 3, 4, 5,
    )
    assert _render([finding]) == (
        "::error file=my dir/a%2Cb%3Ac é.py,line=2,col=3,endLine=4,endColumn=5,"
        "title=DDP003 (odd%3Aname%2Chere)::100%25 of ranks%0D%0Await here: forever, or not"
    )
    # Exactly one line per finding: the newline inside the message did not survive.
    assert "\n" not in _render([finding])


def test_percent_is_escaped_first_so_escapes_are_not_double_escaped() -> None:
    assert escape_data("%0A\n") == "%250A%0A"
    assert escape_property("a%:b,c\r") == "a%25%3Ab%2Cc%0D"
    assert escape_data("a:b,c") == "a:b,c"  # data keeps `:` and `,`


def test_pseudo_paths_get_no_file_property() -> None:
    env = Finding("ENV001", "nccl-p2p-disabled", Severity.WARNING, "NCCL_P2P_DISABLE=1", "<env>")
    assert _render([env]) == "::warning title=ENV001 (nccl-p2p-disabled)::NCCL_P2P_DISABLE=1"


def test_no_findings_renders_nothing() -> None:
    assert _render([]) == ""
