"""`[tool.ddpdoctor]` configuration: discovery, validation and rule selection.

The nearest `ddpdoctor.toml` or `pyproject.toml` (with a `[tool.ddpdoctor]` table) above the first
linted path is used. Command-line options override it. An unknown key or code is an error, never
silently ignored: a typo in `ignore` must not turn into "ignore nothing".
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Mapping, Optional

from ddpdoctor.catalog import RuleInfo, load_catalog

KNOWN_KEYS = frozenset(
    {"select", "ignore", "extend-select", "exclude", "per-file-ignores", "world-size", "max-file-size", "file-timeout"}
)


class ConfigError(ValueError):
    """A problem with configuration or options; the CLI prints it on one line and exits 2."""


@dataclass(frozen=True)
class Settings:
    select: Optional[tuple[str, ...]] = None  # None: every rule that is on by default
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    world_size: Optional[int] = None
    max_file_mb: Optional[float] = None  # larger files are not analysed (DDP999); None: the default
    file_timeout_s: Optional[float] = None  # the time budget per file; None: the default
    root: Optional[Path] = None  # directory of the config file (patterns are relative to it)
    config_path: Optional[Path] = None

    def merged(self, **overrides: Any) -> "Settings":
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def enabled_codes(self, catalog: Optional[Mapping[str, RuleInfo]] = None) -> frozenset[str]:
        catalog = catalog if catalog is not None else lint_catalog()
        if self.select is None:
            enabled = {code for code, info in catalog.items() if info.default_on}
        else:
            enabled = set(expand_codes(self.select, catalog))
        enabled |= set(expand_codes(self.extend_select, catalog))
        enabled -= set(expand_codes(self.ignore, catalog))
        return frozenset(enabled)

    def codes_for(self, path: str, enabled: frozenset[str]) -> frozenset[str]:
        """`enabled` minus the per-file ignores that match `path`."""
        if not self.per_file_ignores:
            return enabled
        relative = self.relative(path)
        drop: set[str] = set()
        for pattern, codes in self.per_file_ignores:
            if _matches(relative, pattern):
                drop |= set(expand_codes(codes, lint_catalog()))
        return enabled - drop

    def is_excluded(self, path: str) -> bool:
        if not self.exclude:
            return False
        relative = self.relative(path)
        return any(_matches(relative, pattern) for pattern in self.exclude)

    def relative(self, path: str) -> str:
        resolved = Path(path).resolve()
        base = (self.root or Path.cwd()).resolve()
        try:
            return resolved.relative_to(base).as_posix()
        except ValueError:
            return resolved.as_posix()

    def fingerprint(self) -> str:
        """Part of the cache key: any change of configuration invalidates cached results."""
        data = {
            "select": self.select,
            "ignore": self.ignore,
            "extend_select": self.extend_select,
            "per_file_ignores": self.per_file_ignores,
            "world_size": self.world_size,
            "max_file_mb": self.max_file_mb,
        }
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=list).encode()).hexdigest()[:16]


def _matches(relative: str, pattern: str) -> bool:
    """gitignore-like matching: a pattern without '/' matches any path component or basename."""
    pattern = pattern.rstrip("/")
    if fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(relative, pattern + "/*"):
        return True
    if "/" not in pattern:
        parts = PurePosixPath(relative).parts
        return any(fnmatch.fnmatch(part, pattern) for part in parts)
    return False


def lint_catalog() -> dict[str, RuleInfo]:
    return {code: info for code, info in load_catalog().items() if info.kind == "lint"}


def expand_codes(selectors: Iterable[str], catalog: Optional[Mapping[str, RuleInfo]] = None) -> list[str]:
    """`ALL`, a code (`DDP001`) or a prefix (`DDP`, `DDP00`, `HVD`) -> codes. Unknown -> ConfigError."""
    catalog = catalog if catalog is not None else lint_catalog()
    out: list[str] = []
    for raw in selectors:
        selector = raw.strip().upper()
        if not selector:
            continue
        if selector == "ALL":
            out.extend(catalog)
            continue
        matched = [code for code in catalog if code.startswith(selector)]
        if not matched:
            raise ConfigError(f"unknown rule code or prefix {raw.strip()!r} (see 'ddpdoctor rules')")
        out.extend(matched)
    return out


def split_codes(value: Optional[str]) -> Optional[tuple[str, ...]]:
    """`--select DDP001,DDP002` -> ("DDP001", "DDP002")."""
    if value is None:
        return None
    return tuple(part.strip() for part in value.split(",") if part.strip())


def find_config(start: Path) -> Optional[Path]:
    directory = start if start.is_dir() else start.parent
    directory = directory.resolve()
    for candidate_dir in (directory, *directory.parents):
        dedicated = candidate_dir / "ddpdoctor.toml"
        if dedicated.is_file():
            return dedicated
        pyproject = candidate_dir / "pyproject.toml"
        if pyproject.is_file():
            try:
                raw = pyproject.read_bytes()
            except OSError:
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                if b"tool.ddpdoctor" in raw:
                    raise ConfigError(f"{pyproject}: not UTF-8 (TOML files must be UTF-8)") from None
                continue  # someone else's pyproject, and not ours to judge
            tomllib = _toml()
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError as error:
                if "tool.ddpdoctor" in text:
                    raise ConfigError(f"{pyproject}: invalid TOML: {error}") from None
                continue  # someone else's broken pyproject is not ours to judge
            tool = data.get("tool")
            if isinstance(tool, dict) and "ddpdoctor" in tool:
                return pyproject
    return None


def _toml() -> Any:
    """The TOML parser, imported only when a file is read: a run without one does not pay for it."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised only on 3.9/3.10
        import tomli as tomllib
    return tomllib


def load_settings(path: Optional[Path]) -> Settings:
    if path is None:
        return Settings()
    tomllib = _toml()
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: invalid TOML: {error}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 (TOML files must be UTF-8)") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror or error}") from None
    if path.name == "ddpdoctor.toml":
        nested = data.get("tool")
        table: Any = nested["ddpdoctor"] if isinstance(nested, dict) and "ddpdoctor" in nested else data
    else:
        tool = data.get("tool", {})
        if not isinstance(tool, dict):
            raise ConfigError(f"{path}: 'tool' must be a table")
        table = tool.get("ddpdoctor", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.ddpdoctor] must be a table of settings, not {_toml_type(table)}")
    return settings_from_table(table, path)


def _toml_type(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array"}
    return next((name for kind, name in names.items() if isinstance(value, kind)), "a date or time")


def settings_from_table(table: Mapping[str, Any], path: Path) -> Settings:
    unknown = sorted(set(table) - KNOWN_KEYS)
    if unknown:
        raise ConfigError(
            f"{path}: unknown key {unknown[0]!r} in [tool.ddpdoctor] (known: {', '.join(sorted(KNOWN_KEYS))})"
        )

    def code_list(key: str) -> Optional[tuple[str, ...]]:
        if key not in table:
            return None
        value = table[key]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{path}: '{key}' must be a list of rule codes")
        _known_codes(value, path, repr(key))
        return tuple(value)

    exclude = table.get("exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(v, str) for v in exclude):
        raise ConfigError(f"{path}: 'exclude' must be a list of glob patterns")
    per_file: list[tuple[str, tuple[str, ...]]] = []
    raw_per_file = table.get("per-file-ignores", {})
    if not isinstance(raw_per_file, dict):
        raise ConfigError(f"{path}: 'per-file-ignores' must be a table of pattern = [codes]")
    for pattern, codes in raw_per_file.items():
        if not isinstance(codes, list) or not all(isinstance(c, str) for c in codes):
            raise ConfigError(f"{path}: per-file-ignores[{pattern!r}] must be a list of rule codes")
        _known_codes(codes, path, f"per-file-ignores[{pattern!r}]")
        per_file.append((pattern, tuple(codes)))
    world_size = table.get("world-size")
    if world_size is not None and (not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1):
        raise ConfigError(f"{path}: 'world-size' must be a positive integer")
    return Settings(
        max_file_mb=_positive_number(table, "max-file-size", path, "a size in MB"),
        file_timeout_s=_positive_number(table, "file-timeout", path, "a number of seconds"),
        select=code_list("select"),
        ignore=code_list("ignore") or (),
        extend_select=code_list("extend-select") or (),
        exclude=tuple(exclude),
        per_file_ignores=tuple(per_file),
        world_size=world_size,
        root=path.parent.resolve(),
        config_path=path,
    )


def _known_codes(codes: Iterable[str], path: Path, where: str) -> None:
    """Validate a configured list of codes; the error names the file and the key it is in."""
    try:
        expand_codes(codes)
    except ConfigError as error:
        raise ConfigError(f"{path}: {where}: {error}") from None


def _positive_number(table: Mapping[str, Any], key: str, path: Path, what: str) -> Optional[float]:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ConfigError(f"{path}: '{key}' must be a positive number ({what})")
    return float(value)
