"""Skip Horovod tests where Horovod is not installed -- except in CI, which installs it
(scripts/install-horovod) and sets DDPDOCTOR_REQUIRE_HOROVOD=1 so that they can never skip there."""

from __future__ import annotations

import os

import pytest


def horovod_available() -> bool:
    try:
        import horovod.torch  # noqa: F401
    except Exception:  # noqa: BLE001 -- missing or built against another torch
        return False
    return True


REASON = "Horovod is not installed: run scripts/install-horovod (see the README)"


def require_horovod() -> None:
    if horovod_available():
        return
    if os.environ.get("DDPDOCTOR_REQUIRE_HOROVOD") == "1":
        pytest.fail(f"DDPDOCTOR_REQUIRE_HOROVOD=1 but {REASON}")
    pytest.skip(REASON)
