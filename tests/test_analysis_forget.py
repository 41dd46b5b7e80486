"""ProjectSources.forget: what was read or worked out from a changed file goes, the rest stays warm
(the editor server lints each edit against one project view)."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.lint.analysis.imports import ProjectSources
from ddpdoctor.lsp.linting import DocumentLinter

SAVE = "import torch\n\ndef save(model, path):\n    torch.save(model.state_dict(), path)\n"
GUARDED = SAVE.replace("    torch.save", "    if torch.distributed.get_rank() == 0:\n        torch.save")
MAIN = "import torch.distributed as dist\nfrom ckpt import save\n\ndist.init_process_group('gloo')\nmodel = object()\nsave(model, 'm.pt')\n"


def test_forget_drops_the_file_and_what_read_it_and_keeps_the_rest(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 2\n")
    project = ProjectSources([tmp_path])
    a, b = project.parse(tmp_path / "a.py"), project.parse(tmp_path / "b.py")
    assert a is not None and b is not None
    from_a = project.memo(("model", tmp_path / "a.py"), lambda: project.parse(tmp_path / "a.py"))
    reads_a = project.memo(("other",), lambda: project.parse(tmp_path / "a.py"))
    from_b = project.memo(("model", tmp_path / "b.py"), lambda: project.parse(tmp_path / "b.py"))
    (tmp_path / "a.py").write_text("x = 3\n")
    project.forget(tmp_path / "a.py")
    again = project.parse(tmp_path / "a.py")
    assert again is not None and again.code == "x = 3\n"
    assert project.parse(tmp_path / "b.py") is b  # not parsed again
    assert project.memo(("model", tmp_path / "a.py"), lambda: "new") == "new" != from_a
    assert project.memo(("other",), lambda: "new") == "new" != reads_a
    assert project.memo(("model", tmp_path / "b.py"), lambda: "new") is from_b


def test_forget_of_a_file_never_read_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    project = ProjectSources([tmp_path])
    module = project.parse(tmp_path / "a.py")
    project.forget(tmp_path / "elsewhere.py")
    assert project.parse(tmp_path / "a.py") is module


def test_the_document_linter_sees_edits_and_saved_modules(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.ddpdoctor]\n")
    (tmp_path / "ckpt.py").write_text(SAVE)
    main = tmp_path / "main.py"
    linter = DocumentLinter()
    assert [(f.code, f.line) for f in linter.lint(main, MAIN).findings] == [("DDP008", 6)]  # main.py unsaved
    edited = MAIN.replace("save(model, 'm.pt')", "if dist.get_rank() == 0:\n    save(model, 'm.pt')")
    assert linter.lint(main, edited).findings == []
    assert [f.line for f in linter.lint(main, MAIN).findings] == [6]
    (tmp_path / "ckpt.py").write_text(GUARDED)
    assert [f.line for f in linter.lint(main, MAIN).findings] == [6]  # not saved-and-told yet: still warm
    linter.changed_on_disk(tmp_path / "ckpt.py")
    assert linter.lint(main, MAIN).findings == []


def test_the_document_linter_reads_the_configuration_again_when_it_is_saved(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.ddpdoctor]\n")
    (tmp_path / "ckpt.py").write_text(SAVE)
    main = tmp_path / "main.py"
    linter = DocumentLinter()
    assert [f.code for f in linter.lint(main, MAIN).findings] == ["DDP008"]
    (tmp_path / "pyproject.toml").write_text('[tool.ddpdoctor]\nignore = ["DDP008"]\n')
    linter.changed_on_disk(tmp_path / "pyproject.toml")
    assert linter.lint(main, MAIN).findings == []
    fixed = linter.lint(main, MAIN.replace("dist.init", "x = 1\ndist.init"), fix=True)
    assert fixed.fixed_source is None  # nothing selected, nothing to fix
