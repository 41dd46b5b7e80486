"""Every fixture yields exactly the findings pinned in it: same lines, same codes, same counts.

Single-file fixtures live in fixtures/<CODE>/*.py; small multi-file projects in
fixtures/projects/<name>/, linted both whole (the folder) and file by file (each file named alone:
findings for that file only, the project modules it imports read). The pin format is described in
tests/fixture_pins.py. Everything is linted with every rule selected (`ALL`), so an info rule firing
where it should not also fails. A fixture with a `# pending: issue N: ...` header is a strict xfail:
the day the linter starts producing its findings, the mark must go.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Iterable

import pytest
from fixture_pins import PinError, Pins, describe, read_pins, read_pins_file

from ddpdoctor.config import Settings
from ddpdoctor.findings import Finding
from ddpdoctor.lint.engine import lint_paths, lint_source, lint_stdin

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
PROJECTS = FIXTURES / "projects"


def fixture_files() -> list[Path]:
    return sorted(
        p for p in FIXTURES.rglob("*.py") if p.relative_to(FIXTURES).parts[0] not in ("fixes", "projects", "guard")
    )


def project_dirs() -> list[Path]:
    return sorted(p for p in PROJECTS.iterdir() if p.is_dir()) if PROJECTS.is_dir() else []


def project_files(project: Path) -> list[Path]:
    return sorted(project.rglob("*.py"))


def _pending(pins: Pins, subject: Any) -> Any:
    if pins.pending is None:
        return subject
    return pytest.param(subject, marks=pytest.mark.xfail(strict=True, reason=pins.pending))


def _found(findings: Iterable[Finding]) -> Counter[tuple[int, str]]:
    return Counter((f.line, f.code) for f in findings)


def _mismatch(expected: Counter[tuple[int, str]], findings: list[Finding]) -> str:
    found = _found(findings)
    details = "\n".join(f"  {f.path}:{f.line}:{f.column} {f.code} {f.message}" for f in findings)
    return (
        f"missing: {describe(expected - found) or '-'}; unexpected: {describe(found - expected) or '-'}\n{details}"
    )


def _single_file_cases() -> list[Any]:
    return [_pending(read_pins_file(p), p) for p in fixture_files()]


@pytest.mark.parametrize("path", _single_file_cases(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_fixture_yields_exactly_its_pinned_findings(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    pins = read_pins(text, str(path))
    result = lint_source(text, str(path), Settings(select=("ALL",), world_size=pins.world_size))
    assert _found(result.findings) == pins.findings, _mismatch(pins.findings, result.findings)


def _project_pins(project: Path) -> dict[Path, Pins]:
    return {p: read_pins_file(p) for p in project_files(project)}


def _lint(paths: list[Path], world_size: Any) -> list[Finding]:
    settings = Settings(select=("ALL",), world_size=world_size)
    run, _ = lint_paths([str(p) for p in paths], settings, jobs=1, use_cache=False)
    assert not run.errors, run.errors
    return run.findings


def _whole_cases() -> list[Any]:
    cases = []
    for project in project_dirs():
        pending = [p.pending for p in _project_pins(project).values() if p.pending]
        mark = [pytest.mark.xfail(strict=True, reason=pending[0])] if pending else []
        cases.append(pytest.param(project, marks=mark, id=project.name))
    return cases


@pytest.mark.parametrize("project", _whole_cases())
def test_project_linted_whole_yields_exactly_its_pinned_findings(project: Path) -> None:
    pins = _project_pins(project)
    world = next((p.world_size for p in pins.values() if p.world_size), None)
    findings = _lint([project], world)
    for path, expected in pins.items():
        mine = [f for f in findings if Path(f.path).resolve() == path.resolve()]
        assert _found(mine) == expected.findings, f"{path.relative_to(PROJECTS)}: " + _mismatch(expected.findings, mine)
    stray = [f for f in findings if Path(f.path).resolve() not in {p.resolve() for p in pins}]
    assert not stray, stray


def _alone_cases() -> list[Any]:
    cases = []
    for project in project_dirs():
        for path, pins in _project_pins(project).items():
            marks = [pytest.mark.xfail(strict=True, reason=pins.pending)] if pins.pending else []
            cases.append(pytest.param(path, marks=marks, id=str(path.relative_to(PROJECTS))))
    return cases


@pytest.mark.parametrize("path", _alone_cases())
def test_project_file_named_alone_yields_exactly_its_pinned_findings(path: Path) -> None:
    pins = read_pins_file(path)
    findings = _lint([path], pins.world_size)
    assert all(Path(f.path).resolve() == path.resolve() for f in findings), findings
    assert _found(findings) == pins.findings, _mismatch(pins.findings, findings)


@pytest.mark.parametrize("path", _alone_cases())
def test_project_file_piped_through_stdin_yields_exactly_its_pinned_findings(path: Path) -> None:
    """What an editor does (`ddpdoctor lint - --stdin-filename path`): the text is placed in its
    project and the modules it imports are read from disk, so the answers are those of the path."""
    pins = read_pins_file(path)
    result = lint_stdin(path.read_bytes(), str(path), Settings(select=("ALL",), world_size=pins.world_size))
    assert all(f.path == str(path) for f in result.findings), result.findings
    assert _found(result.findings) == pins.findings, _mismatch(pins.findings, result.findings)


def test_projects_are_real_projects() -> None:
    """A project fixture has several modules, and at least half of the projects are traps."""
    projects = project_dirs()
    assert len(projects) >= 12
    traps = 0
    for project in projects:
        files = project_files(project)
        assert len(files) >= 2, f"{project.name}: a project needs at least two modules"
        if not any(read_pins_file(p).findings for p in files):
            traps += 1
    assert traps * 2 >= len(projects), f"only {traps} of {len(projects)} projects are traps"


def test_every_lint_rule_has_enough_fixtures() -> None:
    """At least two positives and two traps per code (the traps: files under fixtures/<CODE>/ that
    expect none of that code)."""
    from ddpdoctor.lint.rules.base import all_rules

    for code in all_rules():
        folder = FIXTURES / code
        files = sorted(folder.glob("*.py"))
        positives = [f for f in files if code in read_pins_file(f).codes]
        traps = [f for f in files if code not in read_pins_file(f).codes]
        assert len(positives) >= 2, f"{code}: needs at least two positive fixtures in {folder}"
        assert len(traps) >= 2, f"{code}: needs at least two trap fixtures in {folder}"


@pytest.mark.parametrize(
    "text, problem",
    [
        ("x = 1\n", "lacks `# expect: none`"),
        ("# expect: DDP001\nx = 1\n", "not on a line of its own"),
        ("# expect: none\nx = 1  # expect: DDP001\n", "says `# expect: none` but pins"),
        ("x = 1  # expect: DDP01\n", "not a rule code"),
    ],
)
def test_malformed_pins_are_rejected(text: str, problem: str) -> None:
    with pytest.raises(PinError, match=problem.replace("(", r"\(").replace("`", "`")):
        read_pins(text)


def test_pins_count_repeats_and_ignore_strings() -> None:
    text = 'a = f(0, 0)  # expect: DDP003, DDP003\nb = "# expect: DDP008"  # expect: DP002\n'
    pins = read_pins(text)
    assert pins.findings == Counter({(1, "DDP003"): 2, (2, "DP002"): 1})
