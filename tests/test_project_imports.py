"""ProjectSources: resolving the project's own imports, lazy memoised parsing, dependency records."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import libcst as cst
import pytest

from ddpdoctor.lint.analysis import imports
from ddpdoctor.lint.analysis.imports import ABSENT, EXISTS, MemoCycle, ProjectSources


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


@pytest.fixture
def package(tmp_path: Path) -> Path:
    write(
        tmp_path,
        {
            "train.py": "from pkg.engine import fit\n",
            "pkg/__init__.py": "",
            "pkg/engine.py": "from . import utils\nfrom .utils import save\nfrom ..outside import x\n",
            "pkg/utils.py": "import os\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/deep.py": "from .. import engine\nfrom ...pkg import utils\nimport pkg.utils\n",
        },
    )
    return tmp_path


def test_relative_imports_by_level(package: Path) -> None:
    project = ProjectSources([package])
    deep = package / "pkg/sub/deep.py"
    engine = package / "pkg/engine.py"
    assert project.resolve(deep, None, 1) == package / "pkg/sub/__init__.py"
    assert project.resolve(deep, None, 2) == package / "pkg/__init__.py"
    assert project.resolve(deep, "engine", 2) == engine
    assert project.resolve(deep, "pkg.utils", 3) == package / "pkg/utils.py"
    assert project.resolve(engine, "utils", 1) == package / "pkg/utils.py"
    assert project.resolve(engine, "missing", 1) is None


def test_absolute_import_within_the_package_without_any_root(package: Path) -> None:
    """The importer's package top is a root by itself: `import pkg.utils` from pkg/sub/deep.py."""
    project = ProjectSources([])
    assert project.resolve(package / "pkg/sub/deep.py", "pkg.utils", 0) == package / "pkg/utils.py"
    assert project.resolve(package / "train.py", "pkg.engine", 0) == package / "pkg/engine.py"


def test_not_a_project_module(package: Path) -> None:
    project = ProjectSources([package])
    for name in ("os", "torch.distributed", "pkg.utils.os", "pkg.nothing", "nothing"):
        assert project.resolve(package / "train.py", name, 0) is None, name


def test_package_before_module_before_namespace(tmp_path: Path) -> None:
    write(tmp_path, {"a.py": "", "a/__init__.py": "", "b.py": "", "b/x.py": "", "ns/mod.py": ""})
    project = ProjectSources([tmp_path])
    importer = tmp_path / "main.py"
    assert project.resolve(importer, "a", 0) == tmp_path / "a/__init__.py"
    assert project.resolve(importer, "b", 0) == tmp_path / "b.py"
    # b.py is a module, not a package: b/x.py is unreachable as `b.x`.
    assert project.resolve(importer, "b.x", 0) is None
    # A namespace folder has no file of its own, but its modules resolve.
    assert project.resolve(importer, "ns", 0) is None
    assert project.resolve(importer, "ns.mod", 0) == tmp_path / "ns/mod.py"


def test_src_layout_and_pyproject_root_from_a_script_elsewhere(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "pyproject.toml": "[project]\nname = 'lib'\n",
            "src/lib/__init__.py": "",
            "src/lib/train.py": "",
            "scripts/run.py": "from lib.train import main\n",
            "configs/defaults.py": "",
        },
    )
    script = tmp_path / "scripts/run.py"
    project = ProjectSources.for_paths([script])
    assert tmp_path / "src" in project.roots and tmp_path in project.roots
    assert project.resolve(script, "lib.train", 0) == tmp_path / "src/lib/train.py"
    assert project.resolve(script, "configs.defaults", 0) == tmp_path / "configs/defaults.py"
    # Without the roots for_paths finds, the script's own folder does not hold them.
    assert ProjectSources([]).resolve(script, "lib.train", 0) is None


def test_for_paths_takes_the_linted_folder_and_the_package_top(package: Path) -> None:
    project = ProjectSources.for_paths([package / "pkg/sub/deep.py", package])
    assert package / "pkg/sub" in project.roots
    assert package in project.roots


def test_star_import_resolves_its_module(tmp_path: Path) -> None:
    write(tmp_path, {"pkg/__init__.py": "", "pkg/common.py": "", "pkg/main.py": "from .common import *\n"})
    project = ProjectSources([])
    main = tmp_path / "pkg/main.py"
    assert project.resolve(main, "common", 1) == tmp_path / "pkg/common.py"
    assert project.imported_modules(main) == [tmp_path / "pkg/common.py"]


def test_imported_modules_sees_submodules_names_and_nested_imports(package: Path) -> None:
    write(package, {"pkg/late.py": "def f():\n    if True:\n        from pkg import utils\n    return 1\n"})
    project = ProjectSources([package])
    assert project.imported_modules(package / "pkg/engine.py") == [
        package / "pkg/__init__.py",
        package / "pkg/utils.py",
    ]
    assert project.imported_modules(package / "pkg/late.py") == [package / "pkg/__init__.py", package / "pkg/utils.py"]


def test_import_cycle_is_walked_once(tmp_path: Path) -> None:
    write(tmp_path, {"a.py": "import b\n", "b.py": "import a\n"})
    project = ProjectSources([tmp_path])
    seen: list[Path] = []
    todo = [tmp_path / "a.py"]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.append(current)
        todo.extend(project.imported_modules(current))
    assert seen == [tmp_path / "a.py", tmp_path / "b.py"]
    assert project.parse(tmp_path / "a.py") is project.parse(tmp_path / "a.py")


@pytest.mark.parametrize(
    "name, content",
    [
        ("binary.py", b"\x7fELF\x00\x00\x01"),
        ("broken.py", b"def f(:\n"),
        ("latin.py", b"# -*- coding: nonsense -*-\nx = 1\n"),
        ("bad_utf8.py", b"x = '\xff'\n"),
        ("notes.txt", b"x = 1\n"),
    ],
)
def test_unreadable_modules_are_none_never_an_exception(tmp_path: Path, name: str, content: bytes) -> None:
    (tmp_path / name).write_bytes(content)
    assert ProjectSources([tmp_path]).parse(tmp_path / name) is None


def test_a_folder_named_like_a_module_and_a_missing_file(tmp_path: Path) -> None:
    (tmp_path / "weird.py").mkdir()
    project = ProjectSources([tmp_path])
    assert project.resolve(tmp_path / "main.py", "weird", 0) is None
    assert project.parse(tmp_path / "weird.py") is None
    assert project.parse(tmp_path / "gone.py") is None


def test_too_large_is_not_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imports, "MAX_BYTES", 10)
    (tmp_path / "big.py").write_text("x = 1\ny = 2\nz = 3\n")
    (tmp_path / "small.py").write_text("x = 1\n")
    project = ProjectSources([tmp_path])
    assert project.parse(tmp_path / "big.py") is None
    assert isinstance(project.parse(tmp_path / "small.py"), cst.Module)


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="needs POSIX permissions, not root")
def test_unreadable_file(tmp_path: Path) -> None:
    secret = tmp_path / "secret.py"
    secret.write_text("x = 1\n")
    secret.chmod(0)
    try:
        assert ProjectSources([tmp_path]).parse(secret) is None
    finally:
        secret.chmod(0o644)


@pytest.mark.parametrize(
    "module, level",
    [
        ("a..b", 0), ("", 0), (None, 0), ("x", 400), ("1abc", 0), ("x", -1),
        ("a" * 300, 0),  # longer than a file name may be: the file system refuses to look it up
    ],
)
def test_odd_requests_are_none(tmp_path: Path, module: str, level: int) -> None:
    assert ProjectSources([tmp_path]).resolve(tmp_path / "nowhere/main.py", module, level) is None


def test_parse_is_memoised_and_reads_are_recorded_per_scope(package: Path) -> None:
    project = ProjectSources([package])
    utils = package / "pkg/utils.py"
    with project.scope():
        first = project.parse(utils)
        assert project.files_read() == {utils}
    with project.scope():
        assert project.files_read() == frozenset()
        assert project.parse(utils) is first
        assert project.files_read() == {utils}
    assert project.files_read() == {utils}


def test_memo_replays_what_its_computation_read(package: Path) -> None:
    """The second file that gets a memoised model of utils.py depends on utils.py just as much."""
    project = ProjectSources([package])
    utils = package / "pkg/utils.py"
    calls: list[int] = []

    def model() -> int:
        calls.append(1)
        project.parse(utils)
        return 42

    with project.scope():
        assert project.memo(("model", utils), model) == 42
    with project.scope():
        assert project.memo(("model", utils), model) == 42
        assert project.files_read() == {utils}
    assert calls == [1]


def test_memo_cycle_raises_its_own_error(tmp_path: Path) -> None:
    project = ProjectSources([tmp_path])

    def again() -> int:
        return project.memo("k", again)

    with pytest.raises(MemoCycle, match="'k' is being computed"):
        project.memo("k", again)
    # A failed computation is not memoised, and the key can be computed afterwards.
    assert project.memo("k", lambda: 3) == 3


def test_dependencies_record_absent_candidates_and_digests(tmp_path: Path) -> None:
    write(tmp_path, {"lib/helpers.py": "x = 1\n", "main.py": "from helpers import x\n"})
    project = ProjectSources([tmp_path / "lib"])
    with project.scope():
        found = project.resolve(tmp_path / "main.py", "helpers", 0)
        assert found == tmp_path / "lib/helpers.py"
        project.parse(found)
        deps = project.dependencies()
    # Creating helpers.py next to main.py would change what the import means.
    assert deps[tmp_path / "helpers.py"] is ABSENT
    assert deps[found] not in (ABSENT, EXISTS)
    assert deps[found] == project.digest_of(found)
    assert ProjectSources([]).digest_of(tmp_path / "helpers.py") is ABSENT
    (found).write_text("x = 2\n")
    assert ProjectSources([]).digest_of(found) != deps[found]


def test_provided_module_is_not_read_again(tmp_path: Path) -> None:
    path = tmp_path / "main.py"
    path.write_text("x = 1\n")
    module = cst.parse_module("x = 1\n")
    project = ProjectSources([tmp_path])
    project.provide(path, b"x = 1\n", module)
    path.unlink()
    assert project.parse(path) is module
    assert project.files_read() == {path}


def test_linting_one_file_of_a_thousand_reads_only_its_imports(tmp_path: Path) -> None:
    files = {"proj/__init__.py": "", "proj/train.py": "from proj.m1 import f\nfrom . import m2\n"}
    files.update({f"proj/m{i}.py": f"from .m{i + 100} import g\n" if i < 10 else "x = 1\n" for i in range(1, 1000)})
    write(tmp_path, files)
    project = ProjectSources.for_paths([tmp_path / "proj/train.py"])
    todo, seen = [tmp_path / "proj/train.py"], set()
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(project.imported_modules(current))
    expected = {tmp_path / f"proj/{name}.py" for name in ("train", "__init__", "m1", "m2", "m101", "m102")}
    assert seen == expected
    assert project.files_read() == expected


def test_parsed_modules_are_bounded_and_reparsed_after_eviction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imports, "MAX_MODULES", 2)
    for name in "abc":
        (tmp_path / f"{name}.py").write_text(f"{name} = 1\n")
    project = ProjectSources([tmp_path])
    first = project.parse(tmp_path / "a.py")
    assert project.parse(tmp_path / "a.py") is first  # kept while within the bound
    project.parse(tmp_path / "b.py")
    project.parse(tmp_path / "a.py")  # a is now the most recently used: c evicts b
    project.parse(tmp_path / "c.py")
    assert project.parse(tmp_path / "a.py") is first
    again = project.parse(tmp_path / "b.py")
    assert again is not None and again.code == "b = 1\n"
    assert project.files_read() == {tmp_path / f"{n}.py" for n in "abc"}


def test_unparsable_module_is_not_read_twice(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    project = ProjectSources([tmp_path])
    assert project.parse(broken) is None
    broken.write_text("x = 1\n")  # the run keeps what it saw first
    assert project.parse(broken) is None


def test_imports_in_every_kind_of_block_are_found(tmp_path: Path) -> None:
    names = [f"m{i}" for i in range(12)]
    write(tmp_path, {f"{n}.py": "" for n in names})
    write(
        tmp_path,
        {
            "main.py": (
                "try:\n    import m0\nexcept ImportError:\n    import m1\nelse:\n    import m2\nfinally:\n    import m3\n"
                "if a:\n    pass\nelif b:\n    import m4\nelse:\n    import m5\n"
                "for x in y:\n    pass\nelse:\n    import m6\n"
                "while z:\n    import m7\n"
                "with ctx():\n    import m8\n"
                "class C:\n    def f(self):\n        import m9\n"
                "if q: import m10\n"
                "async def g():\n    async with c:\n        import m11\n"
            )
        },
    )
    project = ProjectSources([tmp_path])
    assert project.imported_modules(tmp_path / "main.py") == [tmp_path / f"{n}.py" for n in names]


@pytest.mark.parametrize("marker", ["setup.py", "setup.cfg", ".git"])
def test_project_top_from_setup_files_or_the_repository(tmp_path: Path, marker: str) -> None:
    """guided-diffusion style: scripts/train.py imports the package beside scripts/, installed with
    `pip install -e .` from a setup.py (or a checkout's top, marked by .git)."""
    write(tmp_path, {"lib/__init__.py": "", "lib/dist.py": "", "scripts/train.py": "from lib import dist\n"})
    (tmp_path / marker).mkdir() if marker == ".git" else (tmp_path / marker).write_text("")
    script = tmp_path / "scripts/train.py"
    project = ProjectSources.for_paths([script])
    assert project.resolve(script, "lib.dist", 0) == tmp_path / "lib/dist.py"


def test_no_project_marker_means_no_extra_root(tmp_path: Path) -> None:
    write(tmp_path / "a", {"lib/__init__.py": "", "lib/dist.py": "", "scripts/train.py": ""})
    script = tmp_path / "a/scripts/train.py"
    assert ProjectSources.for_paths([script]).resolve(script, "lib.dist", 0) is None


def test_plain_import_is_absolute_not_relative_to_the_package(tmp_path: Path) -> None:
    write(tmp_path, {"helpers.py": "", "pkg/__init__.py": "", "pkg/helpers.py": "", "pkg/main.py": "import helpers\n"})
    project = ProjectSources([tmp_path])
    assert project.imported_modules(tmp_path / "pkg/main.py") == [tmp_path / "helpers.py"]


def test_a_too_large_dependency_has_the_digest_the_cache_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache compares digest_of (a fresh run) with what parse recorded: both read the same
    bytes, also for a file past the size limit."""
    monkeypatch.setattr(imports, "MAX_BYTES", 8)
    big = tmp_path / "big.py"
    big.write_text("x = 1\n" * 10)
    project = ProjectSources([tmp_path])
    with project.scope():
        assert project.parse(big) is None
        recorded = project.dependencies()[big]
    assert recorded == ProjectSources([tmp_path]).digest_of(big)
    big.write_text("x = 1\n" * 10 + "y = 2\n")  # a change past the limit is not seen, by design
    assert ProjectSources([tmp_path]).unchanged(big, recorded)
    big.write_text("z = 3\n" * 10)
    assert not ProjectSources([tmp_path]).unchanged(big, recorded)


def test_stubs_and_the_exact_size_limit_are_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "typed.pyi").write_text("def f() -> int: ...\n")
    exact = tmp_path / "exact.py"
    exact.write_text("x = 1\n")
    project = ProjectSources([tmp_path])
    assert project.parse(tmp_path / "typed.pyi") is not None
    monkeypatch.setattr(imports, "MAX_BYTES", len(exact.read_bytes()))
    assert project.parse(exact) is not None


def test_parsed_module_keeps_the_source_exactly(tmp_path: Path) -> None:
    """A byte-order mark is dropped (the tokenizer's encoding took care of it), nothing else."""
    (tmp_path / "bom.py").write_bytes(b"\xef\xbb\xbf\n\nx = 1\n")
    module = ProjectSources([tmp_path]).parse(tmp_path / "bom.py")
    assert module is not None and module.code == "\n\nx = 1\n"


def test_negative_level_and_namespace_package_relative_import(tmp_path: Path) -> None:
    write(tmp_path, {"x.py": "", "ns/mod.py": "", "ns/sub.py": ""})
    project = ProjectSources([tmp_path])
    assert project.resolve(tmp_path / "main.py", "x", -1) is None
    assert project.resolve(tmp_path / "ns/mod.py", None, 1) is None  # no __init__.py: no file
    assert project.resolve(tmp_path / "ns/mod.py", "sub", 1) == tmp_path / "ns/sub.py"


def test_names_from_a_package_and_imports_after_a_star(tmp_path: Path) -> None:
    write(tmp_path, {"lib/__init__.py": "", "lib/sub.py": "", "common.py": "", "other.py": "",
                     "main.py": "from common import *\nfrom lib import sub\nimport other\n"})
    project = ProjectSources([tmp_path])
    assert project.imported_modules(tmp_path / "main.py") == [
        tmp_path / "common.py", tmp_path / "lib/__init__.py", tmp_path / "lib/sub.py", tmp_path / "other.py",
    ]


@pytest.mark.parametrize("installed", ["site-packages", "dist-packages"])
def test_an_installed_package_follows_its_own_imports_not_its_neighbours(tmp_path: Path, installed: str) -> None:
    """Linting a file inside an installed package (torch's own sources): its package top is the
    installed-packages folder, which holds every library of the environment. Only the importer's own
    package is its project there; `import numpy` or `import other` is never read as a project module."""
    site = tmp_path / "lib" / installed
    write(
        site,
        {
            "pkg/__init__.py": "",
            "pkg/train.py": "import other\nimport pkg.helpers\nfrom other import thing\nimport lonely\n",
            "pkg/helpers.py": "",
            "other/__init__.py": "thing = 1\n",
            "lonely.py": "import other\n",
        },
    )
    project = ProjectSources.for_paths([site / "pkg" / "train.py"])
    train = site / "pkg" / "train.py"
    assert project.resolve(train, "pkg.helpers", 0) == site / "pkg" / "helpers.py"
    assert project.resolve(train, "other", 0) is None
    assert project.imported_modules(train) == [site / "pkg" / "helpers.py"]
    assert project.resolve(site / "lonely.py", "other", 0) is None  # a top-level module has no package there
    # The pre-filter's closure resolves by the same rule.
    assert project.closure_mentions(train, train.read_bytes(), frozenset({b"thing"}), lambda found: False) == frozenset()


def test_the_same_layout_in_an_ordinary_folder_is_one_project(tmp_path: Path) -> None:
    write(tmp_path, {"pkg/__init__.py": "", "pkg/train.py": "import other\n", "other/__init__.py": "thing = 1\n"})
    project = ProjectSources.for_paths([tmp_path / "pkg" / "train.py"])
    assert project.resolve(tmp_path / "pkg" / "train.py", "other", 0) == tmp_path / "other" / "__init__.py"


def test_parsed_already_only_for_the_very_bytes_it_parsed(tmp_path: Path) -> None:
    write(tmp_path, {"a.py": "x = 1\n"})
    project = ProjectSources([tmp_path])
    assert project.parsed_already(tmp_path / "a.py", b"x = 1\n") is None  # nothing parsed yet
    module = project.parse(tmp_path / "a.py")
    assert module is not None
    assert project.parsed_already(tmp_path / "a.py", b"x = 1\n") is module
    assert project.parsed_already(tmp_path / "a.py", b"x = 2\n") is None  # an editor's unsaved text
    assert project.parsed_already(tmp_path / "b.py", b"x = 1\n") is None


def test_absent_candidates_are_checked_from_folder_listings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm run asks about thousands of candidates an import did not find: a name missing from its
    folder's listing (or a folder missing from its parent's) is answered without opening anything,
    and a file that appeared since is seen."""
    write(tmp_path, {"pkg/__init__.py": "", "pkg/mod.py": ""})
    missing_in_folder = tmp_path / "pkg" / "gone.py"
    missing_folder = tmp_path / "pkg" / "mod" / "__init__.py"
    opened: list[str] = []
    real_open = open

    def spy(path: object, *args: object, **kwargs: object) -> object:
        opened.append(str(path))
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", spy)
    project = ProjectSources([tmp_path])
    assert project.unchanged(missing_in_folder, ABSENT)
    assert project.unchanged(str(missing_folder), ABSENT)
    assert not project.unchanged(tmp_path / "pkg" / "nothere.py", EXISTS)
    assert project.unchanged(tmp_path / "pkg" / "mod.py", EXISTS)
    assert opened == [str(tmp_path / "pkg" / "mod.py")]
    (tmp_path / "pkg" / "gone.py").write_text("")
    assert not ProjectSources([tmp_path]).unchanged(missing_in_folder, ABSENT)
    (tmp_path / "pkg" / "folder.py").mkdir()  # listed, but a folder: still no module there
    assert ProjectSources([tmp_path]).unchanged(tmp_path / "pkg" / "folder.py", ABSENT)


def test_each_folder_is_listed_once_per_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "", "pkg/b.py": ""})
    listed: list[str] = []
    real_listdir = os.listdir

    def counting(folder: str) -> list[str]:
        listed.append(folder)
        return real_listdir(folder)

    monkeypatch.setattr(imports.os, "listdir", counting)
    project = ProjectSources([tmp_path])
    for name in ("a.py", "b.py", "c.py", "a.py"):
        project.unchanged(tmp_path / "pkg" / name, ABSENT)
    assert listed.count(str(tmp_path / "pkg")) == 1


def test_a_folders_launch_listing_is_a_dependency_and_forgotten_with_a_launch_file(tmp_path: Path) -> None:
    from ddpdoctor.lint.analysis.imports import LISTING

    (tmp_path / "train.py").write_text("x = 1\n")
    (tmp_path / "conf").mkdir()
    project = ProjectSources([tmp_path])
    with project.scope():
        assert project.launch_listing(tmp_path) == ((), ("conf",))
        state = project.dependencies()[tmp_path]
    assert state is not None and state.startswith(LISTING)
    (tmp_path / "notes.py").write_text("y = 2\n")
    (tmp_path / ".hidden").mkdir()
    assert project.unchanged(tmp_path, state)  # no launch file, no folder a walk enters
    (tmp_path / "run.sh").write_text("torchrun --nnodes 2 train.py\n")
    assert not project.unchanged(tmp_path, state)
    assert project.launch_listing(tmp_path) == ((), ("conf",))  # listed once per run...
    project.forget(tmp_path / "run.sh")
    assert project.launch_listing(tmp_path) == (("run.sh",), ("conf",))  # ...until the editor says it changed
    assert not project.unchanged(tmp_path / "gone", state)
