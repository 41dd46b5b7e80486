"""The project's own modules: import resolution and lazy, memoised parsing for one lint run.

A lint run names some files (pre-commit passes only the changed ones); their analysis may follow
imports into the rest of the project. Only what is asked for is read, and each module once: linting
one file of a thousand-file project reads that file's imports, not the project.

Resolution follows Python's own rules where they are decidable without running anything: relative
imports by level; absolute imports against the importer's package root, the importer's folder (a
script's `sys.path[0]`), the linted folder, the project's top (the nearest `pyproject.toml`,
`setup.py` or `setup.cfg`, else the repository's top) and its `src/`; a regular package
(`pkg/__init__.py`) before a module (`pkg.py`) before a namespace folder. It stops
where the answer depends on the run: `sys.path` edits, installed packages, import hooks. A module
that cannot be found is simply not a project module (None), never an error.

Every read is recorded against the analysis that asked for it (`scope()`), including reads replayed
from the memo, so the result cache can key a file on the content of the modules its analysis used.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tokenize
from collections import OrderedDict, deque
from io import BytesIO
from pathlib import Path
from typing import Callable, Hashable, Iterable, Iterator, Optional, Sequence, TypeVar, Union

import libcst as cst

T = TypeVar("T")

# Larger files are generated code (vendored tables, exported graphs), not training logic; parsing
# one would cost more than the whole lint of a typical project.
MAX_BYTES = 2 * 1024 * 1024
# How far up to look for a project's or a package's top.
MAX_WALK_UP = 32
# Parsed modules kept at once. A libcst tree takes ~20x its source in memory, and a run over a large
# tree provides every linted module: unbounded, 10,000 files would hold gigabytes. Past the bound the
# least recently used tree is dropped (its digest is kept) and re-parsed if asked for again.
MAX_MODULES = 256
# How many imports deep the pre-filter's closure goes: the analysis follows calls a few modules deep
# (summaries.EFFECT_DEPTH) and re-exports three (model.STAR_CHAIN_DEPTH), never the whole graph.
CLOSURE_DEPTH = 3

# Dependency states recorded per scope: a content digest, or one of these.
EXISTS = ""  # the file's existence mattered (a resolution hit), not its content
ABSENT = None  # a candidate file that must stay absent for the resolution to hold
LISTING = "ls:"  # prefix of a folder's state: a digest of the launch files and subfolders it lists
State = Optional[str]

# Which files are launch files (shell, SLURM, YAML/JSON, README, Makefile), by suffix or by name
# (any suffix), and which folders a walk for them skips. Here, below the launch-file reader, because
# a folder's listing of them is a dependency the result cache checks.
LAUNCH_SUFFIXES = frozenset(
    {".sh", ".bash", ".zsh", ".slurm", ".sbatch", ".job", ".pbs", ".yaml", ".yml", ".json", ".md", ".rst", ".txt",
     ".mk", ".cfg"}
)
LAUNCH_NAMES = ("makefile", "readme", "dockerfile", "justfile")
LAUNCH_SKIP_DIRS = frozenset(
    {".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".tox", ".nox", ".venv",
     "venv", "node_modules", "build", "dist", "site-packages", ".ddpdoctor_cache", ".ipynb_checkpoints", "wandb",
     "outputs", "logs", "data", "datasets", "checkpoints"}
)


def is_launch_file_name(name: str) -> bool:
    lowered = name.lower()
    return os.path.splitext(lowered)[1] in LAUNCH_SUFFIXES or lowered.startswith(LAUNCH_NAMES)


def _launch_listing(folder: Path) -> Optional[tuple[tuple[str, ...], tuple[str, ...]]]:
    """The launch files (by name) and the subfolders a walk for them enters, sorted; None when the
    folder cannot be listed."""
    files: list[str] = []
    folders: list[str] = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                if is_dir:
                    if entry.name not in LAUNCH_SKIP_DIRS and not entry.name.startswith("."):
                        folders.append(entry.name)
                elif is_launch_file_name(entry.name):
                    files.append(entry.name)
    except OSError:
        return None
    return tuple(sorted(files)), tuple(sorted(folders))


def _listing_state(listing: Optional[tuple[tuple[str, ...], tuple[str, ...]]]) -> State:
    if listing is None:
        return ABSENT
    files, folders = listing
    return LISTING + content_digest("\n".join(files).encode("utf-8", "surrogateescape") + b"\0" + "\n".join(folders).encode("utf-8", "surrogateescape"))


# An import statement as the pre-filter reads it from bytes: (relative level, module, names imported
# from it); `import a.b, c` is two statements with no names.
ImportStatement = tuple[int, str, tuple[str, ...]]


class MemoCycle(RuntimeError):
    """`memo(key, ...)` was asked for `key` while computing it (modules that import each other)."""


def content_digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _absolute(path: Union[str, Path]) -> Path:
    # abspath, not resolve(): symlinked checkouts keep the names the user sees, and no syscall.
    return Path(os.path.abspath(path))


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:
        return False


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False


def _package_top(directory: Path) -> Path:
    """The folder above the outermost package containing `directory` (itself if not a package)."""
    top = directory
    for _ in range(MAX_WALK_UP):
        if not _is_file(top / "__init__.py") or top.parent == top:
            break
        top = top.parent
    return top


# Folders of installed distributions: a search root there (the package top of a file inside an installed
# package) holds every library of the environment, none of them the project.
INSTALLED_PACKAGES_FOLDERS = frozenset({"site-packages", "dist-packages"})


def _admits(root: str, folder: str, first: str) -> bool:
    """Whether an absolute import of a module whose first name is `first`, from a file in `folder`, may
    resolve under `root`. Any root may, except an installed-packages folder: of what it holds only the
    importer's own package is its project (linting torch's sources follows torch's imports, never
    numpy's or matplotlib's, which would be parsed as if they were the project's own modules)."""
    if os.path.basename(root) not in INSTALLED_PACKAGES_FOLDERS:
        return True
    prefix = root.rstrip(os.sep) + os.sep
    return folder.startswith(prefix) and folder[len(prefix):].split(os.sep, 1)[0] == first


# What marks a project's top folder (the first found walking up), and a repository's top, where the
# walk stops (and which is the top itself when no marker was found below it).
PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg")


def _project_top(directory: Path, known: dict[Path, Optional[Path]]) -> Optional[Path]:
    """The nearest folder at or above `directory` with a project marker, else the repository's top
    (`.git`), else None; `known` memoises the answer for every folder walked through."""
    walked: list[Path] = []
    current = directory
    found: Optional[Path] = None
    for _ in range(MAX_WALK_UP):
        if current in known:
            found = known[current]
            break
        walked.append(current)
        if any(_is_file(current / marker) for marker in PROJECT_MARKERS) or os.path.exists(current / ".git"):
            found = current
            break
        if current.parent == current:
            break
        current = current.parent
    for folder in walked:
        known[folder] = found
    return found


class ProjectSources:
    """The project's own modules, read and parsed lazily, once each, for one lint run."""

    def __init__(self, roots: Sequence[Path]) -> None:
        self.roots: tuple[Path, ...] = tuple(dict.fromkeys(_absolute(r) for r in roots))
        self._modules: OrderedDict[Path, cst.Module] = OrderedDict()  # least recently used first
        self._unparsable: set[Path] = set()
        self._digests: dict[Path, str] = {}
        self._absent: set[Path] = set()  # digest_of's misses (many importers look for the same names)
        self._resolved: dict[tuple[Path, Optional[str], int], tuple[Optional[Path], dict[Path, State]]] = {}
        self._memo: dict[Hashable, tuple[object, dict[Path, State]]] = {}
        self._computing: set[Hashable] = set()
        self._scopes: list[dict[Path, State]] = [{}]
        # Per module, for the pre-filter: (the vocabulary asked about, the words of it found, the
        # project modules its import statements name). Facts, not bytes: a run over 10,000 files
        # keeps a few sets each.
        self._scanned: dict[Path, tuple[frozenset[bytes], frozenset[bytes], tuple[Path, ...]]] = {}
        self._tops: dict[Path, Optional[Path]] = {}
        self._listings: dict[str, frozenset[str]] = {}
        self._unlisted: set[str] = set()  # folders whose listing failed (absent, or not readable)
        self._package_tops: dict[Path, Path] = {}
        self._quick_resolved: dict[tuple[Path, Optional[str], int], Optional[Path]] = {}
        self._roots_for: dict[Path, tuple[str, ...]] = {}
        self._listings_of_launch: dict[Path, tuple[tuple[tuple[str, ...], tuple[str, ...]], State]] = {}

    @classmethod
    def for_paths(cls, paths: Sequence[Union[str, Path]]) -> "ProjectSources":
        """Roots for the named files and folders: each folder named, each file's folder and its
        package's top, the project's top (pyproject.toml, setup.py or setup.cfg, else the repository's
        top) and the `src/` beside it. Naming one file of a project then resolves its imports as
        naming the whole folder does."""
        # Strings until the folders are unique: pre-commit may name hundreds of files in a few folders.
        names: dict[str, None] = {}
        for raw in paths:
            try:
                path = os.path.abspath(raw)
                names[path if os.path.isdir(path) else os.path.dirname(path)] = None
            except (OSError, ValueError, TypeError):
                continue
        roots: list[Path] = []
        projects: dict[Path, Optional[Path]] = {}
        for folder in map(Path, names):
            roots.append(folder)
            roots.append(_package_top(folder))
            project = _project_top(folder, projects)
            if project is not None:
                roots.append(project)
                if _is_dir(project / "src"):
                    roots.append(project / "src")
        return cls(roots)

    # ---- dependency recording

    def _note(self, path: Path, state: State) -> None:
        scope = self._scopes[-1]
        # A parsed file's digest outranks "it exists" (both hold when a resolved file is then read).
        if path not in scope or state:
            scope[path] = state

    def _note_all(self, states: dict[Path, State]) -> None:
        for path, state in states.items():
            self._note(path, state)

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Record separately what the analysis inside the block reads (one linted file's); the
        reads still count for any enclosing scope."""
        self._scopes.append({})
        try:
            yield
        finally:
            inner = self._scopes.pop()
            self._note_all(inner)

    def files_read(self) -> frozenset[Path]:
        """The project files parsed for the current scope (the whole run outside any scope)."""
        return frozenset(p for p, state in self._scopes[-1].items() if state)

    def dependencies(self) -> dict[Path, State]:
        """Everything the current scope's results depend on: path -> content digest, EXISTS for a
        file found by resolution, ABSENT for a candidate that was looked for and missing."""
        return dict(self._scopes[-1])

    def unchanged(self, path: Union[str, Path], state: State) -> bool:
        """Whether a dependency recorded as `state` (in an earlier run) still holds now.

        Most dependencies are candidates an import looked for and did not find (a warm run over
        torch/nn and torch/utils asks about 2,200 of them): a name missing from its folder's listing
        (one listing per folder per run) is answered without trying to open it. A folder's listing
        of launch files (LISTING) is listed again."""
        if state is not None and state.startswith(LISTING):
            return _listing_state(_launch_listing(_absolute(path))) == state
        if state is ABSENT or state == EXISTS:
            folder, name = os.path.split(os.path.abspath(path))
            if name not in self._listing(folder):
                return state is ABSENT
        now = self.digest_of(path)
        return now is not ABSENT if state == EXISTS else now == state

    def digest_of(self, path: Union[str, Path]) -> State:
        """The current state of `path` in the terms of `dependencies()` (for cache validation)."""
        path = _absolute(path)
        if path in self._digests:
            return self._digests[path]
        if path in self._absent:
            return ABSENT
        try:
            with open(path, "rb") as handle:
                self._digests[path] = content_digest(handle.read(MAX_BYTES + 1))
        except OSError:  # missing, a folder, unreadable: the same to an import
            self._absent.add(path)
            return ABSENT
        return self._digests[path]

    # ---- parsing

    def provide(self, path: Path, data: bytes, module: Optional[cst.Module]) -> None:
        """Hand over a module the caller already read and parsed (a linted file), so that
        following an import back to it neither re-reads nor re-parses it."""
        path = _absolute(path)
        self._digests[path] = content_digest(data[: MAX_BYTES + 1])  # as digest_of reads it
        self._keep(path, module)

    def parsed_already(self, path: Path, data: bytes) -> Optional[cst.Module]:
        """The module this run already parsed from exactly `data` at `path` (an import read it before
        it came up to be linted), so that the file is not parsed a second time; else None."""
        path = _absolute(path)
        module = self._modules.get(path)
        if module is None or self._digests.get(path) != content_digest(data[: MAX_BYTES + 1]):
            return None
        return module

    def _keep(self, path: Path, module: Optional[cst.Module]) -> None:
        if module is None:
            self._unparsable.add(path)
            return
        self._unparsable.discard(path)
        self._modules[path] = module
        self._modules.move_to_end(path)
        while len(self._modules) > MAX_MODULES:
            self._modules.popitem(last=False)

    def parse(self, path: Path) -> Optional[cst.Module]:
        """The parsed module at `path`; None if it is unreadable, not Python, too large or does
        not parse. Memoised; never raises."""
        try:
            path = _absolute(path)
        except (OSError, ValueError):
            return None
        module = self._modules.get(path)
        if module is not None:
            self._modules.move_to_end(path)
        elif path not in self._unparsable:
            module = self._read_and_parse(path)
            self._keep(path, module)
        if path in self._digests:
            self._note(path, self._digests[path])
        return module

    def _read(self, path: Path) -> Optional[bytes]:
        """A Python source file's bytes (up to one past MAX_BYTES), its digest kept; None when it is
        not a readable `.py`/`.pyi` file."""
        if path.suffix not in (".py", ".pyi") or not _is_file(path):
            return None
        try:
            with open(path, "rb") as handle:
                data = handle.read(MAX_BYTES + 1)
        except OSError:
            return None
        self._digests[path] = content_digest(data)
        return data

    def _read_and_parse(self, path: Path) -> Optional[cst.Module]:
        data = self._read(path)
        if data is None or len(data) > MAX_BYTES or b"\x00" in data:
            return None
        try:
            encoding, _ = tokenize.detect_encoding(BytesIO(data).readline)
            text = data.decode(encoding)
            return cst.parse_module(text[1:] if text.startswith("\ufeff") else text)  # as the engine decodes
        except Exception:  # noqa: BLE001 - any failure means "not a module we can read", by contract
            return None

    # ---- resolution

    def resolve(self, importer: Path, module: Optional[str], level: int) -> Optional[Path]:
        """The file a `from <level dots><module> import ...` or `import <module>` in `importer`
        loads, if it is one of the project's own; None otherwise. Never raises."""
        try:
            folder = _absolute(importer).parent
            key = (folder, module, level)
            if key not in self._resolved:
                self._scopes.append({})
                try:
                    found = self._resolve(folder, module, level)
                finally:
                    states = self._scopes.pop()
                self._resolved[key] = (found, states)
            found, states = self._resolved[key]
            self._note_all(states)
            return found
        except (OSError, ValueError, RecursionError):
            return None

    def _resolve(self, folder: Path, module: Optional[str], level: int) -> Optional[Path]:
        parts = module.split(".") if module else []
        if not all(part.isidentifier() for part in parts) or level < 0:
            return None
        if level > 0:
            base = folder
            for _ in range(level - 1):
                if base.parent == base:
                    return None
                base = base.parent
            if not parts:
                init = base / "__init__.py"
                return init if self._probe(init) else None
            return self._find(base, parts)
        if not parts:
            return None
        for root in dict.fromkeys((self._package_top(folder), folder, *self.roots)):
            if not _admits(str(root), str(folder), parts[0]):
                continue
            found = self._find(root, parts)
            if found is not None:
                return found
        return None

    def _probe(self, candidate: Path) -> bool:
        exists = _is_file(candidate)
        self._note(candidate, EXISTS if exists else ABSENT)
        return exists

    def _package_top(self, folder: Path) -> Path:
        """`_package_top`, once per folder per run."""
        top = self._package_tops.get(folder)
        if top is None:
            top = self._package_tops[folder] = _package_top(folder)
        return top

    def _listing(self, folder: str) -> frozenset[str]:
        """The names in a folder, listed once per run (the pre-filter resolves from these instead of
        probing each candidate file)."""
        names = self._listings.get(folder)
        if names is None:
            parent, name = os.path.split(folder)
            if name and parent != folder and name not in self._listing(parent) and parent not in self._unlisted:
                names = frozenset()  # not in its parent: no folder to list (import candidates often are not)
            else:
                try:
                    names = frozenset(os.listdir(folder))
                except OSError:
                    names = frozenset()
                    self._unlisted.add(folder)
            self._listings[folder] = names
        return names

    def _search_roots(self, folder: Path) -> tuple[str, ...]:
        roots = self._roots_for.get(folder)
        if roots is None:
            roots = self._roots_for[folder] = tuple(
                str(r) for r in dict.fromkeys((self._package_top(folder), folder, *self.roots))
            )
        return roots

    def _quick_resolve(self, importer: Path, module: Optional[str], level: int) -> Optional[Path]:
        """`resolve`'s rules for the pre-filter's closure, answered from folder listings (strings,
        no probes) and recording nothing (see `closure_mentions`). Memoised per folder."""
        key = (importer.parent, module, level)
        if key in self._quick_resolved:
            return self._quick_resolved[key]
        parts = module.split(".") if module else []
        found: Optional[str] = None
        if level > 0:
            base = str(importer.parent)
            for _ in range(level - 1):
                base = os.path.dirname(base)
            if not parts:
                found = os.path.join(base, "__init__.py") if "__init__.py" in self._listing(base) else None
            else:
                found = self._quick_find(base, parts)
        elif parts:
            for root in self._search_roots(importer.parent):
                if not _admits(root, str(importer.parent), parts[0]):
                    continue
                names = self._listing(root)
                if parts[0] in names or f"{parts[0]}.py" in names:
                    found = self._quick_find(root, parts)
                    if found is not None:
                        break
        result = Path(found) if found is not None else None
        self._quick_resolved[key] = result
        return result

    def _quick_find(self, base: str, parts: list[str]) -> Optional[str]:
        current = base
        for part in parts[:-1]:
            names = self._listing(current)
            if part in names and "__init__.py" in self._listing(os.path.join(current, part)):
                current = os.path.join(current, part)
            elif f"{part}.py" in names or part not in names:
                return None
            else:
                current = os.path.join(current, part)  # a namespace folder
        last = parts[-1]
        if last in self._listing(current) and "__init__.py" in self._listing(os.path.join(current, last)):
            return os.path.join(current, last, "__init__.py")
        return os.path.join(current, f"{last}.py") if f"{last}.py" in self._listing(current) else None

    def _find(self, base: Path, parts: list[str]) -> Optional[Path]:
        """`a.b.c` under `base`: each of a, b a package or namespace folder (a module `a.py` is
        not a package), c a package's `__init__.py` or a module; a namespace `c/` has no file."""
        current = base
        for part in parts[:-1]:
            if self._probe(current / part / "__init__.py"):
                current = current / part
            elif self._probe(current / f"{part}.py") or not _is_dir(current / part):
                return None
            else:
                current = current / part
        last = parts[-1]
        for candidate in (current / last / "__init__.py", current / f"{last}.py"):
            if self._probe(candidate):
                return candidate
        return None

    def imported_modules(self, path: Path) -> list[Path]:
        """The project modules `path` imports anywhere in its body (statements in functions
        included; `from pkg import name` counts `pkg/name.py` when that is a submodule), in order."""
        tree = self.parse(path)
        if tree is None:
            return []
        found: list[Path] = []

        def add(target: Optional[Path]) -> None:
            if target is not None and target not in found:
                found.append(target)

        for node in _imports(tree):
            if isinstance(node, cst.Import):
                for alias in node.names:
                    add(self.resolve(path, _dotted(alias.name), 0))
                continue
            level = len(node.relative)
            base = _dotted(node.module) if node.module is not None else None
            add(self.resolve(path, base, level))
            if isinstance(node.names, cst.ImportStar):
                continue
            for alias in node.names:
                name = _dotted(alias.name)
                if name:
                    add(self.resolve(path, f"{base}.{name}" if base else name, level))
        return found

    def forget(self, path: Union[str, Path]) -> None:
        """Drop what was read, parsed or worked out from `path`, because its text changed (the
        editor server's document, a file saved beside it). Everything that never read it stays
        warm: the other modules' parses, resolutions and models."""
        try:
            path = _absolute(Path(path))
        except (OSError, ValueError):
            return
        if is_launch_file_name(path.name) and self._listings_of_launch.pop(path.parent, None) is not None:
            # Its folder's listing of launch files may have changed too (a new run.sh).
            self._memo = {key: value for key, value in self._memo.items() if path.parent not in value[1]}
        self._modules.pop(path, None)
        self._scanned.pop(path, None)  # the pre-filter's words and imports of its old text
        self._unparsable.discard(path)
        self._digests.pop(path, None)
        self._absent.discard(path)
        self._resolved = {key: value for key, value in self._resolved.items() if path not in value[1]}
        self._memo = {
            key: value for key, value in self._memo.items()
            if path not in value[1] and not (isinstance(key, tuple) and path in key)
        }

    # ---- launch files (shell, SLURM, YAML, README): read as text, recorded like modules

    def top_of(self, path: Path) -> Optional[Path]:
        """The project's top folder for a file (the nearest `pyproject.toml`, `setup.py`,
        `setup.cfg` or repository top above it), else the file's own folder."""
        try:
            folder = _absolute(path).parent
            return _project_top(folder, self._tops) or folder
        except (OSError, ValueError):
            return None

    def launch_listing(self, folder: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The launch files and the subfolders (not hidden, not a virtual environment, build or data
        folder) in `folder`, sorted; empty when it cannot be listed. Listed once per run and recorded
        as a dependency of the current scope: a launch file added, removed or renamed in a folder the
        analysis looked in re-analyses the files whose results may depend on it."""
        folder = _absolute(folder)
        known = self._listings_of_launch.get(folder)
        if known is None:
            found = _launch_listing(folder)
            known = self._listings_of_launch[folder] = (found or ((), ()), _listing_state(found))
        self._note(folder, known[1])
        return known[0]

    def read_launch_file(self, path: Path, max_bytes: int) -> Optional[bytes]:
        """A launch file's bytes (None when unreadable or larger than `max_bytes`), recorded as a
        dependency of the current scope: an edit to the launch script re-analyses its users."""
        try:
            with open(path, "rb") as handle:
                data = handle.read(MAX_BYTES + 1)  # as digest_of reads it, so the cache can compare
        except OSError:
            return None
        path = _absolute(path)
        self._digests[path] = content_digest(data)
        self._note(path, self._digests[path])
        return data if len(data) <= max_bytes and b"\x00" not in data else None

    # ---- the import closure, by bytes (the pre-filter's view)

    def closure_mentions(
        self, path: Path, data: bytes, vocabulary: frozenset[bytes], enough: Callable[[set[bytes]], bool]
    ) -> frozenset[bytes]:
        """The words of `vocabulary` that the project modules in `path`'s import closure mention
        (`path` itself, whose bytes are `data`, not counted). The closure is what the analysis may
        read: the modules `path` imports, what they import, and so on, CLOSURE_DEPTH imports deep
        (the analysis follows calls and re-exports a few modules deep, not further), found by
        scanning bytes for import statements: nothing is parsed, and each module is read, scanned and
        its imports resolved once per run. The walk stops as soon as `enough(found)`.

        Recorded as the current scope's dependencies: the content of every module the walk read (an
        edit that adds a rule's API to one of them re-analyses the file). Not recorded: the candidate
        files the imports looked for (a module appearing where an import looked is seen when the
        analysis follows that import, or when the importer changes); the walk resolves from folder
        listings, once per module per run."""
        path = _absolute(path)
        found: set[bytes] = set()
        done = {path}
        todo = deque((p, 1) for p in self._resolve_statements(path, _import_statements(data), self._quick_resolve))
        while todo and not enough(found):
            current, depth = todo.popleft()
            if current in done:
                continue
            done.add(current)
            scanned = self._scan(current, vocabulary)
            if scanned is None:
                continue
            words, imports = scanned
            found |= words
            if depth < CLOSURE_DEPTH:
                todo.extend((p, depth + 1) for p in imports if p not in done)
        return frozenset(found)

    def _scan(self, path: Path, vocabulary: frozenset[bytes]) -> Optional[tuple[frozenset[bytes], tuple[Path, ...]]]:
        known = self._scanned.get(path)
        if known is None or known[0] != vocabulary:
            data = self._read(path)
            if data is None:
                return None
            imports: tuple[Path, ...] = ()
            words: frozenset[bytes] = frozenset()
            if len(data) <= MAX_BYTES:  # a larger one is never parsed by the analysis either
                words = frozenset(w for w in vocabulary if w in data)
                imports = self._resolve_statements(path, _import_statements(data), self._quick_resolve)
            known = (vocabulary, words, imports)
            self._scanned[path] = known
        self._note(path, self._digests[path])
        return known[1], known[2]

    def _resolve_statements(
        self,
        path: Path,
        statements: Iterable[ImportStatement],
        resolve: Optional[Callable[[Path, Optional[str], int], Optional[Path]]] = None,
    ) -> tuple[Path, ...]:
        """The project modules import statements name, resolved from `path`. `from pkg import a, b`
        counts `pkg/a.py` and `pkg/b.py` only when `pkg` is a project package (the names imported
        from `typing` are not looked for as modules)."""
        resolve = resolve or self.resolve
        found: dict[Path, None] = {}
        for level, module, names in statements:
            if level == 0 and module.split(".")[0] == "torch":
                continue  # the analysis never follows torch's own names (`model._import_candidates`)
            base = resolve(path, module or None, level)
            if base is not None and base != path:
                found[base] = None
            if base is None or base.name != "__init__.py":
                continue
            for name in names:
                resolved = resolve(path, f"{module}.{name}" if module else name, level)
                if resolved is not None and resolved != path:
                    found[resolved] = None
        return tuple(found)

    # ---- per-run memo

    def memo(self, key: Hashable, compute: Callable[[], T]) -> T:
        """`compute()` once per key for this run. The files it read are recorded again for every
        later scope that gets the memoised value. Asking for a key while computing it raises
        MemoCycle (catch it where modules may import each other)."""
        if key in self._memo:
            value, states = self._memo[key]
            self._note_all(states)
            return value  # type: ignore[return-value]
        if key in self._computing:
            raise MemoCycle(f"memo key {key!r} is being computed")
        self._computing.add(key)
        self._scopes.append({})
        try:
            value = compute()
        finally:
            self._computing.discard(key)
            states = self._scopes.pop()
            self._note_all(states)
        self._memo[key] = (value, states)
        return value


def _dotted(node: Union[cst.BaseExpression, cst.Attribute, cst.Name]) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr.value}" if head else ""
    return ""


def _imports(tree: cst.Module) -> Iterator[Union[cst.Import, cst.ImportFrom]]:
    """Import statements anywhere, without a visitor: an explicit stack over statement bodies."""
    stack: list[cst.CSTNode] = list(reversed(tree.body))
    while stack:
        node = stack.pop()
        if isinstance(node, cst.SimpleStatementLine):
            for small in node.body:
                if isinstance(small, (cst.Import, cst.ImportFrom)):
                    yield small
        elif isinstance(node, cst.BaseCompoundStatement):
            stack.extend(reversed(list(_child_statements(node))))


def _child_statements(node: cst.BaseCompoundStatement) -> Iterator[cst.CSTNode]:
    blocks: list[cst.BaseSuite] = [node.body]  # in source order: body, handlers, else/elif, finally
    for handler in getattr(node, "handlers", ()):
        blocks.append(handler.body)
    orelse = getattr(node, "orelse", None)
    while orelse is not None:
        blocks.append(orelse.body)
        orelse = getattr(orelse, "orelse", None) if isinstance(orelse, cst.If) else None
    final = getattr(node, "finalbody", None)
    if final is not None:
        blocks.append(final.body)
    for block in blocks:
        if isinstance(block, cst.IndentedBlock):
            yield from block.body
        elif isinstance(block, cst.SimpleStatementSuite):
            yield cst.SimpleStatementLine(body=block.body)


# `import a.b as c, d` / `from ..pkg import (x, y as z)` at any indentation (imports inside functions
# and `try:` blocks count, as for the analysis). A match inside a string or a comment only adds a
# module to the closure: the pre-filter errs towards analysing.
_IMPORT = re.compile(
    rb"^[ \t]*(?:from[ \t]+(\.*)[ \t]*([\w.]*)[ \t]+import[ \t]*(\([^)]*\)|[^\n#;]*)|import[ \t]+([^\n#;]*))",
    re.MULTILINE,
)
_AS = re.compile(rb"\s+as\s+\w+")


def _import_statements(data: bytes) -> Iterator[ImportStatement]:
    """The import statements in a module's bytes, by a regular expression (no parse)."""
    for match in _IMPORT.finditer(data):
        dots, module, names, plain = match.groups()
        if plain is not None:
            for part in _AS.sub(b"", plain.rstrip(b"\\ \t\r")).split(b","):
                name = part.strip().decode("ascii", "replace")
                if name and all(p.isidentifier() for p in name.split(".")):
                    yield 0, name, ()
            continue
        listed = _AS.sub(b"", names.strip(b"()\\ \t\r\n"))
        imported = tuple(
            n for n in (part.strip().decode("ascii", "replace") for part in listed.split(b",")) if n.isidentifier()
        )
        module_name = module.decode("ascii", "replace")
        if module_name and not all(p.isidentifier() for p in module_name.split(".")):
            continue
        yield len(dots), module_name, imported
