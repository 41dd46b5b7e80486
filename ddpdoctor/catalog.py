"""The rule catalog: one Markdown page per code in `rules/CODE.md`, shipped inside the wheel.

Each page starts with a small front matter block:

    ---
    code: DDP002
    name: syncbn-after-ddp
    severity: error
    default: on
    fixable: false          # true: --fix applies it; suggested: attached, never auto-applied
    kind: lint
    summary: SyncBatchNorm conversion applied after the model was wrapped in DDP
    ---

followed by the ruff-style sections (What it does / Why is this bad? / Example / Use instead /
When to ignore / References). `ddpdoctor rules`, `explain`, SARIF and the engine's defaults all read
their facts from here, so a code's severity is written down exactly once.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ddpdoctor.findings import Severity

RULES_URL = "https://github.com/ddpdoctor/ddpdoctor/blob/main/rules/{code}.md"

_FRONT_MATTER = re.compile(r"\A---\n(.*?)\n---\n", re.DOTALL)
_FENCE = re.compile(r"```python\n(.*?)```", re.DOTALL)
REQUIRED_KEYS = ("code", "name", "severity", "default", "fixable", "kind", "summary")
KINDS = ("lint", "env", "probe", "guard")


class CatalogError(Exception):
    pass


@dataclass(frozen=True)
class RuleInfo:
    code: str
    name: str
    severity: Severity
    default_on: bool
    fixable: bool  # `--fix` can apply this rule's fixes
    fix_kind: str  # "auto", "suggested" (attached to findings, never applied automatically) or "none"
    kind: str
    summary: str
    body: str
    path: Path

    @property
    def help_uri(self) -> str:
        return RULES_URL.format(code=self.code)

    def section(self, title: str) -> str:
        """The text under a `## title` heading, up to the next `## ` heading."""
        match = re.search(
            rf"^## {re.escape(title)}\s*\n(.*?)(?=^## |\Z)", self.body, re.DOTALL | re.MULTILINE
        )
        return match.group(1).strip() if match else ""

    def examples(self, title: str) -> list[str]:
        """The ```python blocks under a section (used by the tests that lint every page)."""
        return [block for block in _FENCE.findall(self.section(title))]

    def to_dict(self) -> dict[str, object]:
        return {
            "code": self.code,
            "name": self.name,
            "severity": self.severity.value,
            "default": "on" if self.default_on else "off",
            "fixable": self.fixable,
            "fix": self.fix_kind,
            "kind": self.kind,
            "summary": self.summary,
            "help_uri": self.help_uri,
            "body": self.body,
        }


def catalog_dir() -> Path:
    """The shipped copy inside the wheel, else the source tree's `rules/` (editable installs)."""
    package_dir = Path(__file__).resolve().parent
    shipped = package_dir / "_catalog"
    if shipped.is_dir():
        return shipped
    return package_dir.parent / "rules"


def parse_page(path: Path) -> RuleInfo:
    text = path.read_text(encoding="utf-8")
    match = _FRONT_MATTER.match(text)
    if not match:
        raise CatalogError(f"{path}: missing '---' front matter")
    meta: dict[str, str] = {}
    for raw in match.group(1).splitlines():
        if not raw.strip():
            continue
        key, sep, value = raw.partition(":")
        if not sep:
            raise CatalogError(f"{path}: bad front matter line {raw!r}")
        meta[key.strip()] = value.strip()
    missing = [k for k in REQUIRED_KEYS if k not in meta]
    if missing:
        raise CatalogError(f"{path}: front matter lacks {', '.join(missing)}")
    if meta["code"] != path.stem:
        raise CatalogError(f"{path}: code {meta['code']} does not match the file name")
    if meta["fixable"] not in ("true", "suggested", "false"):
        raise CatalogError(f"{path}: fixable must be true, suggested or false")
    if meta["kind"] not in KINDS:
        raise CatalogError(f"{path}: kind must be one of {', '.join(KINDS)}")
    return RuleInfo(
        code=meta["code"],
        name=meta["name"],
        severity=Severity(meta["severity"]),
        default_on=meta["default"] == "on",
        fixable=meta["fixable"] == "true",
        fix_kind={"true": "auto", "suggested": "suggested", "false": "none"}[meta["fixable"]],
        kind=meta["kind"],
        summary=meta["summary"],
        body=text[match.end():].strip() + "\n",
        path=path,
    )


@functools.lru_cache(maxsize=None)
def load_catalog(directory: Optional[str] = None) -> dict[str, RuleInfo]:
    base = Path(directory) if directory else catalog_dir()
    pages = sorted(base.glob("*.md"))
    catalog: dict[str, RuleInfo] = {}
    for page in pages:
        if page.name.upper() == "README.MD":
            continue
        info = parse_page(page)
        catalog[info.code] = info
    return catalog


def rule_info(code: str) -> Optional[RuleInfo]:
    return load_catalog().get(code.upper())


def find_rule(code_or_name: str) -> Optional[RuleInfo]:
    """A rule by its code (`DDP001`, any case) or its name (`missing-set-epoch`)."""
    catalog = load_catalog()
    info = catalog.get(code_or_name.upper())
    if info is None:
        info = next((i for i in catalog.values() if i.name == code_or_name.lower()), None)
    return info
