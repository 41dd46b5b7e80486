"""Issue 14's "done when": `lint --fix --select ALL` over every fixture (copied to a temporary
folder) leaves no finding that still carries a certain fix, changes nothing on a second run, and
every fixed file compiles and yields exactly the remaining codes pinned in
tests/fix_tree_expected.txt (`path: codes before -> codes after`, for every file the fix changed;
every other file must keep its findings)."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpdoctor.cli import main
from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_paths

ROOT = Path(__file__).resolve().parent.parent
PINS = Path(__file__).resolve().parent / "fix_tree_expected.txt"


def codes_by_file(folder: Path) -> dict[str, list[str]]:
    run, _ = lint_paths([str(folder)], Settings(select=("ALL",)), jobs=1, use_cache=False)
    out: dict[str, list[str]] = {}
    for result in run.files:
        relative = Path(result.path).resolve().relative_to(folder.resolve()).as_posix()
        out[relative] = sorted(f.code for f in result.findings)
    return out


def certain_fixes_left(folder: Path) -> list[str]:
    run, _ = lint_paths([str(folder)], Settings(select=("ALL",)), jobs=1, use_cache=False)
    return [
        f"{f.path}:{f.line} {f.code}" for r in run.files for f in r.findings if f.fix is not None and f.fix.applicable
    ]


def snapshot(folder: Path) -> dict[str, bytes]:
    files = sorted([*folder.rglob("*.py"), *folder.rglob("*.ipynb")])  # notebooks are fixed in their JSON
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in files}


def read_pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in PINS.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            path, _, change = line.partition(": ")
            pins[path] = change
    return pins


def describe(codes: list[str]) -> str:
    return " ".join(f"{code}x{n}" if n > 1 else code for code, n in sorted(Counter(codes).items())) or "-"


@pytest.fixture(scope="module")
def fixed_tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[str]], dict[str, bytes]]:
    folder = tmp_path_factory.mktemp("tree") / "fixtures"
    shutil.copytree(ROOT / "fixtures", folder, ignore=shutil.ignore_patterns("fixes", "__pycache__"))
    before = codes_by_file(folder)
    original = snapshot(folder)
    result = CliRunner().invoke(main, ["lint", "--select", "ALL", "--no-cache", "--fix", str(folder)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "internal error" not in result.output
    return folder, before, original


def test_every_file_compiles_after_fix(fixed_tree: tuple[Path, dict[str, list[str]], dict[str, bytes]]) -> None:
    folder, _, _ = fixed_tree
    for path in sorted(folder.rglob("*.py")):
        compile(path.read_bytes(), str(path), "exec")


def test_no_certain_fix_is_left(fixed_tree: tuple[Path, dict[str, list[str]], dict[str, bytes]]) -> None:
    folder, _, _ = fixed_tree
    assert certain_fixes_left(folder) == []


def test_remaining_codes_are_the_pinned_ones(fixed_tree: tuple[Path, dict[str, list[str]], dict[str, bytes]]) -> None:
    folder, before, original = fixed_tree
    after = codes_by_file(folder)
    now = snapshot(folder)
    changed = {path for path in now if now[path] != original.get(path)}
    found = {path: f"{describe(before.get(path, []))} -> {describe(after.get(path, []))}" for path in sorted(changed)}
    assert found == read_pins()
    for path in set(after) - changed:
        assert after[path] == before.get(path, []), path


def test_second_run_changes_nothing(fixed_tree: tuple[Path, dict[str, list[str]], dict[str, bytes]]) -> None:
    folder, _, _ = fixed_tree
    first = snapshot(folder)
    result = CliRunner().invoke(main, ["lint", "--select", "ALL", "--no-cache", "--fix", str(folder)])
    assert "Fixed" not in result.output
    assert snapshot(folder) == first


# Fixes that a second module of the project (or a call the analysis cannot read) would make wrong:
# each finding is there with its fix offered as a suggestion, and `--fix --select ALL` leaves the
# file as it was. path -> (code, what makes the fix wrong).
SECOND_MODULE_TRAPS = {
    "projects/device_fix_local_rank_rewritten_in_another_module/train.py": ("DDP003", "slots.py rewrites args.gpu"),
    "projects/device_fix_local_rank_rewritten_in_another_module/train_by_rank.py": (
        "DDP004", "an unread package is handed args"),
    "projects/device_fix_self_local_rank_rewritten_by_base_class/trainer.py": (
        "DDP003", "an inherited method in base.py rebinds self.local_rank"),
    "projects/horovod_helpers_leave_duties_undone/train.py": ("HVD001", "schedule.py writes the rate every epoch"),
    "projects/horovod_optimizers_known_by_use/train_transformers.py": (
        "HVD001", "an unread package's scheduler is handed the optimizer"),
}


@pytest.mark.parametrize("path", sorted(SECOND_MODULE_TRAPS))
def test_no_fix_that_a_second_module_makes_wrong_is_applied(
    fixed_tree: tuple[Path, dict[str, list[str]], dict[str, bytes]], path: str
) -> None:
    folder, _, _ = fixed_tree
    code, _ = SECOND_MODULE_TRAPS[path]
    source = ROOT / "fixtures" / path
    run, _ = lint_paths([str(source)], Settings(select=("ALL",)), jobs=1, use_cache=False)
    trapped = [f for f in run.findings if f.code == code]
    assert trapped and all(f.fix is not None and not f.fix.applicable for f in trapped)
    # Another rule's certain fix may change the file elsewhere; the trapped lines stay as written.
    lines = source.read_text(encoding="utf-8").splitlines()
    fixed = (folder / path).read_text(encoding="utf-8").splitlines()
    for finding in trapped:
        assert lines[finding.line - 1] in fixed
