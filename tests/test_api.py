"""The documented Python API: `from ddpdoctor import lint_paths, lint_source, Finding`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import ddpdoctor
from ddpdoctor import Finding, lint_paths, lint_source
from ddpdoctor.config import ConfigError
from ddpdoctor.lint.files import PathError

ROOT = Path(__file__).resolve().parent.parent
BUGGY = (ROOT / "examples" / "buggy_train.py").read_text(encoding="utf-8")
AMP = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"


def test_import_ddpdoctor_imports_neither_libcst_nor_torch() -> None:
    code = (
        "import sys, ddpdoctor\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('libcst', 'torch', 'rich', 'click'))\n"
        "print(heavy, sorted(m for m in sys.modules if m.startswith('ddpdoctor')))\n"
        "ddpdoctor.lint_source('x = 1\\n')\n"
        "print('libcst' in sys.modules, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[] ['ddpdoctor']", "True False"]


def test_the_public_names_are_exported_and_typed() -> None:
    assert set(ddpdoctor.__all__) == {"Finding", "__version__", "lint_paths", "lint_source"}
    assert {"Finding", "lint_paths", "lint_source"} <= set(dir(ddpdoctor))
    assert Finding is __import__("ddpdoctor.findings", fromlist=["Finding"]).Finding
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ddpdoctor.nope  # noqa: B018


def test_lint_source_returns_the_findings_sorted() -> None:
    findings = lint_source(BUGGY, "train.py")
    assert [(f.code, f.path, f.line, f.column) for f in findings] == [
        ("DDP001", "train.py", 33, 31),
        ("DDP008", "train.py", 39, 5),
    ]
    assert all(isinstance(f, Finding) for f in findings)
    assert findings[0].fix is not None and findings[0].fix.applicable


def test_lint_source_selection_works_as_on_the_command_line() -> None:
    assert lint_source(AMP, "t.py") == []  # AMP001 is off by default
    assert [f.code for f in lint_source(AMP, "t.py", extend_select=["AMP001"])] == ["AMP001"]
    assert [f.code for f in lint_source(BUGGY, "t.py", select=["DDP008"])] == ["DDP008"]
    assert [f.code for f in lint_source(BUGGY, "t.py", ignore=["DDP00"])] == []
    with pytest.raises(ConfigError, match="unknown rule code or prefix 'NOPE'"):
        lint_source(AMP, select=["NOPE"])
    with pytest.raises(ValueError):  # ConfigError is a ValueError
        lint_source(AMP, ignore=["NOPE"])


def test_lint_source_bad_input_is_a_finding_not_an_exception() -> None:
    findings = lint_source(b"import torch.distributed as dist\nx = '\xff'\n", "t.py")
    assert [(f.code, f.line) for f in findings] == [("DDP999", 2)]


def test_lint_paths_finds_files_in_folders_and_reads_the_configuration(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.ddpdoctor]\nignore = ["DDP008"]\n')
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text(BUGGY)
    (tmp_path / "amp.py").write_text(AMP)
    findings = lint_paths([tmp_path])
    assert [(Path(f.path).relative_to(tmp_path).as_posix(), f.code) for f in findings] == [("pkg/train.py", "DDP001")]
    assert [f.code for f in lint_paths([tmp_path], config=False)] == ["DDP001", "DDP008"]
    assert [f.code for f in lint_paths([tmp_path], extend_select=["AMP"])] == ["AMP001", "DDP001"]
    assert [f.code for f in lint_paths([tmp_path], select=["DDP008"])] == ["DDP008"]
    other = tmp_path / "other.toml"
    other.write_text('[tool.ddpdoctor]\nselect = ["AMP001"]\n')
    assert [f.code for f in lint_paths([tmp_path], config=other)] == ["AMP001"]
    assert not (tmp_path / ".ddpdoctor_cache").exists()  # a library call leaves no cache behind


def test_lint_paths_follows_project_imports(tmp_path: Path) -> None:
    (tmp_path / "ckpt.py").write_text("import torch\n\ndef save(model, path):\n    torch.save(model.state_dict(), path)\n")
    (tmp_path / "main.py").write_text(
        "import torch.distributed as dist\nfrom ckpt import save\n\n"
        "dist.init_process_group('gloo')\nmodel = object()\nsave(model, 'm.pt')\n"
    )
    findings = lint_paths([tmp_path / "main.py"], config=False)
    assert [(Path(f.path).name, f.code, f.line) for f in findings] == [("main.py", "DDP008", 6)]


def test_lint_paths_errors(tmp_path: Path) -> None:
    with pytest.raises(PathError, match="no such file or directory"):
        lint_paths([tmp_path / "missing.py"])
    (tmp_path / "pyproject.toml").write_text('[tool.ddpdoctor]\nselect = ["DDPX"]\n')
    (tmp_path / "t.py").write_text(AMP)
    with pytest.raises(ConfigError, match="pyproject.toml: 'select': unknown rule code"):
        lint_paths([tmp_path / "t.py"])


def test_lint_source_of_a_notebook_names_the_cell() -> None:
    notebook = (ROOT / "fixtures" / "notebooks" / "ddp_train.ipynb").read_text(encoding="utf-8")
    assert [(f.cell, f.line, f.code) for f in lint_source(notebook, "nb.ipynb")] == [(6, 3, "DDP001"), (7, 4, "DDP008")]
    assert lint_source(notebook, "nb.ipynb")[0].to_dict()["cell"] == 6
    assert "cell" not in lint_source(BUGGY, "train.py")[0].to_dict()


def test_a_notebook_that_is_not_one_is_a_finding_not_silence(tmp_path: Path) -> None:
    (found,) = lint_source("{not json", "nb.ipynb")
    assert (found.code, found.path, found.message) == ("DDP999", "nb.ipynb", "nb.ipynb: not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2")
    (tmp_path / "nb.ipynb").write_text("[]")
    (found,) = lint_paths([tmp_path], config=False)
    assert found.code == "DDP999" and "not a Jupyter notebook" in found.message
