"""Writing a fixed file without ever losing the user's work.

The new content goes to a temporary file in the target's own folder, gets the original's mode and
owner, and replaces it by rename: a crash leaves the old file or the new one, never half of each.
A symlink is followed (the target is fixed, the link kept); a file with hard links is rewritten in
place so the links keep sharing it. Nothing is written over a read-only file, or over a file that
changed on disk since it was linted (an editor saved it meanwhile): that is an error for that file.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
import tokenize
from io import BytesIO
from typing import Callable, Optional

from ddpdoctor.lint.files import NotRegular, read_regular

TEMP_PREFIX = ".ddpdoctor-"


class WriteError(Exception):
    """This file was not written; the message (one line) says why. The file is as it was."""


def encode_like(original: bytes, text: str) -> bytes:
    """Encode fixed text the way the original file was encoded (coding cookie, BOM)."""
    try:
        encoding, _ = tokenize.detect_encoding(BytesIO(original).readline)
    except SyntaxError:
        encoding = "utf-8"
    if encoding == "utf-8-sig":
        return b"\xef\xbb\xbf" + text.encode("utf-8")
    return text.encode(encoding)


def _read(path: str) -> bytes:
    try:
        data = read_regular(path, sys.maxsize)
    except NotRegular:
        raise WriteError(f"{path}: not a regular file; not written") from None
    assert data is not None  # no size limit
    return data


def write_fixed(path: str, still_current: Callable[[bytes], bool], render: Callable[[bytes], bytes]) -> None:
    """Replace the file at `path` (a link is followed) with `render(current bytes)`.

    `still_current(bytes)` says whether the bytes on disk are still what was linted; it is asked
    when the file is read and again right before the rename."""
    try:
        _write_fixed(path, still_current, render)
    except OSError as error:
        raise WriteError(f"{path}: not written: {error.strerror or error}") from None


def _write_fixed(path: str, still_current: Callable[[bytes], bool], render: Callable[[bytes], bytes]) -> None:
    target = os.path.realpath(path)
    info = os.stat(target)
    if not stat.S_ISREG(info.st_mode):
        raise WriteError(f"{path}: not a regular file; not written")
    if not info.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or not os.access(target, os.W_OK):
        raise WriteError(f"{path}: read-only file; left as it was")
    original = _read(target)
    if not still_current(original):
        raise WriteError(f"{path}: changed on disk since it was linted; not written (run again)")
    data = render(original)
    if info.st_nlink > 1:
        _rewrite_in_place(path, target, data, still_current)
        return
    directory = os.path.dirname(target)
    try:
        fd, temp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=".tmp", dir=directory)
    except OSError as error:
        raise WriteError(f"{path}: not written: cannot create a file in {directory}: {error.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), stat.S_IMODE(info.st_mode))
            _keep_owner(handle.fileno(), info)
            os.fsync(handle.fileno())
        # The last moment before the rename: an editor that saved meanwhile wins.
        now = os.stat(target)
        if (now.st_mtime_ns, now.st_size, now.st_ino) != (info.st_mtime_ns, info.st_size, info.st_ino) or not still_current(
            _read(target)
        ):
            raise WriteError(f"{path}: changed on disk since it was linted; not written (run again)")
        os.replace(temp, target)
    except BaseException:
        if os.path.lexists(temp):
            os.unlink(temp)
        raise


def _keep_owner(fd: int, info: os.stat_result) -> None:
    if (info.st_uid, info.st_gid) == (os.geteuid(), os.getegid()):
        return
    try:
        os.fchown(fd, info.st_uid, info.st_gid)
    except PermissionError:
        # Not root: we may still keep the group if we are in it; the owner becomes us, as with
        # any editor's save-by-rename. Root (the case that reset owners before) always succeeds.
        try:
            os.fchown(fd, -1, info.st_gid)
        except PermissionError:
            pass


def _rewrite_in_place(path: str, target: str, data: bytes, still_current: Callable[[bytes], bool]) -> None:
    """Hard links share one inode: only writing into it keeps them sharing the fix."""
    with open(target, "r+b") as handle:
        if not still_current(handle.read()):
            raise WriteError(f"{path}: changed on disk since it was linted; not written (run again)")
        handle.seek(0)
        handle.write(data)
        handle.truncate()
        handle.flush()
        os.fsync(handle.fileno())


def atomic_write(path: str, data: bytes, new_file_mode: Optional[int] = None) -> None:
    """Write a file of our own (the cache, a report) by temp file and rename, keeping an existing
    mode; a new file gets `new_file_mode` less the umask (None: readable by its owner only)."""
    directory = os.path.dirname(os.path.abspath(path))
    mode = stat.S_IMODE(os.stat(path).st_mode) if os.path.exists(path) else None
    if mode is None and new_file_mode is not None:
        umask = os.umask(0)
        os.umask(umask)
        mode = new_file_mode & ~umask
    fd, temp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if mode is not None:
                os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        if os.path.lexists(temp):
            os.unlink(temp)
        raise
