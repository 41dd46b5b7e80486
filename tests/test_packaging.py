"""Packaging: the linter alone never pulls torch in, and the wheel ships the rule catalog."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from importlib.metadata import requires
from pathlib import Path

import pytest

from ddpdoctor.catalog import load_catalog

ROOT = Path(__file__).resolve().parent.parent


def test_core_dependencies_do_not_include_torch() -> None:
    requirements = requires("ddpdoctor") or []
    core = [r for r in requirements if "extra ==" not in r]
    names = {r.split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower() for r in core}
    assert names == {"libcst", "click", "rich"}
    probe = [r for r in requirements if "probe" in r.split(";")[-1]]
    assert any(r.startswith("torch") for r in probe)
    assert any(r.startswith("nvidia-ml-py") for r in probe)
    assert any(r.startswith("numpy") for r in probe)


def test_cli_import_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import ddpdoctor.cli\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))\n"
        "assert 'pynvml' not in sys.modules\n"
        "import click\n"
        "print(sorted(ddpdoctor.cli.main.list_commands(click.Context(ddpdoctor.cli.main))))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for command in ("lint", "rules", "explain", "probe", "env", "guard"):
        assert f"'{command}'" in result.stdout


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_linting_a_file_off_a_terminal_imports_only_what_it_needs(tmp_path: Path, fmt: str) -> None:
    # Start-up is most of the time pre-commit spends on one changed file: no rich (only a terminal's
    # colours need it), no optional command's package, no worker pool for one file, never torch.
    (tmp_path / "train.py").write_text("import torch.distributed as dist\ndist.init_process_group('nccl')\n")
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['ddpdoctor', 'lint', '--no-cache', '--format', '{fmt}', 'train.py']\n"
        "try:\n"
        "    runpy.run_module('ddpdoctor', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = ('rich', 'torch', 'ddpdoctor.probe', 'ddpdoctor.env', 'ddpdoctor.guard', 'multiprocessing', 'difflib')\n"
        "print('IMPORTED', sorted(m for m in sys.modules if m.split('.')[0] in heavy or m.startswith(heavy)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "IMPORTED []" in result.stdout, result.stdout


@pytest.mark.slow
def test_wheel_ships_the_catalog(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    wheel = next(tmp_path.glob("ddpdoctor-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "unpacked")
    source_pages = sorted(p.name for p in (ROOT / "rules").glob("*.md"))
    assert source_pages
    for page in source_pages:
        assert f"ddpdoctor/_catalog/{page}" in names
    shipped = load_catalog(str(tmp_path / "unpacked" / "ddpdoctor" / "_catalog"))
    assert set(shipped) == set(load_catalog())
    assert not any(n.startswith(("tests/", "fixtures/")) for n in names)
    # The guard's bootstrap, which `ddpdoctor guard` puts on the ranks' PYTHONPATH.
    assert "ddpdoctor/guard/bootstrap/sitecustomize.py" in names


@pytest.mark.slow
def test_installing_the_linter_alone_resolves_no_torch(tmp_path: Path) -> None:
    """What pip would install for `pip install ddpdoctor` (as pre-commit does): never torch."""
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", str(report), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    import json

    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert {"ddpdoctor", "libcst", "click", "rich"} <= names
    assert not names & {"torch", "nvidia-ml-py", "numpy"}, names
