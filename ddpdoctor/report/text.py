"""`--output-format text`: the human format, modelled on ruff's.

    train.py:12:9: DDP002 SyncBatchNorm conversion applied after the model was wrapped in DDP
    Found 1 problem (1 error) in 1 file.

Lines are built as runs of (text, style) and become `rich.text.Text` only when coloured, so that
user-controlled strings (paths, messages, source lines) are never parsed as rich markup; without
color the plain text is returned directly, so no environment variable (FORCE_COLOR, TERM) can sneak
ANSI codes into a pipe, and rich (a tenth of a second to import) is not imported at all.
Control characters in file names and messages are shown escaped (`\\n`, `\\x1b`): a path with a
newline in it can neither split a finding line nor forge another.
"""

from __future__ import annotations

import io
import re
from collections import Counter
from typing import TYPE_CHECKING, Mapping, Optional, Sequence, Union

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.report.counts import code_counts, is_fixable
from ddpdoctor.terminal import escape_controls

if TYPE_CHECKING:
    from rich.text import Text as RichText

    from ddpdoctor.report import ReportContext

SEVERITY_STYLE = {
    Severity.ERROR: "bold red",
    Severity.WARNING: "bold yellow",
    Severity.INFO: "bold cyan",
}
_GUTTER_STYLE = "bold blue"
_TAB_SIZE = 4
# Python (and libcst) end a line at \r\n, \r or \n only; str.splitlines() also splits on \f,
# \x1c.. and would shift every line number after one of those.
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
# Control characters in a source line would corrupt the terminal (or smuggle ANSI codes into
# colorless output); show them as the replacement character instead.
_CONTROL = {code: "\ufffd" for code in [*range(0x00, 0x09), *range(0x0A, 0x20), 0x7F]}


def escaped(value: str) -> str:
    """`value` with its control characters escaped (`\\n`, `\\x1b`, `\\u2028`): in a file name or a
    message, the name stays recognisable and the report keeps one finding a line."""
    return escape_controls(value)


Run = Union[str, tuple[str, str]]


class Text:
    """A line of runs of text, each with a rich style (or none): the plain text is read without
    rich; `to_rich` builds rich's Text only for coloured output."""

    def __init__(self, text: str = "", style: str = "") -> None:
        self.runs: list[tuple[str, str]] = [(text, "")] if text else []
        self.style = style

    @classmethod
    def assemble(cls, *runs: Run, style: str = "") -> "Text":
        line = cls(style=style)
        for run in runs:
            text, run_style = (run, "") if isinstance(run, str) else run
            line.append(text, run_style)
        return line

    def append(self, text: str, style: str = "") -> None:
        if text:
            self.runs.append((text, style))

    @property
    def plain(self) -> str:
        return "".join(text for text, _ in self.runs)

    def to_rich(self) -> "RichText":
        from rich.text import Text as RichText

        return RichText.assemble(*((text, style) if style else text for text, style in self.runs), style=self.style)


def plural(count: int, noun: str, nouns: Optional[str] = None) -> str:
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"


def _is_pseudo_path(path: str) -> bool:
    # `<stdin>` is a file the user wrote; `<env>`/`<probe>` are not. Neither is a file on disk to
    # count in "in N files", except that a lone `<stdin>` check would then read "in 0 files".
    return path.startswith("<") and path.endswith(">") and path != "<stdin>"


# Pseudo paths that name the whole run rather than anything in it: shown without a location.
_WHOLE_RUN = frozenset({"<env>", "<probe>"})


def _location(finding: Finding) -> list[Run]:
    """`train.py:12:9: ` for a file; a pseudo path has no lines or columns: `GPU 3: ` for a
    finding about one GPU, nothing for one about the environment as a whole. The path is escaped:
    a newline or an escape code in a file name cannot split or forge a finding line."""
    if finding.cell is not None:  # a notebook's cell, as ruff shows it: `nb.ipynb:cell 3:5:9: `
        return [(escaped(finding.path), "bold"), f":cell {finding.cell}:{finding.line}:{finding.column}: "]
    if not _is_pseudo_path(finding.path):
        return [(escaped(finding.path), "bold"), f":{finding.line}:{finding.column}: "]
    if finding.path in _WHOLE_RUN:
        return []
    return [(escaped(finding.path[1:-1]), "bold"), ": "]


def finding_line(finding: Finding) -> Text:
    first, *rest = _LINE_BREAK.split(finding.message)
    line = Text.assemble(
        *_location(finding),
        (finding.code, SEVERITY_STYLE[finding.severity]),
        " ",
        escaped(first),
    )
    # Continuation lines of a multi-line message are indented so that every line that starts
    # at column 0 is still a `path:line:col:` line (grep, editors' error parsers).
    for extra in rest:
        line.append("\n    " + escaped(extra))
    return line


def _display(source_line: str) -> str:
    return source_line.expandtabs(_TAB_SIZE).translate(_CONTROL)


def _caret_span(source_line: str, finding: Finding) -> tuple[int, int]:
    """(offset, width) in terminal cells of the caret run under `source_line`."""
    from rich.cells import cell_len

    start = max(finding.column, 1) - 1
    if finding.end_line == finding.line:
        end = max(finding.end_column - 1, start + 1)
    else:
        # A multi-line range: underline to the end of its first line, as ruff does.
        end = max(len(source_line), start + 1)
    # Cells, not characters: a CJK identifier or an emoji is two columns wide; tabs expand.
    offset = cell_len(source_line[:start].expandtabs(_TAB_SIZE)) + max(start - len(source_line), 0)
    through_end = cell_len(source_line[:end].expandtabs(_TAB_SIZE)) + max(end - len(source_line), 0)
    return offset, max(through_end - offset, 1)


def code_frame(finding: Finding, lines: Sequence[str]) -> list[Text]:
    """The line before, the finding's line and a caret run under its columns."""
    if not 1 <= finding.line <= len(lines):
        return []
    first = max(finding.line - 1, 1)
    width = len(str(finding.line))

    def gutter(label: str, tail: str = "") -> Text:
        # Only the gutter is styled; the user's source keeps the terminal's default colour.
        return Text.assemble((f"{label:>{width}} |", _GUTTER_STYLE), tail)

    frame = [gutter("")]
    for number in range(first, finding.line + 1):
        shown = _display(lines[number - 1])
        frame.append(gutter(str(number), " " + shown if shown else ""))
    offset, caret_width = _caret_span(lines[finding.line - 1], finding)
    caret = gutter("", " ")
    caret.append(" " * offset + "^" * caret_width + " " + finding.code,
                 style=SEVERITY_STYLE[finding.severity])
    frame += [caret, gutter("")]
    if finding.fix is not None:
        frame.append(
            Text.assemble((" " * width + " = ", _GUTTER_STYLE), ("help: ", "bold"),
                          finding.fix.description)
        )
    return frame


def statistics_table(findings: Sequence[Finding]) -> list[Text]:
    """count, code, name per code, most frequent first (ties by code, for stable output)."""
    rows = code_counts(findings)
    if not rows:
        return []
    count_width = max(len(str(row.count)) for row in rows)
    code_width = max(len(row.code) for row in rows)
    return [
        Text.assemble(
            f"{row.count:>{count_width}}  ",
            (f"{row.code:<{code_width}}", SEVERITY_STYLE[row.severity]),
            f"  {row.name}",
        )
        for row in rows
    ]


def summary(findings: Sequence[Finding], context: "ReportContext") -> Text:
    fixed = f"Fixed {plural(context.fixed, 'problem')}. " if context.fixed else ""
    if not findings:
        files = f" ({plural(context.files_checked, 'file')})" if context.files_checked else ""
        return Text.assemble(fixed, (f"All checks passed!{files}", "bold green"))
    by_severity = Counter(finding.severity for finding in findings)
    breakdown = ", ".join(
        plural(by_severity[severity], noun, nouns)
        for severity, noun, nouns in (
            (Severity.ERROR, "error", None),
            (Severity.WARNING, "warning", None),
            (Severity.INFO, "info", "info"),
        )
        if by_severity[severity]
    )
    paths = {finding.path for finding in findings if not _is_pseudo_path(finding.path)}
    where = f" in {plural(len(paths), 'file')}" if paths else ""
    text = Text(f"Found {plural(len(findings), 'problem')} ({breakdown}){where}.", style="bold")
    if fixed:
        text.append(" " + fixed.rstrip())
    fixable = sum(1 for finding in findings if is_fixable(finding))
    if fixable:
        text.append(f" {fixable} fixable with --fix.")
    return text


def _split_sources(sources: Mapping[str, str], findings: Sequence[Finding]) -> dict[str, list[str]]:
    wanted = {finding.path for finding in findings}
    return {path: _LINE_BREAK.split(text) for path, text in sources.items() if path in wanted}


def to_string(lines: Sequence[Text], color: bool) -> str:
    if not color:
        return "\n".join(line.plain for line in lines)
    from rich.console import Console
    from rich.text import Text as RichText

    buffer = io.StringIO()
    console = Console(
        file=buffer,
        force_terminal=True,
        color_system="standard",  # 16 colours: what every terminal and CI log viewer shows
        no_color=False,  # the CLI already decided on color (NO_COLOR included)
        width=10_000,  # never wrap: one finding, one line
        soft_wrap=True,
        highlight=False,
        markup=False,
        emoji=False,
        legacy_windows=False,
        force_jupyter=False,
    )
    console.print(RichText("\n").join(line.to_rich() for line in lines), end="")
    return buffer.getvalue()


def render(findings: Sequence[Finding], context: "ReportContext") -> str:
    ordered = sorted(findings, key=Finding.sort_key)
    lines: list[Text] = []
    if context.statistics:
        lines += statistics_table(ordered)
    else:
        split = _split_sources(context.sources, ordered) if context.show_source else {}
        for finding in ordered:
            lines.append(finding_line(finding))
            # A notebook's source is its JSON, not the cell the line counts in: no frame.
            frame = code_frame(finding, split[finding.path]) if finding.path in split and finding.cell is None else []
            if frame:
                # A blank line after each frame keeps neighbouring findings apart, as in ruff.
                lines += [*frame, Text("")]
    if not context.quiet:
        lines.append(summary(ordered, context))
    return to_string(lines, context.color)
