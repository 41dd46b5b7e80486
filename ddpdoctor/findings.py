"""The one type every part of ddpdoctor reports in: lint, env and probe all produce `Finding`s.

Lines and columns are 1-based, as editors, SARIF and GitHub annotations count them.
A `Fix` carries plain text edits so that it can cross process boundaries (lint workers) and be
applied, re-parsed and written atomically by `ddpdoctor.lint.fixes`.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any, Optional


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        """Higher is worse; used to sort and to decide exit codes."""
        return {"error": 2, "warning": 1, "info": 0}[self.value]


@dataclass(frozen=True)
class Edit:
    """Replace the text between two 1-based (line, column) positions, end exclusive."""

    line: int
    column: int
    end_line: int
    end_column: int
    content: str


@dataclass(frozen=True)
class Fix:
    description: str
    # True when the edit is safe to apply without a human reading it (`--fix` applies only these).
    applicable: bool = True
    edits: tuple[Edit, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "description": self.description,
            "applicable": self.applicable,
            "edits": [asdict(e) for e in self.edits],
        }


@dataclass(frozen=True)
class Finding:
    code: str
    name: str
    severity: Severity
    message: str
    path: str
    line: int = 1
    column: int = 1
    end_line: int = 1
    end_column: int = 1
    fix: Optional[Fix] = None
    # Where the finding came from: "lint", "env" or "probe". Reporters do not branch on it.
    source: str = "lint"
    # Free-form extra data for machine consumers (env values, probe measurements).
    details: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # In a Jupyter notebook: the cell (1-based, among all its cells); `line` is then the line in it.
    cell: Optional[int] = None

    def sort_key(self) -> tuple[str, int, int, int, str]:
        return (self.path, self.cell or 0, self.line, self.column, self.code)

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "name": self.name,
            "severity": self.severity.value,
            "message": self.message,
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "end_line": self.end_line,
            "end_column": self.end_column,
            "fix": self.fix.to_dict() if self.fix else None,
            "source": self.source,
            **({"details": self.details} if self.details else {}),
            **({"cell": self.cell} if self.cell is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Finding":
        fix_data = data.get("fix")
        fix = None
        if fix_data:
            fix = Fix(
                description=fix_data["description"],
                applicable=fix_data.get("applicable", True),
                edits=tuple(Edit(**e) for e in fix_data.get("edits", ())),
            )
        return cls(
            code=data["code"],
            name=data["name"],
            severity=Severity(data["severity"]),
            message=data["message"],
            path=data["path"],
            line=data["line"],
            column=data["column"],
            end_line=data["end_line"],
            end_column=data["end_column"],
            fix=fix,
            source=data.get("source", "lint"),
            details=data.get("details", {}),
            cell=data.get("cell"),
        )


def worst_severity(findings: "list[Finding]") -> Optional[Severity]:
    worst: Optional[Severity] = None
    for finding in findings:
        if worst is None or finding.severity.rank > worst.rank:
            worst = finding.severity
    return worst
