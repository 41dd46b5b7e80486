"""ddpdoctor: a linter and doctor for distributed PyTorch training setups."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
