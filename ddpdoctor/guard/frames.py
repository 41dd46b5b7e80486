"""Where in the user's code a rank is: the first frame outside torch and ddpdoctor."""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
import types
from typing import Optional

_GUARD_DIR = os.path.dirname(os.path.abspath(__file__))
_SKIP: tuple[str, ...] = (_GUARD_DIR, "<frozen ")
# A stack quoted to the user starts in their code, not in threading.py or multiprocessing.
_STDLIB = tuple(os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib"))


# A file's path as reported, or None for a file whose frames are skipped: asked for every frame that
# user_frame walks (a few per forward and per collective), so once per file, not per frame.
_paths: dict[str, Optional[str]] = {}
MAX_PATHS = 4096
_EXTRA: tuple[str, ...] = ()  # other frameworks' directories (Horovod's), kept when torch's are added


def skip_torch_frames() -> None:
    """Also skip torch's own frames (called once torch is imported, so this module need not import it)."""
    global _SKIP
    torch_mod = sys.modules.get("torch")
    torch_file = getattr(torch_mod, "__file__", None)
    if torch_file:
        _SKIP = (_GUARD_DIR, "<frozen ", os.path.dirname(os.path.abspath(torch_file)) + os.sep, *_EXTRA)
        _paths.clear()


def also_skip(directory: str) -> None:
    """Skip a framework's own frames too (Horovod's optimizer calls synchronize from its step)."""
    global _SKIP, _EXTRA
    prefix = os.path.abspath(directory) + os.sep
    if prefix not in _EXTRA:
        _EXTRA += (prefix,)
        _SKIP += (prefix,)
        _paths.clear()  # a file decided before may now be skipped


def is_user(filename: str) -> bool:
    return not filename.startswith(_SKIP)


def user_frame(frame: Optional[types.FrameType]) -> tuple[str, int]:
    """(path, line) of the innermost user frame at or above `frame`."""
    while frame is not None:
        filename = frame.f_code.co_filename
        try:
            path = _paths[filename]
        except KeyError:
            if len(_paths) >= MAX_PATHS:
                _paths.clear()
            path = _paths[filename] = None if filename.startswith(_SKIP) else display_path(filename)
        if path is not None:
            return path, frame.f_lineno
        frame = frame.f_back
    return "<unknown>", 0


def stack_of(frame: Optional[types.FrameType], limit: int = 8) -> list[tuple[str, int, str]]:
    """The innermost `limit` user frames (path, line, function), innermost first."""
    frames: list[tuple[str, int, str]] = []
    while frame is not None and len(frames) < limit:
        filename = frame.f_code.co_filename
        if not filename.startswith(_SKIP) and not filename.startswith(_STDLIB):
            frames.append((display_path(filename), frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return frames


@functools.lru_cache(maxsize=1024)  # os.path.relpath costs ~100 µs: once per file, not per collective
def display_path(filename: str) -> str:
    """Relative to the working directory when inside it, as the lint reports paths."""
    try:
        relative = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if relative.startswith("..") else relative
