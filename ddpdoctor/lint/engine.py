"""The lint pipeline: read -> cheap pre-filter -> parse once -> analysis -> rules -> suppression.

Also: parallel workers, the result cache and `--fix`/`--diff` rounds. Nothing here knows what any
particular rule checks; rules know nothing of files, workers or caches.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import gc
import os
import tokenize
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import libcst as cst

from ddpdoctor.catalog import rule_info
from ddpdoctor.config import Settings, lint_catalog
from ddpdoctor.findings import Finding, Severity
from ddpdoctor.lint import isolation, normalise, notebook
from ddpdoctor.lint.analysis import ModuleModel, build_analysis, launch
from ddpdoctor.lint.analysis.imports import ProjectSources
from ddpdoctor.lint.cache import ResultCache, content_hash
from ddpdoctor.lint.files import discover, read_regular
from ddpdoctor.lint.rules.base import Rule, all_rules
from ddpdoctor.lint.suppress import apply_suppressions, unknown_codes

PARSE_ERROR_CODE = "DDP999"
# The engine's own check of suppression comments: a code in one that names no rule silences nothing.
SUPPRESSION_CODE = "DDP100"
# Below this many files, worker start-up costs more than it saves.
PARALLEL_THRESHOLD = 16


@dataclass
class FileResult:
    path: str
    findings: list[Finding]
    source: Optional[str] = None  # the decoded text (for code frames); None when not read as text
    fixed_source: Optional[str] = None  # set by --fix/--diff when fixes changed the file
    fixed: int = 0
    findings_before_fix: list[Finding] = field(default_factory=list)  # reported if the write fails
    error: Optional[str] = None  # an I/O problem with this file (reported, exit 2)
    cached: bool = False
    parsed: bool = False
    # The project modules its analysis read (path -> state, as ProjectSources.dependencies()).
    depends: dict[str, Optional[str]] = field(default_factory=dict)
    transient: bool = False  # given up for a reason that may pass (a time budget): never cached


@dataclass
class RunResult:
    files: list[FileResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # e.g. folders that could not be read

    @property
    def findings(self) -> list[Finding]:
        return sorted((f for r in self.files for f in r.findings), key=Finding.sort_key)

    @property
    def errors(self) -> list[str]:
        return [r.error for r in self.files if r.error]

    @property
    def fixed(self) -> int:
        return sum(r.fixed for r in self.files)


def _parse_error(path: str, message: str, line: int = 1, column: int = 1) -> Finding:
    info = rule_info(PARSE_ERROR_CODE)
    return Finding(
        code=PARSE_ERROR_CODE,
        name=info.name if info else "unparsable-file",
        severity=info.severity if info else Severity.ERROR,
        message=message,
        path=path,
        line=line,
        column=column,
        end_line=line,
        end_column=column,
    )


def decode(data: bytes, path: str) -> Union[str, Finding]:
    """Bytes -> text following PEP 263 (BOM, coding cookie), or a DDP999 finding."""
    if b"\x00" in data:
        return _parse_error(path, "not a Python source file: it contains NUL bytes (a binary file?)")
    try:
        encoding, _ = tokenize.detect_encoding(BytesIO(data).readline)
    except SyntaxError as error:
        return _parse_error(path, f"cannot decode: {error}")
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        return _parse_error(path, f"cannot decode as {encoding}: invalid byte 0x{data[error.start]:02x}", line, column)
    except LookupError:
        return _parse_error(path, f"cannot decode: unknown encoding {encoding!r}")
    if text.startswith("\ufeff"):
        text = text[1:]
    return text


def interested_rules(
    data: bytes, rules: Sequence[type[Rule]], elsewhere: frozenset[bytes] = frozenset()
) -> list[type[Rule]]:
    """The rules whose trigger words (and context words, if any) appear in the raw bytes, or among
    `elsewhere` (the words the project modules the file imports mention).

    This is the cheap pre-filter: a file no rule is interested in is never parsed. Plain substring
    tests on bytes cost microseconds, the parse tens of milliseconds."""

    def mentions(words: tuple[bytes, ...]) -> bool:
        return any(word in elsewhere or word in data for word in words)

    interested = []
    for rule in rules:
        trigger, context = _encoded_words(rule)
        if (not trigger or mentions(trigger)) and (not context or mentions(context)):
            interested.append(rule)
    return interested


def _encoded_words(rule: type[Rule]) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """A rule's trigger and context words as bytes, encoded once per run (asked for every file)."""
    known = _ENCODED_WORDS.get(rule)
    if known is None or known[0] is not rule.trigger_words or known[1] is not rule.context_words:
        known = _ENCODED_WORDS[rule] = (
            rule.trigger_words,
            rule.context_words,
            (tuple(w.encode() for w in rule.trigger_words), tuple(w.encode() for w in rule.context_words)),
        )
    return known[2]


_ENCODED_WORDS: dict[type[Rule], tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[bytes, ...], tuple[bytes, ...]]]] = {}


def project_interested_rules(
    data: bytes, path: str, rules: Sequence[type[Rule]], project: Optional[ProjectSources]
) -> list[type[Rule]]:
    """The pre-filter over a file and the project modules in its import closure: a rule whose APIs
    live in an imported module (the sampler built in `data.py`, the process group created in
    `dist.py`) is interested in the file that uses them. The closure is walked only while some
    rule is still undecided, and stops as soon as none is."""
    interested = interested_rules(data, rules)
    if project is None or len(interested) == len(rules) or not any(word in data for word in CLOSURE_GATE):
        return interested
    vocabulary = _vocabulary()
    own = {word for word in vocabulary if word in data}
    # Each undecided rule as the word sets it needs (one of each), less what the file says itself.
    needs = [
        [frozenset(w.encode() for w in words) for words in (rule.trigger_words, rule.context_words) if words]
        for rule in rules
        if rule not in interested
    ]
    needs = [[words for words in need if own.isdisjoint(words)] for need in needs]

    def enough(found: set[bytes]) -> bool:
        return all(not found.isdisjoint(words) for need in needs for words in need)

    found = project.closure_mentions(Path(path), data, vocabulary, enough)
    if not found:
        return interested
    return interested_rules(data, rules, found)


# A finding that needs another module's facts is reported where the importer does the training: it
# creates or wraps a process group (`DDP` included, however it was imported), starts processes, asks
# for a rank, or runs epochs. Only such a
# file has its import closure read (library code, most of a large tree, is judged by its own bytes,
# which keeps the pre-filter cheap there; torch's own docstrings are full of `.backward()`).
CLOSURE_GATE = tuple(
    word.encode()
    for word in (*launch.LAUNCH_WORDS, "local_rank", "LOCAL_RANK", "get_rank", "hvd.", "epoch", "DDP")
)


def _vocabulary() -> frozenset[bytes]:
    """Every rule's trigger and context words: what the closure walk looks for in each module (one
    vocabulary per run, whatever rules a file selects, so each module is scanned once)."""
    global _VOCABULARY
    if _VOCABULARY is None:
        _VOCABULARY = frozenset(
            word.encode() for rule in all_rules().values() for word in (*rule.trigger_words, *rule.context_words)
        )
    return _VOCABULARY


_VOCABULARY: Optional[frozenset[bytes]] = None


def lint_text(
    text: str,
    path: str,
    rules: Sequence[type[Rule]],
    world_size: Optional[int] = None,
    project: Optional[ProjectSources] = None,
    data: Optional[bytes] = None,
) -> tuple[list[Finding], bool]:
    """Parse once, build the analysis once, run every rule. Returns (findings, parsed).

    With a `project`, the analysis may read the project modules this file imports; findings are
    kept for this file only, and what was read is in `project.dependencies()` (the caller's scope)."""
    with _collector_paused():
        return _parse_and_analyse(text, path, rules, world_size, project, data)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while one file is parsed and analysed. Each of its full
    collections walks every live object, and the file's syntax tree is most of them: a 10,000-line
    file was walked some ten times over, so the cost grew faster than the file (30% of the CPU time
    at 800 training functions, 15% at 100). The tree and the model leave few garbage cycles; reference
    counting frees everything else, and the collector runs as usual once the file is done."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _parse_and_analyse(
    text: str,
    path: str,
    rules: Sequence[type[Rule]],
    world_size: Optional[int],
    project: Optional[ProjectSources],
    data: Optional[bytes],
) -> tuple[list[Finding], bool]:
    deep = isolation.too_deep(text, path)
    if deep is not None:
        return [_parse_error(path, deep[0], deep[1])], True
    normalised: Optional[normalise.Normalised] = None
    try:
        # A module an import of an earlier file already parsed from these very bytes is not parsed again.
        known = project.parsed_already(Path(path), data) if project is not None and data is not None else None
        module = known if known is not None else cst.parse_module(text)
    except cst.ParserSyntaxError as error:
        refused = _syntax_error_finding(text, path, error)
        if refused is not None:
            return [refused], True
        # Valid Python libcst's tokenizer refuses: analyse an equivalent text it accepts.
        normalised = normalise.for_libcst(text)
        if normalised is None:
            return [], False
        try:
            module = cst.parse_module(normalised.text)
        except cst.ParserSyntaxError:
            return [], False
    if project is not None and data is not None:
        project.provide(Path(path), data, module)
    model = _analyse(module, path, world_size, project)
    findings: list[Finding] = []
    for rule_class in rules:
        findings.extend(f for f in rule_class(model).run() if f.path == path)
    if normalised is not None:
        findings = normalised.restore(findings)
    return apply_suppressions(findings, text), True


def _analyse(
    module: cst.Module, path: str, world_size: Optional[int], project: Optional[ProjectSources]
) -> ModuleModel:
    """The one call into the analysis layer (the seam the project-wide tests observe)."""
    return build_analysis(module, path, world_size=world_size, project=project)


def _syntax_error_finding(text: str, path: str, error: cst.ParserSyntaxError) -> Optional[Finding]:
    """libcst's parser reports where its grammar gave up, which can be a line late; CPython's
    compiler names the offending token. Only compiled (never executed), and only on failure.

    None when CPython accepts what libcst refused (libcst's grammar and tokenizer lag CPython's in
    a few corners): the file is valid Python, so it gets no DDP999, only no findings."""
    try:
        compile(text, path, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
        return None
    except SyntaxError as python_error:
        if python_error.lineno:
            return _parse_error(
                path, f"cannot parse: {python_error.msg}", python_error.lineno, max(1, python_error.offset or 1)
            )
    except (ValueError, RecursionError, MemoryError):
        pass
    message = error.message.splitlines()[0] if error.message else "invalid syntax"
    return _parse_error(path, f"cannot parse: {message}", error.raw_line, error.raw_column + 1)


def _selected_rules(codes: Iterable[str]) -> list[type[Rule]]:
    rules = all_rules()
    return [rules[c] for c in sorted(set(codes)) if c in rules]


def lint_bytes(
    data: bytes,
    path: str,
    codes: frozenset[str],
    world_size: Optional[int] = None,
    fix: bool = False,
    *,
    project: Optional[ProjectSources] = None,
    unsafe_fixes: bool = False,
    limits: Optional[isolation.Limits] = None,
) -> FileResult:
    """Lint one file's bytes. Never raises: whatever goes wrong is a DDP999 finding for this file
    (or, for a notebook that is not one, an error for this file)."""
    def lint_python(python: bytes) -> FileResult:
        return _lint_python(python, path, codes, world_size, fix, project, unsafe_fixes, limits)

    if notebook.is_notebook(path):
        return _lint_notebook(data, path, codes, limits, lint_python)
    return lint_python(data)


def _lint_python(
    data: bytes,
    path: str,
    codes: frozenset[str],
    world_size: Optional[int],
    fix: bool,
    project: Optional[ProjectSources],
    unsafe_fixes: bool,
    limits: Optional[isolation.Limits],
) -> FileResult:
    limits = limits or isolation.Limits()
    reason = limits.too_large(len(data))
    if reason is not None:
        return given_up(path, codes, reason)
    if project is None:
        return _lint_bytes(data, path, codes, world_size, fix, project, unsafe_fixes, limits)
    # What the pre-filter and the analysis read of the project is this file's dependencies.
    with project.scope():
        result = _lint_bytes(data, path, codes, world_size, fix, project, unsafe_fixes, limits)
        own = Path(os.path.abspath(path))
        result.depends = {str(p): state for p, state in project.dependencies().items() if p != own}
    return result


def _lint_bytes(
    data: bytes,
    path: str,
    codes: frozenset[str],
    world_size: Optional[int],
    fix: bool,
    project: Optional[ProjectSources],
    unsafe_fixes: bool,
    limits: isolation.Limits,
) -> FileResult:
    # Decoding and the byte pre-filter are cheap and cannot recurse: most files end here, without
    # paying for the isolated analysis thread (its 512 MB stack costs ~2 ms to set up per file).
    prepared = _prepare(data, path, codes, project)
    if isinstance(prepared, FileResult):
        return _check_suppressions(prepared, codes)
    text, selected, rules = prepared
    try:
        result = isolation.contain(
            lambda: _lint_text(text, data, path, codes, selected, rules, world_size, fix, project, unsafe_fixes),
            limits.timeout_s,
        )
    except isolation.AnalysisFailed as failed:
        return given_up(path, codes, str(failed), failed.transient)
    return _check_suppressions(result, codes)


def _check_suppressions(result: FileResult, codes: frozenset[str]) -> FileResult:
    """Add DDP100 for codes in the file's suppression comments that name no rule, on the text as
    it ends up (fixed or not): a text scan, so whether the file was parsed does not matter."""
    if SUPPRESSION_CODE not in codes or result.source is None:
        return result
    final = result.fixed_source if result.fixed_source is not None else result.source
    result.findings = result.findings + unknown_suppression_codes(final, result.path)
    if result.fixed_source is not None:
        result.findings_before_fix = result.findings_before_fix + unknown_suppression_codes(result.source, result.path)
    return result


def _nearest_codes(difflib: Any, written: str, known: Iterable[str]) -> list[str]:
    """The known codes most like `written` (difflib's ratio, at least 0.6), all of them on a tie:
    `DDP08` is one keystroke from DDP008 and from DDP018 alike, and naming one would be a guess."""
    scored = []
    for code in known:
        matcher = difflib.SequenceMatcher(None, written, code)
        if matcher.real_quick_ratio() >= 0.6 and matcher.quick_ratio() >= 0.6:
            scored.append((matcher.ratio(), code))
    best = max((ratio for ratio, _ in scored), default=0.0)
    return sorted(code for ratio, code in scored if ratio >= 0.6 and ratio == best)[:3]


def unknown_suppression_codes(text: str, path: str) -> list[Finding]:
    """DDP100 findings (themselves subject to the file's suppression comments)."""
    known = lint_catalog()
    info = known[SUPPRESSION_CODE]
    findings = []
    for named in unknown_codes(text, known):
        import difflib  # only for a file that has such a code
        form = "`# ddpdoctor: ignore[...]`" if named.ddpdoctor else "`# noqa:`"
        close = _nearest_codes(difflib, named.code, known)
        named_close = [f"`{code}`" for code in close]
        choices = ", ".join(named_close[:-1]) + " or " + named_close[-1] if len(named_close) > 1 else "".join(named_close)
        hint = f"Did you mean {choices}?" if close else "See `ddpdoctor rules` for the rule codes."
        findings.append(
            Finding(
                code=SUPPRESSION_CODE,
                name=info.name,
                severity=info.severity,
                message=f"`{named.written}` in this {form} comment is not a ddpdoctor rule code, so it silences "
                f"nothing. {hint}",
                path=path,
                line=named.line,
                column=named.column,
                end_line=named.line,
                end_column=named.column + len(named.written),
            )
        )
    return apply_suppressions(findings, text)


def _lint_notebook(
    data: bytes,
    path: str,
    codes: frozenset[str],
    limits: Optional[isolation.Limits],
    lint_python: Callable[[bytes], FileResult],
) -> FileResult:
    """A notebook's code cells, joined, linted as one module; findings and fixes mapped back to
    its cells. A file that is not a notebook is an error (exit 2), never "All checks passed"."""
    reason = (limits or isolation.Limits()).too_large(len(data))
    if reason is not None:
        return given_up(path, codes, reason)
    text = decode(data, path)
    if isinstance(text, Finding):
        return FileResult(path, [], error=f"{path}: not a notebook: {text.message}")
    try:
        book = notebook.read(text)
    except notebook.NotebookError as error:
        return FileResult(path, [], error=f"{path}: {error}")
    except notebook.NotPython:
        return FileResult(path, [], source=text)
    inner = lint_python(book.python.encode("utf-8"))
    before = notebook.CellMap.of(book.python)
    result = dataclasses.replace(inner, findings=[before.finding(f) for f in inner.findings], source=text,
                                 fixed_source=None, fixed=0, findings_before_fix=[])
    if inner.fixed_source is None:
        return result
    written = notebook.write_back(book, text, inner.fixed_source)
    unfixed = [before.finding(f) for f in inner.findings_before_fix]
    if isinstance(written, notebook.NotebookError):
        result.findings, result.error = unfixed, f"{path}: fixes not written: {written}"
        return result
    after = notebook.CellMap.of(inner.fixed_source)
    result.findings = [after.finding(f) for f in inner.findings]
    result.findings_before_fix, result.fixed_source, result.fixed = unfixed, written, inner.fixed
    return result


def given_up(path: str, codes: frozenset[str], reason: str, transient: bool = False) -> FileResult:
    """The result for a file whose analysis was given up (too large, too deep, too slow, a bug)."""
    findings = [_parse_error(path, reason)] if PARSE_ERROR_CODE in codes else []
    return FileResult(path, findings, transient=transient)


def _prepare(
    data: bytes, path: str, codes: frozenset[str], project: Optional[ProjectSources]
) -> Union[FileResult, tuple[str, list[type[Rule]], list[type[Rule]]]]:
    """The file's text, the selected rules and those its bytes interest; or, when nothing needs
    parsing (undecodable, or no rule's trigger words), already the file's result."""
    decoded = decode(data, path)
    if isinstance(decoded, Finding):
        findings = [decoded] if PARSE_ERROR_CODE in codes else []
        return FileResult(path, findings)
    selected = _selected_rules(codes)
    rules = project_interested_rules(data, path, selected, project)
    if not rules and (selected or PARSE_ERROR_CODE not in codes):
        return FileResult(path, [], source=decoded)
    return decoded, selected, rules


def _lint_text(
    text: str,
    data: bytes,
    path: str,
    codes: frozenset[str],
    selected: list[type[Rule]],
    rules: list[type[Rule]],
    world_size: Optional[int],
    fix: bool,
    project: Optional[ProjectSources],
    unsafe_fixes: bool,
) -> FileResult:
    findings, parsed = lint_text(text, path, rules, world_size, project, data)
    findings = [f for f in findings if f.code in codes]
    result = FileResult(path, findings, source=text, parsed=parsed)
    if fix:
        # Fixes are re-linted with every selected rule: a fix may add text another rule cares about.
        # With the same project as the first lint, so a finding is judged the same way before and after.
        def relint(new: str) -> list[Finding]:
            if project is None:
                return [f for f in lint_text(new, path, selected, world_size)[0] if f.code in codes]
            with project.scope():
                return [f for f in lint_text(new, path, selected, world_size, project)[0] if f.code in codes]

        from ddpdoctor.lint.fixes import fix_rounds  # difflib, the safe writer: only for --fix/--diff

        fixed_source, remaining, count = fix_rounds(text, findings, relint, unsafe_fixes)
        if count:
            result.findings_before_fix = result.findings
            result.fixed_source, result.findings, result.fixed = fixed_source, remaining, count
    return result


def lint_source(
    source: Union[str, bytes],
    path: str = "<stdin>",
    settings: Optional[Settings] = None,
    fix: bool = False,
    unsafe_fixes: bool = False,
) -> FileResult:
    """Lint one in-memory source (the public API, also used for stdin)."""
    settings = settings or Settings()
    data = source.encode("utf-8") if isinstance(source, str) else source
    codes = settings.codes_for(path, settings.enabled_codes())
    return lint_bytes(data, path, codes, settings.world_size, fix, unsafe_fixes=unsafe_fixes)


def lint_stdin(
    data: bytes,
    name: Optional[str],
    settings: Settings,
    fix: bool = False,
    unsafe_fixes: bool = False,
) -> FileResult:
    """Lint text an editor pipes in as the file `name` (`--stdin-filename`): placed in its project
    as linting that file by path would, so the modules it imports are read from disk and give the
    same findings (the piped text stands for the file itself, also where a module imports it back).
    Without a name, or with one whose folder does not exist, the text is linted alone."""
    path = name or "<stdin>"
    codes = settings.codes_for(path, settings.enabled_codes())
    project: Optional[ProjectSources] = None
    if name is not None and os.path.isdir(os.path.dirname(os.path.abspath(name))):
        project = ProjectSources.for_paths([name])
    return lint_bytes(
        data, path, codes, settings.world_size, fix, project=project, unsafe_fixes=unsafe_fixes, limits=file_limits(settings)
    )


# One per worker process and run (set by lint_paths before it forks its workers, or when serial).
_project: Optional[ProjectSources] = None


def _start_run(roots: tuple[Path, ...]) -> None:
    global _project
    _project = ProjectSources(roots)


Task = tuple[str, frozenset[str], Optional[int], bool, bool, isolation.Limits]


def _lint_file_task(args: Task) -> FileResult:
    path, codes, world_size, fix, unsafe_fixes, limits = args
    try:
        data = read_regular(path, limits.max_bytes)
    except OSError as error:
        return FileResult(path, [], error=f"{path}: cannot read: {error.strerror}")
    if data is None:
        return given_up(path, codes, limits.too_large(limits.max_bytes + 1) or "too large")
    result = lint_bytes(data, path, codes, world_size, fix, project=_project, unsafe_fixes=unsafe_fixes, limits=limits)
    if not fix:
        result.source = None  # the parent re-reads only files with findings, for code frames
    return result


def lint_paths(
    paths: Sequence[str],
    settings: Settings,
    jobs: Optional[int] = None,
    use_cache: bool = True,
    fix: bool = False,
    cache_root: Optional[Path] = None,
    unsafe_fixes: bool = False,
) -> tuple[RunResult, list[str]]:
    """Lint files and folders. Returns the results and the folders that held no Python file."""
    discovered = discover(paths, settings)
    enabled = settings.enabled_codes()
    project = ProjectSources.for_paths(paths)
    cache: Optional[ResultCache] = None
    if use_cache and not fix:
        root = cache_root or settings.root or Path.cwd()
        cache = ResultCache(root, settings.fingerprint() + "-" + content_hash(",".join(sorted(enabled)).encode())[:8])

    run = RunResult()
    limits = file_limits(settings)
    pending: list[tuple[int, Task]] = []
    slots: list[Optional[FileResult]] = []
    digests: dict[int, str] = {}
    for index, path in enumerate(discovered.files):
        codes = settings.codes_for(path, enabled)
        if cache is not None:
            try:
                data = read_regular(path, limits.max_bytes)
            except OSError as error:
                slots.append(FileResult(path, [], error=f"{path}: cannot read: {error.strerror}"))
                continue
            if data is not None:
                key = content_hash(data) + ":" + ",".join(sorted(codes))
                cached = cache.get(path, key, codes, lambda: line_count(data), project.unchanged)
                if cached is not None:
                    slots.append(FileResult(path, [dataclasses.replace(f, path=path) for f in cached], cached=True))
                    continue
                digests[index] = key
        slots.append(None)
        pending.append((index, (path, codes, settings.world_size, fix, unsafe_fixes, limits)))

    workers = jobs if jobs and jobs > 0 else (os.cpu_count() or 1)
    # Forked workers inherit this run's (empty) ProjectSources; a serial run uses it directly.
    _start_run(project.roots)
    try:
        if workers > 1 and len(pending) >= PARALLEL_THRESHOLD:
            from ddpdoctor.lint.workers import run_tasks  # multiprocessing: only for a parallel run

            outcomes = run_tasks(
                _lint_file_task,
                [task for _, task in pending],
                workers,
                limits.timeout_s,
                lambda task, reason: given_up(task[0], task[1], reason, transient=True),
                limits.max_bytes,
            )
        else:
            outcomes = [_lint_file_task(task) for _, task in pending]
    finally:
        _start_run(())  # drop this run's modules: the next run must not see stale ones
    for (index, _), outcome in zip(pending, outcomes):
        slots[index] = outcome
        if cache is not None and outcome.error is None and not outcome.transient and index in digests:
            cache.put(outcome.path, digests[index], outcome.findings, outcome.depends)
    if cache is not None:
        cache.save()
    run.files = [slot for slot in slots if slot is not None]
    run.warnings = list(discovered.warnings)
    return run, discovered.skipped_dirs_without_python


def file_limits(settings: Settings) -> isolation.Limits:
    defaults = isolation.Limits()
    return isolation.Limits(
        max_bytes=int(settings.max_file_mb * 1024 * 1024) if settings.max_file_mb else defaults.max_bytes,
        timeout_s=settings.file_timeout_s or defaults.timeout_s,
    )


def line_count(data: bytes) -> int:
    """An upper bound of the lines libcst counts ("\r\n", "\r" and "\n" each end one)."""
    return data.count(b"\n") + data.count(b"\r") + 1


def read_text_for_frames(path: str) -> Optional[str]:
    try:
        data = read_regular(path, isolation.Limits().max_bytes)
    except OSError:
        return None
    if data is None:
        return None
    decoded = decode(data, path)
    return decoded if isinstance(decoded, str) else None

