"""AMP001's autofix, beyond the generic pair checks in test_autofix_pairs.py. Where the
module does not bind `torch` itself (only `from torch.cuda.amp import ...`), rewriting to
`torch.autocast(...)` would introduce an undefined name: the finding carries a fix that is not
applicable, and `--fix` leaves the file untouched.
"""

from __future__ import annotations

from pathlib import Path


from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_source

FIXES = Path(__file__).resolve().parent.parent / "fixtures" / "fixes" / "AMP001"
SETTINGS = Settings(select=("AMP001",))
PAIRS = sorted(FIXES.glob("*.in.py"))


def _expected(path: Path) -> str:
    return path.with_name(path.name.replace(".in.py", ".out.py")).read_text(encoding="utf-8")


def test_every_finding_in_fixable_inputs_is_fixed() -> None:
    for path in PAIRS:
        if path.name.startswith("no_torch_import"):
            continue
        after = lint_source(_expected(path), str(path), SETTINGS)
        assert not after.findings, [f.message for f in after.findings]


def test_fix_is_not_applicable_without_import_torch() -> None:
    path = FIXES / "no_torch_import.in.py"
    findings = lint_source(path.read_text(encoding="utf-8"), str(path), SETTINGS).findings
    assert [f.line for f in findings] == [3, 4]
    for finding in findings:
        assert finding.fix is not None and not finding.fix.applicable
        assert "import torch" in finding.fix.description


def test_fix_edits_only_the_call() -> None:
    source = "import torch\nscaler = torch.cuda.amp.GradScaler(enabled=True)  # keep me\n"
    result = lint_source(source, "t.py", SETTINGS, fix=True)
    assert result.fixed_source == 'import torch\nscaler = torch.amp.GradScaler("cuda", enabled=True)  # keep me\n'
