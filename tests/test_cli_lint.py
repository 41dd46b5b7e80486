"""`ddpdoctor lint` end to end: exit codes, options, configuration, suppression, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpdoctor.cli import main

BUGGY = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
model = DDP(Net().cuda(), device_ids=[dist.get_rank() % torch.cuda.device_count()])
model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
"""

CLEAN = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
local_rank = dist.get_rank() % torch.cuda.device_count()
torch.cuda.set_device(local_rank)
model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(Net().cuda())
model = DDP(model, device_ids=[local_rank])
"""


def run(args: list[str], cwd: Path, stdin: bytes | None = None) -> "CliRunnerResult":
    runner = CliRunner()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return runner.invoke(main, args, input=stdin, catch_exceptions=False)
    finally:
        os.chdir(old)


CliRunnerResult = object


# BUGGY's DDP002 is an info rule, off by default: the project turns it on in its configuration, which is
# also how a user keeps the documented order on a code base that must run on PyTorch before 1.9.
SELECTS_DDP002 = '[tool.ddpdoctor]\nextend-select = ["DDP002"]\n'


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text(SELECTS_DDP002)
    (tmp_path / "train.py").write_text(BUGGY)
    (tmp_path / "clean.py").write_text(CLEAN)
    return tmp_path


def test_finding_is_reported_with_position_and_exit_1(project: Path) -> None:
    result = run(["lint", "train.py"], project)
    assert result.exit_code == 1
    first = result.output.splitlines()[0]
    assert first.startswith("train.py:8:9: DDP002 ")
    assert "wrapped at line 7" in first
    assert "Found 1 problem (1 info) in 1 file." in result.output


def test_clean_file_exits_0_and_quiet_prints_nothing(project: Path) -> None:
    result = run(["lint", "clean.py"], project)
    assert result.exit_code == 0, result.output
    assert "All checks passed" in result.output
    quiet = run(["lint", "-q", "clean.py"], project)
    assert quiet.exit_code == 0 and quiet.output == ""


def test_folder_recursion_skips_virtualenvs_and_caches(project: Path) -> None:
    venv = project / ".venv" / "lib"
    venv.mkdir(parents=True)
    (venv / "bad.py").write_text(BUGGY)
    other_env = project / "env"
    other_env.mkdir()
    (other_env / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (other_env / "bad.py").write_text(BUGGY)
    (project / "__pycache__").mkdir()
    (project / "__pycache__" / "bad.py").write_text(BUGGY)
    (project / "pkg").mkdir()
    (project / "pkg" / "deep.py").write_text(BUGGY)
    result = run(["lint", "--format", "json", "--no-cache", "."], project)
    paths = sorted({f["path"] for f in json.loads(result.output)})
    assert paths == ["pkg/deep.py", "train.py"]  # as ruff prints them, not ./train.py


def test_exit_zero_keeps_findings_but_exits_0(project: Path) -> None:
    result = run(["lint", "--exit-zero", "train.py"], project)
    assert result.exit_code == 0
    assert "DDP002" in result.output


def test_select_ignore_and_unknown_codes(project: Path) -> None:
    assert run(["lint", "--ignore", "DDP002", "train.py"], project).exit_code == 0
    assert run(["lint", "--ignore", "DDP", "train.py"], project).exit_code == 0
    assert run(["lint", "--select", "DDP999", "train.py"], project).exit_code == 0
    assert run(["lint", "--select", "DDP999", "--extend-select", "DDP002", "train.py"], project).exit_code == 1
    assert run(["lint", "--select", "ALL", "train.py"], project).exit_code == 1
    bad = run(["lint", "--ignore", "DDP0O2", "train.py"], project)
    assert bad.exit_code == 2
    assert "unknown rule code or prefix 'DDP0O2'" in bad.output
    assert "Traceback" not in bad.output


def test_missing_path_is_a_one_line_error_exit_2(project: Path) -> None:
    result = run(["lint", "nope.py"], project)
    assert result.exit_code == 2
    assert result.output.strip() == "ddpdoctor: error: nope.py: no such file or directory"


def test_directory_without_python_files_warns_and_exits_0(project: Path) -> None:
    (project / "docs").mkdir()
    (project / "docs" / "index.md").write_text("# docs\n")
    result = run(["lint", "docs"], project)
    assert result.exit_code == 0
    assert "no Python files found in docs" in result.output


@pytest.mark.parametrize("fmt", ["json", "sarif", "github"])
def test_machine_formats(project: Path, fmt: str) -> None:
    result = run(["lint", "--format", fmt, "train.py"], project)
    assert result.exit_code == 1
    if fmt == "json":
        payload = json.loads(result.output)
        assert payload[0]["code"] == "DDP002" and payload[0]["line"] == 8 and payload[0]["column"] == 9
        assert payload[0]["end_line"] == 8 and payload[0]["severity"] == "info"
        # DDP002 carries its fix: the conversion moves into the wrap.
        assert payload[0]["fix"]["applicable"] is True
        assert payload[0]["fix"]["description"] == "convert before wrapping: `torch.nn.SyncBatchNorm.convert_sync_batchnorm(Net().cuda())`"
    elif fmt == "sarif":
        payload = json.loads(result.output)
        assert payload["version"] == "2.1.0"
        assert payload["runs"][0]["results"][0]["ruleId"] == "DDP002"
    else:
        assert result.output.startswith("::notice file=train.py,line=8,col=9,")


def test_output_file_and_statistics(project: Path) -> None:
    result = run(["lint", "--format", "json", "--output-file", "out.json", "train.py"], project)
    assert result.exit_code == 1
    assert json.loads((project / "out.json").read_text())[0]["code"] == "DDP002"
    stats = run(["lint", "--statistics", "train.py"], project)
    assert "DDP002" in stats.output and "syncbn-after-ddp" in stats.output


def test_stdin_with_filename(project: Path) -> None:
    result = run(["lint", "-", "--stdin-filename", "scripts/train.py"], project, stdin=BUGGY.encode())
    assert result.exit_code == 1
    assert result.output.startswith("scripts/train.py:8:9: DDP002")
    plain = run(["lint", "-"], project, stdin=CLEAN.encode())
    assert plain.exit_code == 0


def test_inline_suppression(project: Path) -> None:
    lines = BUGGY.splitlines()
    for comment, expected in [
        ("  # ddpdoctor: ignore[DDP002]", 0),
        ("  # ddpdoctor: ignore", 0),
        ("  # noqa: DDP002", 0),
        ("  # noqa: E501, DDP002", 0),
        ("  # ddpdoctor: ignore[DDP001]", 1),
        ("  # noqa", 1),  # a bare noqa is for other linters
    ]:
        patched = "\n".join(lines[:7] + [lines[7] + comment]) + "\n"
        (project / "s.py").write_text(patched)
        assert run(["lint", "--no-cache", "s.py"], project).exit_code == expected, comment


def test_pyproject_configuration(project: Path) -> None:
    (project / "pyproject.toml").write_text('[tool.ddpdoctor]\nignore = ["DDP002"]\n')
    assert run(["lint", "train.py"], project).exit_code == 0
    # The command line overrides the configuration.
    assert run(["lint", "--select", "DDP002", "train.py"], project).exit_code == 1


def test_config_per_file_ignores_and_exclude(project: Path) -> None:
    (project / "ddpdoctor.toml").write_text(
        'extend-select = ["DDP002"]\nexclude = ["legacy"]\n[per-file-ignores]\n"tests/*" = ["DDP002"]\n'
    )
    for folder in ("legacy", "tests"):
        (project / folder).mkdir()
        (project / folder / "t.py").write_text(BUGGY)
    result = run(["lint", "--format", "json", "--no-cache", "."], project)
    paths = {f["path"] for f in json.loads(result.output)}
    assert paths == {"train.py"}


def test_config_errors_are_one_line(project: Path) -> None:
    (project / "pyproject.toml").write_text('[tool.ddpdoctor]\nselct = ["DDP002"]\n')
    result = run(["lint", "train.py"], project)
    assert result.exit_code == 2
    assert "unknown key 'selct'" in result.output and "Traceback" not in result.output
    (project / "pyproject.toml").write_text('[tool.ddpdoctor]\nignore = ["XYZ9"]\n')
    result = run(["lint", "train.py"], project)
    assert result.exit_code == 2 and "'XYZ9'" in result.output
    (project / "pyproject.toml").write_text("[tool.ddpdoctor\n")
    result = run(["lint", "train.py"], project)
    assert result.exit_code == 2 and "invalid TOML" in result.output


def test_world_size_validation(project: Path) -> None:
    result = run(["lint", "--world-size", "0", "train.py"], project)
    assert result.exit_code == 2


# ------------------------------------------------------------------------------------- bad input


def lint_json(project: Path, *paths: str) -> tuple[int, list[dict]]:
    result = run(["lint", "--format", "json", "--no-cache", "--select", "ALL", *paths], project)
    return result.exit_code, json.loads(result.output) if result.output.strip().startswith("[") else []


def test_syntax_error_is_ddp999_and_other_files_still_linted(project: Path) -> None:
    (project / "broken.py").write_text(
        "import torch.nn as nn\n\ndef main(:\n    return nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
    )
    code, findings = lint_json(project, "broken.py", "train.py")
    assert code == 1
    by_code = {f["code"]: f for f in findings}
    assert by_code["DDP999"]["path"] == "broken.py"
    assert by_code["DDP999"]["line"] == 3 and by_code["DDP999"]["column"] == 10
    assert "DDP002" in by_code


def test_undecodable_file_is_ddp999_at_the_bad_byte(project: Path) -> None:
    (project / "latin.py").write_bytes(b"import torch.distributed as dist\nname = '\xe9t\xe9'\n")
    code, findings = lint_json(project, "latin.py")
    assert code == 1
    assert [(f["code"], f["line"], f["column"]) for f in findings] == [("DDP999", 2, 9)]
    assert "utf-8" in findings[0]["message"]
    # An editor or a SARIF viewer marks the bad byte itself: the region ends where it starts.
    assert (findings[0]["end_line"], findings[0]["end_column"]) == (2, 9)


def test_declared_encoding_is_honoured(project: Path) -> None:
    (project / "latin.py").write_bytes(
        b"# -*- coding: latin-1 -*-\nimport torch.distributed as dist\nname = '\xe9t\xe9'\n"
    )
    assert lint_json(project, "latin.py") == (0, [])


def test_binary_file_is_ddp999_not_a_crash(project: Path) -> None:
    (project / "weights.py").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    code, findings = lint_json(project, "weights.py")
    assert code == 1 and findings[0]["code"] == "DDP999" and "NUL bytes" in findings[0]["message"]


def test_empty_file_bom_and_crlf(project: Path) -> None:
    (project / "empty.py").write_bytes(b"")
    (project / "bom.py").write_bytes(b"\xef\xbb\xbf" + BUGGY.encode())
    (project / "crlf.py").write_bytes(BUGGY.replace("\n", "\r\n").encode())
    code, findings = lint_json(project, "empty.py", "bom.py", "crlf.py")
    assert code == 1
    assert sorted((f["path"], f["code"], f["line"], f["column"]) for f in findings) == [
        ("bom.py", "DDP002", 8, 9),
        ("crlf.py", "DDP002", 8, 9),
    ]


def test_twenty_thousand_line_file(project: Path) -> None:
    body = "".join(f"def helper_{i}(x):\n    return x + {i}\n\n" for i in range(6700))
    (project / "big.py").write_text(BUGGY + body)
    assert len((project / "big.py").read_text().splitlines()) > 20000
    code, findings = lint_json(project, "big.py")
    assert code == 1 and [f["line"] for f in findings] == [8]


def test_unreadable_file_is_exit_2(project: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root can read any file")
    target = project / "secret.py"
    target.write_text(BUGGY)
    target.chmod(0)
    assert run(["lint", "secret.py"], project).exit_code == 2


# ---------------------------------------------------------------------------------- cache, jobs


def test_cache_is_reused_and_invalidated_by_content(project: Path) -> None:
    first = run(["lint", "--format", "json", "train.py"], project)
    cache_files = list((project / ".ddpdoctor_cache").glob("*.json"))
    assert len(cache_files) == 1
    entries = json.loads(cache_files[0].read_text())
    assert any(k.endswith("train.py") for k in entries)
    second = run(["lint", "--format", "json", "train.py"], project)
    assert first.output == second.output
    (project / "train.py").write_text(CLEAN)
    assert run(["lint", "train.py"], project).exit_code == 0


def test_cache_is_keyed_by_configuration(project: Path) -> None:
    assert run(["lint", "train.py"], project).exit_code == 1
    assert run(["lint", "--ignore", "DDP002", "train.py"], project).exit_code == 0
    assert run(["lint", "train.py"], project).exit_code == 1


def test_cache_is_keyed_by_the_linters_own_code(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An editable install whose rules changed keeps its version: results cached by the old code must
    not be served, and the old code's file is removed when the new one is written."""
    from ddpdoctor.lint import cache

    assert run(["lint", "train.py"], project).exit_code == 1
    (old,) = (project / ".ddpdoctor_cache").glob("*.json")
    # Forge the old code's entry: a clean result for the buggy file. Served only while the stamp holds.
    entries = json.loads(old.read_text())
    for entry in entries.values():
        entry[1] = []
    old.write_text(json.dumps(entries))
    assert run(["lint", "train.py"], project).exit_code == 0
    monkeypatch.setitem(cache._stamps, cache._PACKAGE_DIR, "another-code")
    assert run(["lint", "train.py"], project).exit_code == 1
    (new,) = (project / ".ddpdoctor_cache").glob("*.json")
    assert new != old and "-another-code-" in new.name


def test_code_stamp_follows_each_module_of_the_package(tmp_path: Path) -> None:
    from ddpdoctor.lint import cache

    package = tmp_path / "pkg"
    (package / "lint" / "rules").mkdir(parents=True)
    (package / "guard").mkdir()
    module = package / "lint" / "rules" / "rule.py"
    module.write_text("x = 1\n")
    (package / "notes.txt").write_text("not code")
    (package / "findings.py").write_text("y = 1\n")
    (package / "guard" / "run.py").write_text("z = 1\n")
    first = cache.code_stamp(package)
    os.utime(package / "guard" / "run.py", ns=(1, 1))
    cache._stamps.clear()
    assert cache.code_stamp(package) == first  # the guard's code does not change a lint result
    os.utime(package / "findings.py", ns=(1, 1))
    cache._stamps.clear()
    assert cache.code_stamp(package) != first  # a top-level module does
    cache._stamps.clear()
    first = cache.code_stamp(package)
    assert cache.code_stamp(package) == first  # once per process
    cache._stamps.clear()
    assert cache.code_stamp(package) == first  # the same code, the same stamp
    (package / "notes.txt").write_text("other words")
    cache._stamps.clear()
    assert cache.code_stamp(package) == first  # only modules count
    os.utime(module, ns=(1, 1))
    cache._stamps.clear()
    assert cache.code_stamp(package) != first
    cache._stamps.clear()
    touched = cache.code_stamp(package)
    module.write_text("x = 22\n")
    os.utime(module, ns=(1, 1))
    cache._stamps.clear()
    assert cache.code_stamp(package) != touched  # same time, another size


def test_no_cache_writes_nothing(project: Path) -> None:
    run(["lint", "--no-cache", "train.py"], project)
    assert not (project / ".ddpdoctor_cache").exists()


def test_parallel_workers_agree_with_one_worker(project: Path) -> None:
    for i in range(40):
        (project / f"copy_{i:02d}.py").write_text(BUGGY if i % 2 else CLEAN)
    one = run(["lint", "--format", "json", "--no-cache", "-j", "1", "."], project)
    many = run(["lint", "--format", "json", "--no-cache", "-j", "2", "."], project)
    assert json.loads(one.output) == json.loads(many.output)
    assert len(json.loads(one.output)) == 21


# ------------------------------------------------------------------------------- the real binary


def test_installed_entry_point_and_module_run(project: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "lint", "--no-cache", "train.py"],
        cwd=project, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 1
    assert "DDP002" in result.stdout and "\x1b[" not in result.stdout  # piped: no colour
    version = subprocess.run([sys.executable, "-m", "ddpdoctor", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("ddpdoctor ")


def test_linting_never_imports_torch_or_runs_the_script(project: Path) -> None:
    (project / "evil.py").write_text(
        "import torch.distributed as dist\nopen('PWNED', 'w').write('x')\nraise SystemExit(3)\n"
    )
    code = (
        "import sys\n"
        "from ddpdoctor.cli import main\n"
        "try:\n    main(['lint', '--no-cache', 'evil.py', 'train.py'])\n"
        "except SystemExit as e:\n    rc = e.code\n"
        "assert 'torch' not in sys.modules, 'the linter imported torch'\n"
        "sys.exit(rc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert not (project / "PWNED").exists()


# ----------------------------------------------------------------------------------- --fix/--diff

AMP_SOURCE = """\
import torch


def train(model, loader, optimizer, criterion):
    scaler = torch.cuda.amp.GradScaler()
    for images, target in loader:
        with torch.cuda.amp.autocast():
            loss = criterion(model(images), target)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
"""


def test_fix_rewrites_atomically_and_a_second_run_changes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "amp.py"
    target.write_bytes(AMP_SOURCE.replace("\n", "\r\n").encode())
    target.chmod(0o640)
    result = run(["lint", "--select", "AMP001", "--fix", "amp.py"], tmp_path)
    assert result.exit_code == 0, result.output
    fixed = target.read_bytes().decode()
    assert 'torch.amp.GradScaler("cuda")' in fixed and 'torch.autocast("cuda")' in fixed
    assert "\r\n" in fixed and "\n" not in fixed.replace("\r\n", "")  # line endings kept
    assert (target.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".ddpdoctor_cache")) == ["amp.py"]
    again = run(["lint", "--select", "AMP001", "--fix", "amp.py"], tmp_path)
    assert again.exit_code == 0
    assert target.read_bytes().decode() == fixed


def test_diff_shows_the_fix_and_writes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "amp.py"
    target.write_text(AMP_SOURCE)
    result = run(["lint", "--select", "AMP001", "--diff", "amp.py"], tmp_path)
    assert result.exit_code == 1
    assert "-    scaler = torch.cuda.amp.GradScaler()" in result.output
    assert '+    scaler = torch.amp.GradScaler("cuda")' in result.output
    assert target.read_text() == AMP_SOURCE


def test_fix_on_stdin_prints_the_fixed_source(tmp_path: Path) -> None:
    result = run(["lint", "--select", "AMP001", "--fix", "-"], tmp_path, stdin=AMP_SOURCE.encode())
    assert result.exit_code == 0
    assert 'torch.autocast("cuda")' in result.output
    assert "torch.cuda.amp" not in result.output


def test_a_cached_result_on_a_terminal_still_shows_its_code_frame(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    first = run(["lint", "--select", "DDP002", "train.py"], project)
    second = run(["lint", "--select", "DDP002", "train.py"], project)  # from the cache: the file is read again
    frame = "model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)"
    assert frame in first.output and frame in second.output  # type: ignore[attr-defined]


CIFAR_PROJECT = Path(__file__).resolve().parent.parent / "fixtures/projects/cifar_sampler_in_data_module"


def test_stdin_is_placed_in_its_project(tmp_path: Path) -> None:
    """An editor pipes the buffer of train.py: its loaders and step live in data.py and engine.py on
    disk, and the finding that needs them is the one linting the path gives."""
    for name in ("data.py", "engine.py", "train.py"):
        (tmp_path / name).write_text((CIFAR_PROJECT / name).read_text())
    by_path = run(["lint", "--no-cache", "--format", "json", "train.py"], tmp_path)
    piped = run(["lint", "--format", "json", "-", "--stdin-filename", "train.py"], tmp_path,
                stdin=(tmp_path / "train.py").read_bytes())
    assert by_path.exit_code == piped.exit_code == 1
    assert by_path.output == piped.output and '"DDP001"' in piped.output
    # The buffer, not the file on disk, is what gets linted (the user's unsaved edit reseeds the sampler).
    edited = (tmp_path / "train.py").read_text().replace(
        "        for images, labels in train_loader:", "        train_loader.sampler.set_epoch(epoch)\n        for images, labels in train_loader:"
    )
    assert run(["lint", "-", "--stdin-filename", "train.py"], tmp_path, stdin=edited.encode()).exit_code == 0


def test_the_cache_asks_once_per_run_whether_a_shared_dependency_changed(tmp_path: Path) -> None:
    from ddpdoctor.lint.cache import ResultCache

    cache = ResultCache(tmp_path, "key")
    shared = {str(tmp_path / "utils.py"): "digest-u", str(tmp_path / "data.py"): None}
    for name in ("a.py", "b.py", "c.py"):
        cache.put(str(tmp_path / name), "d-" + name, [], shared)
    asked: list[tuple[str, object]] = []

    def unchanged(path: str, state: object) -> bool:
        asked.append((path, state))
        return Path(path).name != "data.py"

    for name in ("a.py", "b.py", "c.py"):  # data.py changed: every entry that read it is a miss
        assert cache.get(str(tmp_path / name), "d-" + name, frozenset(), 1, unchanged) is None
    assert sorted(Path(p).name for p, _ in asked) == ["data.py", "utils.py"]  # each once, not once per entry
