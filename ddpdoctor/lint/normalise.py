"""Valid Python that libcst's tokenizer refuses, rewritten into an equivalent text it accepts.

Only used after libcst refused a text that CPython compiles. Two corners, found by fuzzing:
- a form feed in a line's indentation: CPython's tokenizer resets the indentation count at a form
  feed, libcst's does not ("no matching outer block for dedent"). The whitespace up to the last
  form feed is dropped; columns on that line shift, and `restore` shifts findings back;
- a line holding only a backslash continuation: CPython joins it to the next line, libcst expects
  an indent. The backslash becomes a space (a blank line): no position moves.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

from ddpdoctor.findings import Edit, Finding

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n|$)")
_LEADING = re.compile(r"[ \t\x0c]*")
_LONE_CONTINUATION = re.compile(r"[ \t\x0c]*\\")


@dataclasses.dataclass(frozen=True)
class Normalised:
    text: str
    shifts: dict[int, int]  # 1-based line -> characters removed at its start

    def restore(self, findings: list[Finding]) -> list[Finding]:
        """Findings on the normalised text -> the same findings on the original text."""
        if not self.shifts:
            return findings
        return [self._restore(finding) for finding in findings]

    def _restore(self, finding: Finding) -> Finding:
        fix = finding.fix
        if fix is not None:
            fix = dataclasses.replace(fix, edits=tuple(self._restore_edit(edit) for edit in fix.edits))
        return dataclasses.replace(
            finding,
            column=finding.column + self.shifts.get(finding.line, 0),
            end_column=finding.end_column + self.shifts.get(finding.end_line, 0),
            fix=fix,
        )

    def _restore_edit(self, edit: Edit) -> Edit:
        return dataclasses.replace(
            edit,
            column=edit.column + self.shifts.get(edit.line, 0),
            end_column=edit.end_column + self.shifts.get(edit.end_line, 0),
        )


def for_libcst(text: str) -> Optional[Normalised]:
    """The rewritten text, or None when neither corner occurs."""
    out: list[str] = []
    shifts: dict[int, int] = {}
    for number, match in enumerate(_LINE.finditer(text), start=1):
        line = match.group()
        if not line:
            break
        if _LONE_CONTINUATION.fullmatch(line.rstrip("\r\n")):
            body = line.rstrip("\r\n")
            line = body[:-1] + " " + line[len(body) :]
        else:
            lead = _LEADING.match(line)
            indent = lead.group() if lead else ""
            if "\x0c" in indent:
                removed = indent.rfind("\x0c") + 1
                line = line[removed:]
                shifts[number] = removed
        out.append(line)
    normalised = "".join(out)
    return Normalised(normalised, shifts) if normalised != text else None
