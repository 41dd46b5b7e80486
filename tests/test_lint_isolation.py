"""One bad file never stops the run: deep nesting, huge files, slow files, crashes, killed runs.

Each file below once ended the whole run (exit 2, a segmentation fault, minutes and gigabytes).
Now each gets a DDP999 with its reason or is analysed like any other file, and the others are
linted as usual.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from process_scan import alive, children

from ddpdoctor.cli import main
from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_paths, lint_source
from ddpdoctor.lint.isolation import AnalysisFailed, Limits, contain
from ddpdoctor.lint.workers import run_tasks

# Enough for two rules to fire (AMP001 at line 6, DDP011 at line 5, for the barrier of line 7): a
# file analysed to the end shows both, a file given up shows one DDP999.
HEADER = (
    "import torch\n"
    "import torch.distributed as dist\n"
    "from torch.nn.parallel import DistributedDataParallel as DDP\n"
    "from torch.utils.data import DistributedSampler\n"
    "dist.init_process_group('nccl')\n"
    "scaler = torch.cuda.amp.GradScaler()\n"
    "dist.barrier()\n"
)
ANALYSED = ["AMP001", "DDP011"]
TRAINING_FUNCTION = """
def train_{n}(model, dataset, optimizer):
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=8)
    for epoch in range(3):
        for x, y in loader:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
        torch.save(model.state_dict(), "ckpt_{n}.pt")
"""
ALL = Settings(select=("ALL",))


def codes(source: str, settings: Settings = ALL) -> list[str]:
    return sorted(f.code for f in lint_source(source, "t.py", settings).findings)


def messages(source: str, settings: Settings = ALL) -> list[str]:
    return [f"{f.code} {f.line} {f.message}" for f in lint_source(source, "t.py", settings).findings]


@pytest.mark.parametrize(
    "body",
    [
        "x = " + "[" * 150 + "]" * 150,
        "x = " + " + ".join(["1"] * 400),
        "x = " + " + ".join(["'a'"] * 500),
        "x = " + "(" * 199 + "1" + ")" * 199,
    ],
    ids=["150-nested-brackets", "400-term-sum", "500-part-concatenation", "199-nested-parentheses"],
)
def test_deep_but_valid_code_is_analysed_like_any_other(body: str) -> None:
    source = HEADER + body + "\n"
    compile(source, "t.py", "exec")  # valid Python: it must get findings, not DDP999
    assert codes(source) == ANALYSED


def test_nesting_python_refuses_is_ddp999_not_a_wrong_finding() -> None:
    source = HEADER + "x = " + "(" * 1000 + "1" + ")" * 1000 + "\n"
    with pytest.raises(SyntaxError):
        compile(source, "t.py", "exec")
    assert messages(source) == ["DDP999 8 too deeply nested for the parser (too many nested parentheses)"]


def test_a_6000_link_attribute_chain_is_refused_at_once_not_a_segfault(tmp_path: Path) -> None:
    """libcst's native parser overflows the C stack on it; CPython's parser refuses it too."""
    (tmp_path / "chain.py").write_text(HEADER + "x = a" + ".b" * 6000 + "\n")
    (tmp_path / "other.py").write_text(HEADER)
    completed = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "lint", "--no-cache", "--select", "ALL", "chain.py", "other.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert completed.returncode == 1, completed.stderr
    assert "chain.py:1:1: DDP999 too deeply nested for the parser" in completed.stdout
    assert "other.py:6:10: AMP001" in completed.stdout and "other.py:5:1: DDP011" in completed.stdout


def test_a_file_over_the_size_limit_is_skipped_with_ddp999(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.ddpdoctor]\nselect = ['ALL']\nmax-file-size = 0.01\n")
    (tmp_path / "big.py").write_text(HEADER + "x = 1\n" * 3000)  # ~18 KB > 10 KB
    (tmp_path / "small.py").write_text(HEADER)
    result = _lint(tmp_path, ["big.py", "small.py"])
    assert result.exit_code == 1, result.output
    assert "big.py:1:1: DDP999 larger than 0.01 MB: skipped (see max-file-size)" in result.output
    assert "small.py:6:10: AMP001" in result.output


@pytest.mark.parametrize("megabytes, shown", [(0.25, "0.25"), (2, "2"), (2.5, "2.5"), (128, "128")])
def test_the_size_limit_is_shown_as_configured(megabytes: float, shown: str) -> None:
    limits = Limits(max_bytes=int(megabytes * 1024 * 1024))
    assert limits.too_large(limits.max_bytes) is None
    assert limits.too_large(limits.max_bytes + 1) == f"larger than {shown} MB: skipped (see max-file-size)"


def test_a_50_mb_file_is_skipped_without_being_read(tmp_path: Path) -> None:
    big = tmp_path / "huge.py"
    with open(big, "wb") as handle:
        handle.write(HEADER.encode())
        handle.truncate(50 * 1024 * 1024)  # sparse: no 50 MB written to the shared disk
    (tmp_path / "small.py").write_text(HEADER)
    run, _ = lint_paths([str(big), str(tmp_path / "small.py")], ALL, use_cache=False)
    by_file = {Path(r.path).name: [f"{f.code} {f.message}" for f in r.findings] for r in run.files}
    assert by_file["huge.py"] == ["DDP999 larger than 2 MB: skipped (see max-file-size)"]
    assert sorted(c.split()[0] for c in by_file["small.py"]) == ANALYSED


def test_a_file_past_its_time_budget_gets_ddp999_and_the_run_goes_on(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.ddpdoctor]\nselect = ['ALL']\nfile-timeout = 0.2\n")
    # Valid Python whose analysis takes seconds (hundreds of training functions, each a sampler, a
    # loader loop and a save; the analysis is linear but not free); the others take milliseconds.
    (tmp_path / "slow.py").write_text(HEADER + "".join(TRAINING_FUNCTION.format(n=n) for n in range(400)))
    for number in range(3):
        (tmp_path / f"ok{number}.py").write_text(HEADER)
    result = _lint(tmp_path, ["."])
    assert result.exit_code == 1, result.output
    assert "slow.py:1:1: DDP999 analysis exceeded its time budget (0.2 s)" in result.output
    for number in range(3):
        assert f"ok{number}.py:6:10: AMP001" in result.output


def test_a_worker_that_crashes_or_hangs_costs_only_its_own_file() -> None:
    """The pool itself, with real worker processes: a segfault and a hang in native code."""
    tasks = ["ok", "segv", "ok", "hang", "ok", "raise", "ok"]
    outcomes = run_tasks(_task, tasks, 2, 0.5, lambda task, why: f"lost: {why}")
    assert [outcomes[i] for i in (0, 2, 4, 6)] == ["done ok"] * 4
    assert outcomes[1] == "lost: the analysis crashed (SIGSEGV; out of memory or a parser bug)"
    assert outcomes[3] == "lost: analysis exceeded its time budget (0.5 s)"
    assert outcomes[5] == "lost: internal error in the analysis: ZeroDivisionError"


def _task(kind: str) -> str:
    if kind == "segv":
        faulthandler.disable()  # pytest's handler would print this deliberate crash's stack
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "hang":
        time.sleep(600)
    if kind == "raise":
        return str(1 / 0)
    return f"done {kind}"


def _lint(cwd: Path, args: list[str]) -> "object":
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, ["lint", "--no-cache", *args], catch_exceptions=False)
    finally:
        os.chdir(old)


# ------------------------------------------------------------------------- workers die with lint


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killing_lint_leaves_no_worker_running(tmp_path: Path, sig: signal.Signals) -> None:
    slow = HEADER + ("x = a" + "[0]" * 500 + "\n") * 4
    for number in range(20):
        (tmp_path / f"f{number:02d}.py").write_text(slow)
    process = subprocess.Popen(
        [sys.executable, "-m", "ddpdoctor", "lint", "--no-cache", "--select", "ALL", "-j", "2", "."],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        workers: set[int] = set()
        while len(workers) < 2 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
            workers = children(process.pid)
        assert len(workers) >= 2, "the workers never started"
        process.send_signal(sig)
        process.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in workers if alive(pid)]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _allocate(size: int) -> str:
    import resource

    if resource.getrlimit(resource.RLIMIT_AS)[0] > 4 * 1024**3:
        return "no memory limit"  # never try 6 GiB on a shared machine without one
    return f"allocated {len(bytearray(size))}"


_STATE: list[str] = []


def _remember(value: str) -> None:
    _STATE.append(value)


def _state(task: int) -> str:
    return ",".join(_STATE)


def test_the_initializer_runs_once_in_each_worker() -> None:
    assert run_tasks(_state, [1, 2, 3], 1, 60, lambda task, why: why, initializer=_remember, initargs=("ready",)) == [
        "ready"
    ] * 3
    assert _STATE == []  # in the workers, not here


def test_a_worker_cannot_take_more_than_its_memory_limit() -> None:
    """6 GiB is refused at once (the worker's address-space limit is 4 GiB); 1 MiB is fine."""
    outcomes = run_tasks(_allocate, [6 * 1024**3, 1024**2], 1, 60, lambda task, why: f"lost: {why}")
    assert outcomes == ["lost: internal error in the analysis: MemoryError", f"allocated {1024**2}"]


@pytest.mark.parametrize(
    ("error", "reason", "transient"),
    [
        (MemoryError(), "ran out of memory analysing this file", True),
        (RecursionError(), "too deeply nested for the parser", False),
        (KeyError("x"), "internal error in the analysis: KeyError", False),
    ],
)
def test_a_failure_inside_the_analysis_is_a_reason(error: BaseException, reason: str, transient: bool) -> None:
    def work() -> None:
        raise error

    with pytest.raises(AnalysisFailed) as failed:
        contain(work, 10.0)
    assert (str(failed.value), failed.value.transient) == (reason, transient)


def test_python_code_past_its_budget_is_stopped_at_once() -> None:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    start = time.monotonic()
    try:
        with pytest.raises(AnalysisFailed, match=r"time budget \(0.2 s\)"):
            contain(spin, 0.2)
        elapsed = time.monotonic() - start
    finally:
        stop.set()
    assert elapsed < 4  # interrupted, not waited out (the wait for a native call is 5 s)


def test_the_budget_counts_from_the_start_even_when_the_work_holds_the_gil_first() -> None:
    """The analysis thread may take the GIL at once and keep it in native code (libcst's parser):
    the time it spent before the caller got the GIL back counts against the budget."""
    import ctypes

    def native_then_python() -> None:
        # 0.5 s in C with the GIL held (PyOS_... sleep does not release it), then Python that would
        # still be running when a budget started late ran out.
        libc = ctypes.PyDLL(None)  # PyDLL: the call keeps the GIL, as the parser does
        libc.usleep(500_000)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            pass

    started = time.monotonic()
    with pytest.raises(AnalysisFailed, match="time budget"):
        contain(native_then_python, 0.6)
    assert time.monotonic() - started < 0.95
