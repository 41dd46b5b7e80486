"""`--fix` never loses the user's work: each defect measured in issue 14 pinned by a real run.

Line endings, owners, read-only files and folders, symlinks, hard links, an edit saved while the
fix runs, and `--diff` output that the real `patch` must apply.
"""

from __future__ import annotations

import os
import random
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpdoctor.cli import main
from ddpdoctor.config import Settings
from ddpdoctor.findings import Edit, Finding, Fix, Severity
from ddpdoctor.lint.engine import lint_source
from ddpdoctor.lint.fixes import fix_rounds, unified_diff
from ddpdoctor.lint.safe_write import WriteError, write_fixed

FIXES = Path(__file__).resolve().parent.parent / "fixtures" / "fixes"
AMP = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
AMP_FIXED = 'import torch\nscaler = torch.amp.GradScaler("cuda")\n'
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def lint(args: list[str], cwd: Path) -> "object":
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, ["lint", "--no-cache", *args], catch_exceptions=False)
    finally:
        os.chdir(old)


def test_a_lone_cr_line_ending_gets_the_edit_on_the_right_line(tmp_path: Path) -> None:
    target = tmp_path / "cr.py"
    target.write_bytes(b"import torch\r# c\nscaler = torch.cuda.amp.GradScaler()\n")
    result = lint(["--select", "AMP001", "--fix", "cr.py"], tmp_path)
    assert result.exit_code == 0, result.output
    assert target.read_bytes() == b'import torch\r# c\nscaler = torch.amp.GradScaler("cuda")\n'


def test_bom_and_crlf_are_kept(tmp_path: Path) -> None:
    target = tmp_path / "bom.py"
    target.write_bytes(b"\xef\xbb\xbf" + AMP.replace("\n", "\r\n").encode())
    assert lint(["--select", "AMP001", "--fix", "bom.py"], tmp_path).exit_code == 0
    assert target.read_bytes() == b"\xef\xbb\xbf" + AMP_FIXED.replace("\n", "\r\n").encode()


@pytest.mark.skipif(not IS_ROOT, reason="only root can give a file to another owner")
def test_the_owner_and_mode_are_kept_when_run_as_root(tmp_path: Path) -> None:
    target = tmp_path / "owned.py"
    target.write_text(AMP)
    os.chown(target, 4321, 4322)
    target.chmod(0o664)
    assert lint(["--select", "AMP001", "--fix", "owned.py"], tmp_path).exit_code == 0
    info = target.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (4321, 4322, 0o664)
    assert target.read_text() == AMP_FIXED


def test_a_read_only_file_is_an_error_left_as_it_was_and_the_others_are_fixed(tmp_path: Path) -> None:
    locked, other = tmp_path / "a_locked.py", tmp_path / "b_other.py"
    locked.write_text(AMP)
    other.write_text(AMP)
    locked.chmod(0o444)
    result = lint(["--select", "AMP001", "--fix", "a_locked.py", "b_other.py"], tmp_path)
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if "error" in line and "a_locked.py" in line]
    assert errors == ["ddpdoctor: error: a_locked.py: read-only file; left as it was"]
    assert "internal error" not in result.output
    assert locked.read_text() == AMP and stat.S_IMODE(locked.stat().st_mode) == 0o444
    assert other.read_text() == AMP_FIXED
    # The locked file's finding is still reported: it was not fixed.
    assert "a_locked.py:2:10: AMP001" in result.output


def _lock_folder(folder: Path) -> bool:
    """Make `folder` refuse new entries, even to root (whom file modes do not stop)."""
    if not IS_ROOT:
        folder.chmod(0o555)
        return True
    return shutil.which("chattr") is not None and subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0


def _unlock_folder(folder: Path) -> None:
    if IS_ROOT:
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
    folder.chmod(0o755)


def test_a_read_only_folder_is_an_error_for_its_file_and_the_others_are_fixed(tmp_path: Path) -> None:
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "train.py").write_text(AMP)
    (tmp_path / "other.py").write_text(AMP)
    if not _lock_folder(tmp_path / "locked"):
        pytest.skip("cannot make a folder read-only for root here (no chattr)")
    try:
        result = lint(["--select", "AMP001", "--fix", "locked/train.py", "other.py"], tmp_path)
    finally:
        _unlock_folder(tmp_path / "locked")
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("ddpdoctor: error:")]
    assert len(errors) == 1, result.output
    assert errors[0].startswith("ddpdoctor: error: locked/train.py: not written: cannot create a file in ")
    assert "internal error" not in result.output
    assert (tmp_path / "locked" / "train.py").read_text() == AMP
    assert sorted(p.name for p in (tmp_path / "locked").iterdir()) == ["train.py"]
    assert (tmp_path / "other.py").read_text() == AMP_FIXED


def test_a_symlink_stays_a_link_and_its_target_is_fixed(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "train.py"
    target.write_text(AMP)
    link = tmp_path / "link.py"
    link.symlink_to(Path("real") / "train.py")
    assert lint(["--select", "AMP001", "--fix", "link.py"], tmp_path).exit_code == 0
    assert link.is_symlink() and os.readlink(link) == os.path.join("real", "train.py")
    assert target.read_text() == AMP_FIXED
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["train.py"]


def test_hard_links_keep_sharing_the_fixed_content(tmp_path: Path) -> None:
    first = tmp_path / "first.py"
    first.write_text(AMP)
    second = tmp_path / "second.py"
    os.link(first, second)
    assert lint(["--select", "AMP001", "--fix", "first.py"], tmp_path).exit_code == 0
    assert os.path.samefile(first, second)
    assert second.read_text() == AMP_FIXED


def test_a_file_edited_after_it_was_linted_is_not_written(tmp_path: Path) -> None:
    target = tmp_path / "train.py"
    target.write_text(AMP)
    result = lint_source(AMP, str(target), Settings(select=("AMP001",)), fix=True)
    assert result.fixed_source == AMP_FIXED
    edited = AMP + "# the user's edit\n"
    target.write_text(edited)
    with pytest.raises(WriteError, match="changed on disk since it was linted"):
        write_fixed(str(target), lambda data: data == AMP.encode(), lambda original: AMP_FIXED.encode())
    assert target.read_text() == edited


def test_an_edit_saved_while_the_fix_is_written_wins(tmp_path: Path) -> None:
    """The editor saves between our read and our rename: the check right before the rename sees it."""
    target = tmp_path / "train.py"
    target.write_text(AMP)
    edited = AMP + "x = 1\n"

    def render(original: bytes) -> bytes:
        target.write_text(edited)  # the editor's save, mid-write
        return AMP_FIXED.encode()

    with pytest.raises(WriteError, match="changed on disk"):
        write_fixed(str(target), lambda data: data == AMP.encode(), render)
    assert target.read_text() == edited
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]  # no temporary file left


def _finding(code: str, line: int, edit: Edit | None = None, applicable: bool = True) -> Finding:
    fix = Fix("f", applicable, (edit,)) if edit else None
    return Finding(code, "n", Severity.WARNING, "m", "t.py", line, 1, line, 1, fix)


def test_a_fix_that_adds_a_finding_or_keeps_its_own_is_not_applied() -> None:
    source = "a = 1\nb = 2\n"
    adds = _finding("AMP001", 1, Edit(1, 5, 1, 6, "9"))
    keeps = _finding("DDP001", 2, Edit(2, 5, 2, 6, "8"))

    def relint(text: str) -> list[Finding]:
        out = [] if "a = 9" in text else [_finding("AMP001", 1)]
        out.append(_finding("DDP001", 2))  # the DDP001 fix does not remove its finding
        if "a = 9" in text:
            out.append(_finding("DDP010", 1))  # ...and the AMP001 fix adds a new one
        return out

    fixed, remaining, count = fix_rounds(source, [adds, keeps], relint)
    assert (fixed, count) == (source, 0)
    assert [f.code for f in remaining] == ["AMP001", "DDP001"]


@pytest.mark.parametrize("first", ["(", "7"], ids=["breaks-the-parse", "keeps-its-finding"])
def test_a_rejected_fix_does_not_block_the_fixes_after_it(first: str) -> None:
    source = "a = 1\nb = 2\n"
    rejected = _finding("DDP001", 1, Edit(1, 5, 1, 6, first))
    good = _finding("AMP001", 2, Edit(2, 5, 2, 6, "9"))

    def relint(text: str) -> list[Finding]:
        return [_finding("DDP001", 1)] + ([] if "b = 9" in text else [_finding("AMP001", 2)])

    fixed, remaining, count = fix_rounds(source, [rejected, good], relint)
    assert (fixed, count) == ("a = 1\nb = 9\n", 1)
    assert [f.code for f in remaining] == ["DDP001"]


def test_a_fix_that_removes_its_finding_and_adds_none_is_applied() -> None:
    source = "a = 1\n"
    good = _finding("AMP001", 1, Edit(1, 5, 1, 6, "9"))
    fixed, remaining, count = fix_rounds(source, [good], lambda text: [] if "9" in text else [good])
    assert (fixed, remaining, count) == ("a = 9\n", [], 1)


def test_unsafe_fixes_are_applied_only_with_unsafe_fixes(tmp_path: Path) -> None:
    source = (FIXES / "DDP001" / "conditional_sampler_not_applied.in.py").read_text()
    target = tmp_path / "train.py"
    target.write_text(source)
    safe = lint(["--select", "DDP001", "--fix", "train.py"], tmp_path)
    assert safe.exit_code == 1 and target.read_text() == source
    assert "DDP001" in safe.output
    unsafe = lint(["--select", "DDP001", "--fix", "--unsafe-fixes", "train.py"], tmp_path)
    assert unsafe.exit_code == 0, unsafe.output
    assert "Fixed 1 problem." in unsafe.output
    fixed = target.read_text()
    assert fixed != source and ".set_epoch(epoch)" in fixed
    assert lint(["--select", "DDP001", "--fix", "--unsafe-fixes", "train.py"], tmp_path).exit_code == 0
    assert target.read_text() == fixed  # a second run changes nothing


# ------------------------------------------------------------------------------- --diff and patch

# Characters str.splitlines() takes for line breaks although Python's tokenizer and `patch` do not.
ODD_BREAKS = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


def _generated_sources(count: int) -> list[str]:
    rng = random.Random(1234)
    sources = []
    for _ in range(count):
        lines = ["import torch"]
        for _ in range(rng.randint(0, 6)):
            lines.append(rng.choice(["x = 1", "# note", "", "y = 'a'", "def f():\n    return 2"]))
            if rng.random() < 0.5:
                lines[-1] += f"  # {rng.choice(ODD_BREAKS)}"
        lines.append("scaler = torch.cuda.amp.GradScaler()")
        for _ in range(rng.randint(0, 3)):
            lines.append(rng.choice(["z = 3", "# tail" + rng.choice(ODD_BREAKS), "w = torch.cuda.amp.autocast()"]))
        text = rng.choice(["\n", "\r\n", "\r"]).join(lines)
        if rng.random() < 0.6:
            text += "\n" if "\r\n" not in text else "\r\n"
        if rng.random() < 0.3:
            text = text.replace("import torch", "import torch\x0c", 1)
        sources.append(text)
    return sources


@pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch is not installed")
def test_diff_output_applies_with_patch_to_every_generated_file(tmp_path: Path) -> None:
    sources = _generated_sources(40)
    assert any(not s.endswith("\n") for s in sources) and any("\x0c" in s for s in sources)
    failures = []
    for number, source in enumerate(sources):
        work = tmp_path / str(number)
        work.mkdir()
        target = work / "train.py"
        target.write_bytes(source.encode("utf-8"))
        result = lint_source(source, "train.py", Settings(select=("AMP001",)), fix=True)
        assert result.fixed_source is not None, source
        diff = unified_diff("train.py", source, result.fixed_source)
        patched = subprocess.run(
            ["patch", "-p1", "--quiet", "--batch"], input=diff.encode("utf-8"), cwd=work, capture_output=True, timeout=30
        )
        if patched.returncode != 0 or target.read_bytes() != result.fixed_source.encode("utf-8"):
            failures.append((source, patched.stdout + patched.stderr))
    assert failures == []


def test_diff_marks_a_missing_final_newline() -> None:
    diff = unified_diff("t.py", "a\nb", "a\nc")
    assert diff.endswith("-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n")
    assert " a\x0cb\n-c\n+d\n" in unified_diff("t.py", "a\x0cb\nc\n", "a\x0cb\nd\n")


def test_a_batch_with_one_bad_fix_falls_back_to_one_at_a_time() -> None:
    """Three fixes; the batch adds a finding (the third fix's fault), so each is tried alone: the
    two good ones are kept, the bad one is not."""
    source = "a = 1\nb = 1\nc = 1\n"
    found = [_finding("AMP001", n, Edit(n, 5, n, 6, "9")) for n in (1, 2, 3)]

    def relint(text: str) -> list[Finding]:
        lines = text.splitlines()
        out = [_finding("AMP001", n + 1, Edit(n + 1, 5, n + 1, 6, "9")) for n, line in enumerate(lines) if line.endswith("1")]
        if lines[2] == "c = 9":
            out.append(_finding("DDP010", 3))  # the third fix breaks something else
        return out

    calls: list[str] = []
    fixed, remaining, count = fix_rounds(source, found, lambda text: calls.append(text) or relint(text))
    assert (fixed, count) == ("a = 9\nb = 9\nc = 1\n", 2)
    assert [(f.code, f.line) for f in remaining] == [("AMP001", 3)]
    assert calls[0] == "a = 9\nb = 9\nc = 9\n"  # the batch was tried first


def test_a_good_batch_takes_one_relint() -> None:
    source = "a = 1\nb = 1\n"
    found = [_finding("AMP001", n, Edit(n, 5, n, 6, "9")) for n in (1, 2)]
    calls: list[str] = []

    def relint(text: str) -> list[Finding]:
        calls.append(text)
        return [_finding("AMP001", n + 1) for n, line in enumerate(text.splitlines()) if line.endswith("1")]

    assert fix_rounds(source, found, relint) == ("a = 9\nb = 9\n", [], 2)
    assert calls == ["a = 9\nb = 9\n"]
