"""What the editor server lints, and with what: settings per configuration file and one warm
project view per project, kept across edits so that an edit re-reads only the edited document.

No protocol types here: findings in, findings out (the server converts them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ddpdoctor.config import ConfigError, Settings, find_config, load_settings
from ddpdoctor.findings import Finding
from ddpdoctor.lint.analysis.imports import ProjectSources
from ddpdoctor.lint.engine import file_limits, lint_bytes


@dataclass
class Linted:
    findings: list[Finding]
    fixed_source: Optional[str] = None  # with `fix`: the document with every safe fix applied


@dataclass
class DocumentLinter:
    """Lints documents by path and text. Settings are read once per configuration file (until a
    configuration file is saved); project modules are parsed once per project (until one changes)."""

    _settings: dict[Path, tuple[Optional[Path], Settings]] = field(default_factory=dict)
    _projects: dict[tuple[Path, ...], ProjectSources] = field(default_factory=dict)
    _project_of: dict[Path, ProjectSources] = field(default_factory=dict)

    def settings_for(self, path: Path) -> Settings:
        """The settings of the nearest configuration above `path`; a broken one raises ConfigError."""
        folder = path.parent
        if folder not in self._settings:
            config = find_config(folder)
            self._settings[folder] = (config, load_settings(config))
        return self._settings[folder][1]

    def project_for(self, path: Path) -> ProjectSources:
        if path not in self._project_of:
            roots = ProjectSources.for_paths([path]).roots
            self._project_of[path] = self._projects.setdefault(roots, ProjectSources(roots))
        return self._project_of[path]

    def lint(self, path: Path, text: str, fix: bool = False) -> Linted:
        """Findings for `text` as the document at `path` (which need not be saved, or exist)."""
        settings = self.settings_for(path)
        project = self.project_for(path)
        project.forget(path)  # its text is the editor's now, not what was last read or parsed
        codes = settings.codes_for(str(path), settings.enabled_codes())
        result = lint_bytes(text.encode("utf-8"), str(path), codes, settings.world_size, fix,
                            project=project, limits=file_limits(settings))
        return Linted(sorted(result.findings, key=Finding.sort_key), result.fixed_source)

    def changed_on_disk(self, path: Path) -> None:
        """A file was saved (or created, deleted): what any project read of it is stale; a saved
        configuration file may change every document's settings."""
        for project in self._projects.values():
            project.forget(path)
        if path.name in ("pyproject.toml", "ddpdoctor.toml"):
            self._settings.clear()


__all__ = ["ConfigError", "DocumentLinter", "Linted"]
