"""The engine's project plumbing: one ProjectSources per run, findings only for the named files, and
a cache that knows which project modules each file's analysis read.

Until the analysis layer follows imports (issue 10), `following_imports` stands in for it on top of
the real engine and cache: it reads every module the linted file imports, transitively, through the
run's ProjectSources, exactly as the analysis will.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from ddpdoctor.config import Settings
from ddpdoctor.lint import engine
from ddpdoctor.lint.analysis.imports import ProjectSources
from ddpdoctor.lint.engine import lint_paths

SCRIPT = """import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
{imports}


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    model = DDP(torch.nn.Linear(2, 2).cuda())
    save_checkpoint(model.state_dict(), "last.pt")


if __name__ == "__main__":
    main()
"""
HELPER = """import torch
import torch.distributed as dist


def save_checkpoint(state, path):
    {body}
"""


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


@pytest.fixture
def projects(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ProjectSources]]:
    """Stand in for an analysis that follows imports; collect the run's ProjectSources."""
    seen: list[ProjectSources] = []
    real = engine._analyse

    def following_imports(module: Any, path: str, world_size: Optional[int], project: Optional[ProjectSources]) -> Any:
        assert project is not None
        if project not in seen:
            seen.append(project)
        todo, done = [Path(path)], set()
        while todo:
            current = todo.pop()
            if current not in done:
                done.add(current)
                todo.extend(project.imported_modules(current))
        return real(module, path, world_size, project)

    monkeypatch.setattr(engine, "_analyse", following_imports)
    yield seen


def lint(paths: list[Path], root: Path, use_cache: bool = True) -> engine.RunResult:
    run, _ = lint_paths([str(p) for p in paths], Settings(select=("ALL",)), jobs=1, use_cache=use_cache, cache_root=root)
    assert not run.errors
    return run


def cached(run: engine.RunResult) -> dict[str, bool]:
    return {Path(r.path).name: r.cached for r in run.files}


def test_editing_an_imported_module_re_analyses_the_importer(tmp_path: Path, projects: list[ProjectSources]) -> None:
    write(
        tmp_path,
        {
            "main.py": SCRIPT.format(imports="from utils.checkpoint import save_checkpoint"),
            "utils/__init__.py": "",
            "utils/checkpoint.py": HELPER.format(body="torch.save(state, path)"),
        },
    )
    main = tmp_path / "main.py"
    first = lint([main], tmp_path)
    assert cached(first) == {"main.py": False}
    depends = first.files[0].depends
    assert depends[str(tmp_path / "utils/checkpoint.py")]  # a content digest
    assert depends[str(tmp_path / "utils/__init__.py")] is not None
    assert depends[str(tmp_path / "utils/checkpoint/__init__.py")] is None  # looked for, absent
    assert str(main) not in depends  # its own content is the cache key already
    assert cached(lint([main], tmp_path)) == {"main.py": True}

    (tmp_path / "utils/checkpoint.py").write_text(HELPER.format(body="if dist.get_rank() == 0:\n        torch.save(state, path)"))
    assert cached(lint([main], tmp_path)) == {"main.py": False}
    assert cached(lint([main], tmp_path)) == {"main.py": True}


def test_a_module_appearing_where_an_import_looked_re_analyses_the_importer(
    tmp_path: Path, projects: list[ProjectSources]
) -> None:
    write(tmp_path, {"main.py": SCRIPT.format(imports="from helpers import save_checkpoint"), "lib/helpers.py": HELPER.format(body="pass")})
    (tmp_path / "pyproject.toml").write_text("")
    main = tmp_path / "main.py"
    lint([main, tmp_path / "lib"], tmp_path)
    assert cached(lint([main, tmp_path / "lib"], tmp_path))["main.py"] is True
    (tmp_path / "helpers.py").write_text(HELPER.format(body="pass"))
    assert cached(lint([main, tmp_path / "lib"], tmp_path))["main.py"] is False


def test_unrelated_edit_keeps_the_cache(tmp_path: Path, projects: list[ProjectSources]) -> None:
    write(tmp_path, {"main.py": SCRIPT.format(imports="from helpers import save_checkpoint"), "helpers.py": HELPER.format(body="pass"), "other.py": "x = 1\n"})
    main = tmp_path / "main.py"
    lint([main], tmp_path)
    (tmp_path / "other.py").write_text("x = 2\n")
    assert cached(lint([main], tmp_path)) == {"main.py": True}


def test_linting_one_file_of_a_thousand_file_project_reads_only_what_it_imports(
    tmp_path: Path, projects: list[ProjectSources]
) -> None:
    files = {
        "proj/__init__.py": "",
        "proj/train.py": SCRIPT.format(imports="from proj.m1 import save_checkpoint\nfrom . import m2"),
    }
    files.update({f"proj/m{i}.py": HELPER.format(body="pass") + (f"from .m{i + 100} import g\n" if i < 3 else "") for i in range(1, 1000)})
    write(tmp_path, files)
    run = lint([tmp_path / "proj/train.py"], tmp_path, use_cache=False)
    assert [Path(r.path).name for r in run.files] == ["train.py"]
    assert len(projects) == 1
    expected = {tmp_path / f"proj/{n}.py" for n in ("train", "__init__", "m1", "m2", "m101", "m102")}
    assert projects[0].files_read() == expected


def test_each_run_gets_a_fresh_project(tmp_path: Path, projects: list[ProjectSources]) -> None:
    write(tmp_path, {"main.py": SCRIPT.format(imports="from helpers import save_checkpoint"), "helpers.py": HELPER.format(body="pass")})
    lint([tmp_path / "main.py"], tmp_path, use_cache=False)
    lint([tmp_path / "main.py"], tmp_path, use_cache=False)
    assert len(projects) == 2 and projects[0] is not projects[1]


def analysed_with_projects(monkeypatch: pytest.MonkeyPatch) -> list[ProjectSources]:
    """The real analysis, watched: the list fills with the run's ProjectSources, once per analysed file."""
    seen: list[ProjectSources] = []
    real = engine._analyse

    def spy(module: Any, path: str, world_size: Optional[int], project: Optional[ProjectSources]) -> Any:
        assert project is not None
        seen.append(project)
        return real(module, path, world_size, project)

    monkeypatch.setattr(engine, "_analyse", spy)
    return seen


def test_the_real_analysis_reads_nothing_beyond_the_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the analysis layer follows, a run over one file never wanders into the rest."""
    seen = analysed_with_projects(monkeypatch)
    files = {"proj/__init__.py": "", "proj/train.py": SCRIPT.format(imports="from proj.m1 import save_checkpoint")}
    files.update({f"proj/m{i}.py": HELPER.format(body="torch.save(state, path)") for i in range(1, 300)})
    write(tmp_path, files)
    lint([tmp_path / "proj/train.py"], tmp_path, use_cache=False)
    assert seen and seen[0].files_read() <= {tmp_path / "proj/train.py", tmp_path / "proj/__init__.py", tmp_path / "proj/m1.py"}


def test_findings_are_kept_for_the_named_file_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An analysis that follows imports may see a problem in an imported module; the run over
    main.py reports main.py's findings only (the imported module gets its own when it is named)."""
    from ddpdoctor.findings import Finding, Severity

    class SeesBothFiles:
        code = "DDP008"
        trigger_words = ("torch",)
        context_words = ()

        def __init__(self, model: Any) -> None:
            self.path = model.path

        def run(self) -> list[Finding]:
            def at(path: str) -> Finding:
                return Finding(code="DDP008", name="x", severity=Severity.WARNING, message="m", path=path,
                               line=1, column=1, end_line=1, end_column=2)

            return [at(self.path), at(str(tmp_path / "helpers.py"))]

    write(tmp_path, {"main.py": SCRIPT.format(imports="from helpers import save_checkpoint"), "helpers.py": HELPER.format(body="pass")})
    monkeypatch.setattr(engine, "_selected_rules", lambda codes: [SeesBothFiles])
    run = lint([tmp_path / "main.py"], tmp_path, use_cache=False)
    assert [(Path(f.path).name, f.code) for f in run.findings] == [("main.py", "DDP008")]


def test_worker_processes_record_dependencies_too(tmp_path: Path, projects: list[ProjectSources]) -> None:
    count = engine.PARALLEL_THRESHOLD + 2
    files = {f"job{i}.py": SCRIPT.format(imports="from helpers import save_checkpoint") for i in range(count)}
    files["helpers.py"] = HELPER.format(body="pass")
    write(tmp_path, files)
    scripts = [tmp_path / f"job{i}.py" for i in range(count)]

    def run() -> engine.RunResult:
        result, _ = lint_paths([str(p) for p in scripts], Settings(select=("ALL",)), jobs=2, cache_root=tmp_path)
        return result

    first = run()
    assert all(str(tmp_path / "helpers.py") in r.depends for r in first.files)
    assert all(r.cached for r in run().files)
    (tmp_path / "helpers.py").write_text(HELPER.format(body="return None"))
    assert not any(r.cached for r in run().files)


def test_real_analysis_cached_finding_follows_an_edit_of_the_imported_helper(tmp_path: Path) -> None:
    """End to end, no stand-in: the unguarded call is reported in main.py; guarding the save inside
    utils/checkpoint.py clears it on the next (cached) run, and unguarding brings it back."""
    unguarded = HELPER.format(body="torch.save(state, path)")
    guarded = HELPER.format(body="if dist.get_rank() == 0:\n        torch.save(state, path)")
    write(
        tmp_path,
        {
            "main.py": SCRIPT.format(imports="from utils.checkpoint import save_checkpoint"),
            "utils/__init__.py": "",
            "utils/checkpoint.py": unguarded,
        },
    )
    main = tmp_path / "main.py"

    def findings() -> list[tuple[str, int, str]]:
        run = lint([main], tmp_path)
        return [(Path(f.path).name, f.line, f.code) for f in run.findings if f.code == "DDP008"]

    assert findings() == [("main.py", 13, "DDP008")]
    (tmp_path / "utils/checkpoint.py").write_text(guarded)
    assert findings() == []
    (tmp_path / "utils/checkpoint.py").write_text(unguarded)
    assert findings() == [("main.py", 13, "DDP008")]


CIFAR = Path(__file__).resolve().parent.parent / "fixtures/projects/cifar_sampler_in_data_module"


def test_a_comment_naming_a_sampler_changes_nothing(tmp_path: Path) -> None:
    """The issue's three-module CIFAR project: the pre-filter reads the import closure, so the
    finding does not hinge on a `# sampler = None` comment that only fed the old byte test."""
    for name in ("data.py", "engine.py", "train.py"):
        (tmp_path / name).write_text((CIFAR / name).read_text())
    plain = lint([tmp_path / "train.py"], tmp_path, use_cache=False).findings
    text = (tmp_path / "train.py").read_text()
    (tmp_path / "train.py").write_text(text.replace("def main():", "# sampler = None\ndef main():"))
    commented = lint([tmp_path / "train.py"], tmp_path, use_cache=False).findings
    assert [(f.code, f.line) for f in plain] == [("DDP001", 24)]
    assert [(f.code, f.line) for f in commented] == [("DDP001", 25)]


def test_a_module_gaining_the_api_re_analyses_a_file_the_pre_filter_skipped(tmp_path: Path) -> None:
    for name in ("data.py", "engine.py", "train.py"):
        (tmp_path / name).write_text((CIFAR / name).read_text())
    data = (tmp_path / "data.py").read_text()
    unsampled = data.replace("sampler=DistributedSampler(train_set)", "shuffle=True").replace(
        "DistributedSampler", "RandomSampler"
    )
    (tmp_path / "data.py").write_text(unsampled)
    train = tmp_path / "train.py"

    def lint_ddp001() -> engine.RunResult:
        run, _ = lint_paths([str(train)], Settings(select=("DDP001",)), jobs=1, cache_root=tmp_path)
        return run

    first = lint_ddp001()
    assert first.findings == [] and not first.files[0].parsed
    assert str(tmp_path / "data.py") in first.files[0].depends  # the pre-filter read it
    assert cached(lint_ddp001()) == {"train.py": True}
    (tmp_path / "data.py").write_text(data)
    again = lint_ddp001()
    assert cached(again) == {"train.py": False}
    assert [f.code for f in again.findings] == ["DDP001"]


def test_a_file_an_earlier_import_parsed_is_not_parsed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`__init__.py` re-exports `core` with a star, so its analysis parses core.py; when core.py's own
    turn comes, the tree parsed from the same bytes is used. Each file is parsed once per run."""
    write(
        tmp_path,
        {
            "pkg/__init__.py": "import torch.distributed as dist\nfrom .core import *\n\ndist.init_process_group('gloo')\nsave()\n",
            "pkg/core.py": "import torch\nimport torch.distributed as dist\n\n\ndef save():\n    dist.barrier()\n",
        },
    )
    import libcst

    parsed: list[str] = []
    real_parse = libcst.parse_module

    def counting(text: str, *args: Any, **kwargs: Any) -> Any:
        parsed.append(text)
        return real_parse(text, *args, **kwargs)

    monkeypatch.setattr(libcst, "parse_module", counting)
    run = lint([tmp_path / "pkg/__init__.py", tmp_path / "pkg/core.py"], tmp_path, use_cache=False)
    assert sorted(r.path for r in run.files if r.parsed) == sorted([str(tmp_path / "pkg/__init__.py"), str(tmp_path / "pkg/core.py")])
    assert len(parsed) == 2
    assert parsed.count((tmp_path / "pkg/core.py").read_text()) == 1


AMP_SCRIPT = """import torch
from torch.cuda.amp import GradScaler

from helpers import clip

scaler = GradScaler()


def step(model, loss, optimizer):
    {backward}
    clip(model)
    scaler.step(optimizer)
    scaler.update()
"""
AMP_HELPER = """import torch


def clip(model):
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
"""


@pytest.mark.parametrize(
    ("backward", "reads_helper", "codes"),
    [
        ("scaler.scale(loss).backward()", True, ["AMP002"]),
        ("print(scaler.scale(loss))  # the rule's words, no scaled backward\n    loss.backward()", False, []),
    ],
)
def test_amp002_reads_a_helper_module_only_after_a_scaled_backward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backward: str, reads_helper: bool, codes: list[str]
) -> None:
    """Whether a called helper clips is asked of its module only where a scaled backward comes before
    the call: a file without one never parses its imports for this rule."""
    seen = analysed_with_projects(monkeypatch)
    write(tmp_path, {"train.py": AMP_SCRIPT.format(backward=backward), "helpers.py": AMP_HELPER})
    run, _ = lint_paths([str(tmp_path / "train.py")], Settings(select=("AMP002",)), jobs=1, use_cache=False)
    assert [f.code for r in run.files for f in r.findings] == codes
    assert (tmp_path / "helpers.py" in seen[0].files_read()) is reads_helper


TWO_NODE = CIFAR.parent / "global_rank_device_two_node_launch"


def test_a_launch_file_added_edited_or_removed_re_analyses_the_scripts_it_launches(tmp_path: Path) -> None:
    """The result cache depends on the launch files the analysis read and on the folders it listed
    for them: a multi-node launch script added after a first (cached) run names itself in DDP004's
    message on the next warm run; made single-node, DDP004 goes (a one-node job's global ranks are
    its local ranks); removed, the first message is back. A file that is no launch file changes nothing."""
    for name in ("dist_setup.py", "train.py", "pyproject.toml"):
        (tmp_path / name).write_text((TWO_NODE / name).read_text())
    train = tmp_path / "train.py"

    def ddp004() -> tuple[bool, list[str]]:
        run, _ = lint_paths([str(train)], Settings(select=("DDP004",)), jobs=1, cache_root=tmp_path)
        assert not run.errors
        return run.files[0].cached, [f.message for f in run.findings]

    cached_run, messages = ddp004()
    assert not cached_run and len(messages) == 2 and not any("launches it on" in m for m in messages)
    assert ddp004() == (True, messages)
    (tmp_path / "notes.py").write_text("x = 1\n")
    assert ddp004()[0] is True

    (tmp_path / "scripts").mkdir()
    launcher = tmp_path / "scripts" / "run_two_nodes.sh"
    launcher.write_text("torchrun --nnodes 2 --nproc-per-node 4 train.py\n")
    cached_run, spanning = ddp004()
    assert not cached_run and len(spanning) == 2
    assert all("scripts/run_two_nodes.sh line 1 launches it on 2 nodes" in m for m in spanning)
    assert ddp004() == (True, spanning)

    launcher.write_text("torchrun --nnodes 1 --nproc-per-node 4 train.py\n")
    assert ddp004() == (False, [])
    launcher.unlink()
    assert ddp004() == (False, messages)
