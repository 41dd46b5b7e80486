"""One file's analysis never stops the run: whatever goes wrong inside it becomes a DDP999 finding
for that file, with the reason, and the other files are linted as usual.

Three guards, cheapest first:
- size: a file over the limit (`max-file-size`, in MB) is not parsed at all;
- nesting: CPython's own parser is asked first (C speed, about a tenth of libcst's time); what it
  refuses as too deep (RecursionError, "too many nested parentheses") is never handed to libcst,
  whose native parser overflows the C stack on such input (a 6,000-link attribute chain was a
  segmentation fault);
- the analysis itself runs in a thread with a large stack and recursion limit (deep but valid
  code, e.g. a 500-part string concatenation, is analysed, not refused) and a time budget: past it
  the thread is interrupted at its next Python instruction. Worker processes are also watched from
  the parent (see `ddpdoctor.lint.workers`), which covers time spent in native code and crashes.
"""

from __future__ import annotations

import ast
import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

T = TypeVar("T")

DEFAULT_MAX_FILE_MB = 2.0
DEFAULT_FILE_TIMEOUT_S = 60.0
# libcst and the rules recurse once per nesting level; CPython 3.11 needs little C stack per Python
# call, the native parser and C-implemented comparisons need more.
ANALYSIS_STACK_BYTES = 512 * 1024 * 1024
ANALYSIS_RECURSION_LIMIT = 50_000
DEFAULT_RECURSION_LIMIT = 1000
SUSPICIOUS_DEPTH = 100
LONG_STATEMENT_CHARS = 2000
_STRUCTURE = re.compile(
    r"'''[\s\S]*?'''"
    r'|"""[\s\S]*?"""'
    r"|'(?:\\.|[^'\\\n])*'"
    r'|"(?:\\.|[^"\\\n])*"'
    r"|#[^\n]*"
    r"|[()\[\]{}\n]"
)
# CPython's limit on nested brackets (MAXLEVEL in its tokenizer) is 200.
_CPYTHON_DEPTH_REFUSALS = ("too many nested parentheses", "too many nested", "too complex")


@dataclass(frozen=True)
class Limits:
    max_bytes: int = int(DEFAULT_MAX_FILE_MB * 1024 * 1024)
    timeout_s: float = DEFAULT_FILE_TIMEOUT_S

    def too_large(self, size: int) -> Optional[str]:
        if size <= self.max_bytes:
            return None
        return f"larger than {_megabytes(self.max_bytes)} MB: skipped (see max-file-size)"


def _megabytes(size: int) -> str:
    value = size / (1024 * 1024)
    return f"{value:g}" if value >= 1 else f"{value:.2g}"


class AnalysisFailed(Exception):
    """The analysis of one file was given up; str() is the reason shown in DDP999. `transient`:
    it may go otherwise on another run (a time budget on a busy machine), so it is not cached."""

    def __init__(self, reason: str, transient: bool = False) -> None:
        super().__init__(reason)
        self.transient = transient


class _BudgetExceeded(BaseException):
    # A BaseException, so that no `except Exception` in the analysis swallows it.
    pass


def _may_be_deep(text: str) -> bool:
    """A cheap over-approximation of "CPython might refuse this as too deep": brackets nested 100
    deep (CPython refuses 200), or a statement over 2,000 characters outside strings (a long chain
    of attributes, calls, subscripts or operators nests one level per link). Comments and strings
    are skipped roughly (a false alarm only costs the exact check); the scan runs in the regex
    engine and visits only brackets, newlines, strings and comments."""
    depth = 0
    start = 0
    for match in _STRUCTURE.finditer(text):
        char = match.group()
        if char == "\n":
            if depth <= 0:
                if match.start() - start > LONG_STATEMENT_CHARS:
                    return True
                start = match.start()
                depth = 0
        elif char in "([{":
            depth += 1
            if depth >= SUSPICIOUS_DEPTH:
                return True
        elif char in ")]}":
            depth -= 1
        elif depth <= 0 and char[0] != "#":
            start = match.end()  # a docstring is not a chain, however long
    return len(text) - start > LONG_STATEMENT_CHARS


def too_deep(text: str, path: str) -> Optional[tuple[str, int]]:
    """(reason, line) when CPython's parser refuses the text as nested too deeply, else None.

    Asked at CPython's default recursion limit (which scales its parser's depth limit), so the
    verdict is the one `python` itself gives, whatever limit the analysis thread runs under. Only
    asked when `_may_be_deep` says so: the exact check costs about a fifth of a lint."""
    if not _may_be_deep(text):
        return None
    raised = sys.getrecursionlimit()
    sys.setrecursionlimit(DEFAULT_RECURSION_LIMIT)
    try:
        compile(text, path, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except (RecursionError, MemoryError):
        return "too deeply nested for the parser", 1
    except SyntaxError as error:
        if any(refusal in str(error.msg) for refusal in _CPYTHON_DEPTH_REFUSALS):
            return f"too deeply nested for the parser ({error.msg})", error.lineno or 1
    except ValueError:
        pass  # NUL bytes and the like: libcst and the decoder report those
    finally:
        sys.setrecursionlimit(raised)
    return None


def contain(work: Callable[[], T], timeout_s: float) -> T:
    """Run `work` in a big-stack thread under a time budget. Raises AnalysisFailed with the reason
    for anything that goes wrong inside (it never escapes as another exception)."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            outcome.append(work())
        except BaseException as error:  # noqa: BLE001 - everything is reported as DDP999
            failure.append(error)

    previous_stack = threading.stack_size()
    try:
        threading.stack_size(ANALYSIS_STACK_BYTES)
    except (ValueError, RuntimeError):  # a platform that refuses the size: its default stack
        pass
    previous_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous_limit, ANALYSIS_RECURSION_LIMIT))
    # The budget counts from here, not from when start() returns: the new thread may take the GIL
    # first and keep it through the whole parse (libcst's native parser does not release it), so a
    # clock started after start() gave a file whose parse took seconds its whole budget again.
    began = time.monotonic()
    try:
        thread = threading.Thread(target=target, name="ddpdoctor-analysis", daemon=True)
        thread.start()
    finally:
        threading.stack_size(previous_stack)
    try:
        thread.join(max(0.0, timeout_s - (time.monotonic() - began)))
        if thread.is_alive():
            _interrupt(thread)
            # Python code stops at once; a native call (the parser) only when it returns.
            deadline = time.monotonic() + max(5.0, timeout_s)
            while thread.is_alive() and time.monotonic() < deadline:
                thread.join(0.1)
            raise AnalysisFailed(f"analysis exceeded its time budget ({timeout_s:g} s)", transient=True)
    finally:
        sys.setrecursionlimit(previous_limit)
    if failure:
        raise AnalysisFailed(describe(failure[0]), transient=isinstance(failure[0], (_BudgetExceeded, MemoryError))) from None
    return outcome[0]


def describe(error: BaseException) -> str:
    if isinstance(error, _BudgetExceeded):
        return "analysis exceeded its time budget"
    if isinstance(error, RecursionError):
        return "too deeply nested for the parser"
    if isinstance(error, MemoryError):
        return "ran out of memory analysing this file"
    return f"internal error in the analysis: {type(error).__name__}"


def _interrupt(thread: threading.Thread) -> None:
    if thread.ident is None:
        return
    import ctypes  # only here, when a budget runs out: not a cost of every run's start-up

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_BudgetExceeded))
