"""Run the guard's patches right after `torch.distributed` is imported, without importing it first.

A meta-path finder that answers for exactly one module name, lets the normal finders locate it,
and wraps the loader so that `on_loaded(module)` runs once the module has executed. Every other
import costs one string comparison.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Callable, Optional, Sequence

TARGET = "torch.distributed"


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callable[[types.ModuleType], None]) -> None:
        self.name = name
        self.callback = callback
        self.busy = False

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[types.ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != self.name or self.busy:
            return None
        self.busy = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self.busy = False
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        callback, original = self.callback, loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            original(module)
            try:
                callback(module)
            except Exception:  # the guard must never break the user's import
                pass

        loader.exec_module = exec_module  # type: ignore[method-assign]
        sys.meta_path.remove(self)  # one module, once
        return spec


def watch_torch_distributed() -> None:
    """Patch torch.distributed now if it is already imported, else as soon as it is."""
    after_import(TARGET, _on_distributed)


def after_import(name: str, callback: Callable[[types.ModuleType], None]) -> None:
    """callback(module) now if `name` is imported already, else right after it is."""
    module = sys.modules.get(name)
    if module is not None:
        try:
            callback(module)
        except Exception:  # the guard must never break the user's job
            pass
        return
    if not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, callback))


def _on_distributed(module: Any) -> None:
    from ddpdoctor.guard.rank import patch_distributed

    patch_distributed(module)
