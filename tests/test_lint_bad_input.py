"""Every bad input a user can cause: a one-line error and exit 2, a warning, or a cache miss —
never "internal error", never a hang, never silently dropped settings."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpdoctor.cli import main
from ddpdoctor.config import Settings
from ddpdoctor.lint.cache import ResultCache
from ddpdoctor.lint.engine import lint_paths

AMP = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def lint(cwd: Path, *args: str) -> "object":
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, ["lint", *args], catch_exceptions=False)
    finally:
        os.chdir(old)


def one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("ddpdoctor: error:")]
    assert len(lines) == 1, output
    assert "internal error" not in output and "Traceback" not in output
    return lines[0]


# ---------------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "table, kind",
    [("ddpdoctor = 3", "an integer"), ("ddpdoctor = ['DDP001']", "an array"), ("ddpdoctor = 'ALL'", "a string")],
)
def test_tool_ddpdoctor_of_the_wrong_type_is_a_one_line_error(tmp_path: Path, table: str, kind: str) -> None:
    (tmp_path / "pyproject.toml").write_text(f"[tool]\n{table}\n")
    (tmp_path / "t.py").write_text(AMP)
    result = lint(tmp_path, "--no-cache", "t.py")
    assert result.exit_code == 2
    assert one_error_line(result.output).endswith(f"pyproject.toml: [tool.ddpdoctor] must be a table of settings, not {kind}")


def test_a_pyproject_that_is_not_utf8_is_an_error_not_silently_ignored(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_bytes(b"# \xe9t\xe9\n[tool.ddpdoctor]\nignore = ['AMP001']\n")
    (tmp_path / "t.py").write_text(AMP)
    result = lint(tmp_path, "--no-cache", "t.py")
    assert result.exit_code == 2
    assert one_error_line(result.output).endswith("pyproject.toml: not UTF-8 (TOML files must be UTF-8)")


def test_someone_elses_non_utf8_pyproject_is_not_ours_to_judge(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_bytes(b"# \xe9t\xe9\n[tool.black]\n")
    (tmp_path / "t.py").write_text(AMP)
    assert lint(tmp_path, "--no-cache", "--select", "AMP001", "t.py").exit_code == 1


@pytest.mark.parametrize("line", ["max-file-size = 0", "max-file-size = 'big'", "file-timeout = -1", "file-timeout = nan"])
def test_limits_must_be_positive_numbers(tmp_path: Path, line: str) -> None:
    (tmp_path / "pyproject.toml").write_text(f"[tool.ddpdoctor]\n{line}\n")
    (tmp_path / "t.py").write_text(AMP)
    result = lint(tmp_path, "--no-cache", "t.py")
    assert result.exit_code == 2
    assert "must be a positive number" in one_error_line(result.output)


# ----------------------------------------------------------------------------------- output file


@pytest.mark.parametrize(
    "target, reason",
    [("missing/report.json", "No such file or directory"), ("/dev/full", "No space left on device")],
)
def test_an_unwritable_output_file_is_a_one_line_error(tmp_path: Path, target: str, reason: str) -> None:
    (tmp_path / "t.py").write_text(AMP)
    result = lint(tmp_path, "--no-cache", "--format", "json", "-o", target, "t.py")
    assert result.exit_code == 2
    assert one_error_line(result.output) == f"ddpdoctor: error: cannot write the report to {target}: {reason}"


def test_an_output_file_in_a_read_only_folder_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text(AMP)
    (tmp_path / "out").mkdir()
    if IS_ROOT:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(tmp_path / "out")]).returncode:
            pytest.skip("cannot make a folder read-only for root here")
    else:
        (tmp_path / "out").chmod(0o555)
    try:
        result = lint(tmp_path, "--no-cache", "-o", "out/report.txt", "t.py")
    finally:
        if IS_ROOT:
            subprocess.run(["chattr", "-i", str(tmp_path / "out")])
        (tmp_path / "out").chmod(0o755)
    assert result.exit_code == 2
    assert "cannot write the report to out/report.txt" in one_error_line(result.output)


# ------------------------------------------------------------------------- names and odd files


@pytest.mark.parametrize("fmt", ["text", "json", "sarif", "github"])
def test_a_file_name_that_is_not_utf8_is_reported_in_every_format(tmp_path: Path, fmt: str) -> None:
    name = os.fsdecode(b"bad\xff.py")
    (tmp_path / name).write_text(AMP)
    completed = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "lint", "--no-cache", "--select", "AMP001", "--format", fmt, "."],
        cwd=tmp_path, capture_output=True, timeout=60, env={**os.environ, "LC_ALL": "C.UTF-8"},
    )
    assert completed.returncode == 1, completed.stderr
    assert completed.stderr == b""
    if fmt == "json":
        assert json.loads(completed.stdout)[0]["path"] == name  # valid UTF-8 JSON, name intact
        assert os.fsencode(json.loads(completed.stdout)[0]["path"]) == b"bad\xff.py"
    elif fmt == "sarif":
        location = json.loads(completed.stdout)["runs"][0]["results"][0]["locations"][0]["physicalLocation"]
        assert location["artifactLocation"]["uri"].endswith("bad%FF.py")
    else:
        assert b"bad\xff.py" in completed.stdout


def test_a_file_name_with_a_newline_cannot_split_or_forge_a_text_finding(tmp_path: Path) -> None:
    name = "x\nforged.py:1:1: DDP001 fake\x1b[2K.py"
    (tmp_path / name).write_text(AMP)
    completed = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "lint", "--no-cache", "--select", "AMP001", "."],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert completed.returncode == 1, completed.stderr
    finding, summary = completed.stdout.splitlines()
    assert finding.startswith("x\\nforged.py:1:1: DDP001 fake\\x1b[2K.py:2:10: AMP001 ")
    assert summary.startswith("Found 1 problem")


def test_fifos_in_a_folder_are_never_opened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.py")
    (tmp_path / "t.py").write_text(AMP)
    run, _ = lint_paths([str(tmp_path)], Settings(select=("AMP001",)), use_cache=False)
    assert [Path(r.path).name for r in run.files] == ["t.py"]


def test_a_fifo_or_device_named_explicitly_is_a_one_line_error(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.py")
    for name in ("pipe.py", "/dev/null"):
        completed = subprocess.run(
            [sys.executable, "-m", "ddpdoctor", "lint", "--no-cache", name],
            cwd=tmp_path, capture_output=True, text=True, timeout=60,
        )
        assert completed.returncode == 2
        assert completed.stderr == f"ddpdoctor: error: {name}: not a regular file or folder (a FIFO, socket or device?)\n"


def test_a_fifo_in_the_cache_folder_does_not_hang(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text(AMP)
    settings = Settings(select=("AMP001",))
    first, _ = lint_paths([str(tmp_path / "t.py")], settings, cache_root=tmp_path)
    cache_files = list((tmp_path / ".ddpdoctor_cache").glob("*.json"))
    assert len(cache_files) == 1
    cache_files[0].unlink()
    os.mkfifo(cache_files[0])
    (tmp_path / ".ddpdoctor_cache" / ".gitignore").unlink()
    os.mkfifo(tmp_path / ".ddpdoctor_cache" / ".gitignore")
    completed = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "lint", "--select", "AMP001", "t.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert completed.returncode == 1 and "t.py:2:10: AMP001" in completed.stdout, completed.stderr


def test_an_unreadable_sub_folder_is_a_warning_not_silently_skipped(tmp_path: Path) -> None:
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "hidden.py").write_text(AMP)
    (tmp_path / "t.py").write_text(AMP)
    (tmp_path / "locked").chmod(0)
    command = [sys.executable, "-m", "ddpdoctor", "lint", "--no-cache", "--select", "AMP001", "."]
    if IS_ROOT:  # root reads any folder unless it gives up the capabilities that let it
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv is needed to drop root's DAC capabilities")
        command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--", *command]
    try:
        completed = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    finally:
        (tmp_path / "locked").chmod(0o755)
    assert completed.returncode == 1, completed.stderr
    assert completed.stderr == "ddpdoctor: warning: cannot read ./locked: Permission denied; skipped\n"
    assert "t.py:2:10: AMP001" in completed.stdout


# ------------------------------------------------------------------------------------------ cache


def _cache_with(tmp_path: Path, mangle: "object") -> list[str]:
    """Lint once to fill the cache, let `mangle` edit the cache's JSON, lint again."""
    (tmp_path / "t.py").write_text(AMP)
    settings = Settings(select=("AMP001",))
    lint_paths([str(tmp_path / "t.py")], settings, cache_root=tmp_path)
    (cache_file,) = (tmp_path / ".ddpdoctor_cache").glob("*.json")
    cache_file.write_text(mangle(cache_file.read_text()))  # type: ignore[operator]
    run, _ = lint_paths([str(tmp_path / "t.py")], settings, cache_root=tmp_path)
    assert len(run.files) == 1
    return [f"{f.line} {f.code}" + (" cached" if run.files[0].cached else "") for f in run.findings]


def _entry(text: str, change: "object") -> str:
    data = json.loads(text)
    for value in data.values():
        change(value)  # type: ignore[operator]
    return json.dumps(data)


@pytest.mark.parametrize(
    "mangle",
    [
        lambda text: "[" * 100_000 + "]" * 100_000,
        lambda text: json.dumps({"x": 1}),
        lambda text: json.dumps([1, 2]),
        lambda text: _entry(text, lambda v: v.__setitem__(1, {"a": 1})),
        lambda text: _entry(text, lambda v: v[1][0].__setitem__("line", 999)),
        lambda text: _entry(text, lambda v: v[1][0].update(line=3, end_line=2)),
        lambda text: _entry(text, lambda v: v[1][0].__setitem__("code", "XYZ123")),
        lambda text: _entry(text, lambda v: v[1][0].__setitem__("code", "DDP002")),
        lambda text: _entry(text, lambda v: v[1][0].update(code="DDP002", name="syncbn-after-ddp")),
        lambda text: _entry(text, lambda v: v[1][0].__setitem__("line", "2")),
        lambda text: _entry(text, lambda v: v[1][0].__setitem__("severity", "fatal")),
        lambda text: _entry(text, lambda v: v.append("extra")),
        lambda text: _entry(text, lambda v: v[1][0]["fix"]["edits"][0].__setitem__("column", 0)),
        lambda text: _entry(text, lambda v: v[1][0]["fix"]["edits"][0].__setitem__("end_line", 5)),
        lambda text: _entry(text, lambda v: v[1][0]["fix"]["edits"][0].__setitem__("content", 7)),
    ],
    ids=[
        "deep-nesting", "wrong-entry-shape", "not-an-object", "findings-not-a-list", "impossible-line",
        "line-after-end", "unknown-code", "code-not-selected", "code-and-name-not-selected", "line-not-int", "bad-severity", "extra-field",
        "fix-column-zero", "fix-past-the-end", "fix-content-not-text",
    ],
)
def test_a_corrupted_cache_entry_is_a_miss(tmp_path: Path, mangle: "object") -> None:
    assert _cache_with(tmp_path, mangle) == ["2 AMP001"]


def test_an_intact_cache_entry_is_a_hit(tmp_path: Path) -> None:
    assert _cache_with(tmp_path, lambda text: text) == ["2 AMP001 cached"]


def test_a_file_with_old_mac_line_endings_is_a_cache_hit(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_bytes(b"import torch\r\r\rscaler = torch.cuda.amp.GradScaler()\r")
    settings = Settings(select=("AMP001",))
    lint_paths([str(tmp_path / "t.py")], settings, cache_root=tmp_path)
    run, _ = lint_paths([str(tmp_path / "t.py")], settings, cache_root=tmp_path)
    assert [(f.line, f.code) for f in run.findings] == [(4, "AMP001")] and run.files[0].cached


def test_cache_get_rejects_a_finding_for_a_line_the_file_does_not_have(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path, "k")
    (tmp_path / "t.py").write_text(AMP)
    run, _ = lint_paths([str(tmp_path / "t.py")], Settings(select=("AMP001",)), use_cache=False)
    cache.put(str(tmp_path / "t.py"), "d", run.findings)
    assert cache.get(str(tmp_path / "t.py"), "d", frozenset({"AMP001"}), 2) is not None
    assert cache.get(str(tmp_path / "t.py"), "d", frozenset({"AMP001"}), 1) is None


# ---------------------------------------------------------------- empty selection, closed streams


@pytest.mark.parametrize("value", ["", " ", ",", " , "])
def test_an_empty_select_is_a_usage_error_not_every_rule_off(tmp_path: Path, value: str) -> None:
    (tmp_path / "t.py").write_text(AMP)
    result = lint(tmp_path, "--no-cache", "--select", value, "t.py")
    assert result.exit_code == 2
    assert one_error_line(result.output) == (
        "ddpdoctor: error: --select needs at least one rule code or prefix (ALL for every rule)"
    )


def test_a_select_of_one_code_still_works_beside_the_empty_check(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text(AMP)
    result = lint(tmp_path, "--no-cache", "--select", "AMP001,", "t.py")
    assert result.exit_code == 1 and "AMP001" in result.output


def _ddpdoctor(args: list[str], cwd: Path, **kwargs: "object") -> "subprocess.CompletedProcess[str]":
    return subprocess.run(
        [sys.executable, "-m", "ddpdoctor", *args], cwd=cwd, capture_output=True, text=True, timeout=120, **kwargs  # type: ignore[call-overload]
    )


def _one_line_on_stderr(completed: "subprocess.CompletedProcess[str]") -> str:
    lines = completed.stderr.splitlines()
    assert len(lines) == 1, completed.stderr
    assert "internal error" not in lines[0] and "Traceback" not in completed.stderr
    return lines[0]


def test_lint_of_a_closed_standard_input_is_a_one_line_error(tmp_path: Path) -> None:
    completed = _ddpdoctor(["lint", "-"], tmp_path, stdin=None, preexec_fn=lambda: os.close(0))
    assert completed.returncode == 2
    assert _one_line_on_stderr(completed) == "ddpdoctor: error: cannot read standard input: it is closed"


needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")


@needs_dev_full
@pytest.mark.parametrize(
    "args",
    [
        ["lint", "--no-cache", "t.py"],
        ["lint", "--no-cache", "--format", "json", "t.py"],
        ["lint", "--no-cache", "--extend-select", "AMP001", "--diff", "t.py"],
        ["rules"],
        ["explain", "DDP001"],
    ],
    ids=["text", "json", "diff", "rules", "explain"],
)
def test_output_to_a_full_device_is_a_one_line_error(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "t.py").write_text(AMP)
    with open("/dev/full", "w") as full:
        completed = subprocess.run(
            [sys.executable, "-m", "ddpdoctor", *args], cwd=tmp_path, stdout=full, stderr=subprocess.PIPE,
            text=True, timeout=120,
        )
    assert completed.returncode == 2
    assert _one_line_on_stderr(completed) == "ddpdoctor: error: cannot write to standard output: No space left on device"


@needs_dev_full
def test_the_fixed_source_of_standard_input_to_a_full_device_is_a_one_line_error(tmp_path: Path) -> None:
    with open("/dev/full", "w") as full:
        completed = subprocess.run(
            [sys.executable, "-m", "ddpdoctor", "lint", "--extend-select", "AMP001", "--fix", "-"], cwd=tmp_path,
            input=AMP, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120,
        )
    assert completed.returncode == 2
    assert completed.stderr.splitlines()[-1] == "ddpdoctor: error: cannot write to standard output: No space left on device"
    assert "Traceback" not in completed.stderr and "internal error" not in completed.stderr


def test_lint_with_standard_output_closed_does_not_fail(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text(AMP)
    completed = _ddpdoctor(["lint", "--no-cache", "--extend-select", "AMP001", "t.py"], tmp_path, preexec_fn=lambda: os.close(1))
    assert completed.returncode == 1  # the findings decide, as when the report is read
    assert completed.stderr == ""
