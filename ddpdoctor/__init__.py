"""ddpdoctor: a linter and doctor for distributed PyTorch training setups.

The Python API (see the README's "Python API" section)::

    from ddpdoctor import lint_paths, lint_source, Finding

    for finding in lint_paths(["train.py"]):
        print(finding.path, finding.line, finding.code, finding.message)

The names are imported on first use, so `import ddpdoctor` costs next to nothing and never imports
libcst or torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from ddpdoctor.api import lint_paths, lint_source
    from ddpdoctor.findings import Finding

# name -> the module that defines it, imported when the name is first asked for (PEP 562).
_LAZY = {"lint_paths": "ddpdoctor.api", "lint_source": "ddpdoctor.api", "Finding": "ddpdoctor.findings"}

__all__ = ["Finding", "__version__", "lint_paths", "lint_source"]


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'ddpdoctor' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
