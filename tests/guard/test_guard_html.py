"""`ddpdoctor guard --html FILE`: the page of a run, drawn from real gloo ranks and loaded in a real
headless Chromium (tests/guard/browser.py), which reports what the page showed, every request it made
(none may be made) and every script error or Content-Security-Policy refusal (none may happen).

The pieces (the bounded step series, escaping, the atomic write, the command's usage errors) are
tested without ranks or a browser.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import browser
from guard_helpers import GUARD, REPO, forklaunch, guard_env, planted, run_guard
from ddpdoctor.findings import Finding, Severity
from ddpdoctor.guard import html, timeline
from ddpdoctor.guard.doctor import RankState
from ddpdoctor.guard.timeline import StepSeries, Timeline

PY = sys.executable
SCRIPT = "fixtures/guard/{}"
# What the page shows, read in the browser after its script ran.
SHOWN = {
    "rendered": "document.documentElement.getAttribute('data-rendered')",
    "ranks": "[...document.querySelectorAll('#ranks tr.rank')].map(r => +r.dataset.rank)",
    "codes": "[...document.querySelectorAll('#findings tr.finding')].map(r => r.dataset.code)",
    "finding_text": "[...document.querySelectorAll('#findings tr.finding')].map(r => r.innerText)",
    "lines": "[...document.querySelectorAll('#step-chart g.series')].map(g => "
             "[+g.dataset.rank, g.querySelector('polyline').getAttribute('points').trim().split(' ').length])",
    "moments": "[...document.querySelectorAll('section.moment')].map(s => s.dataset.code)",
    # Per moment, the world group's rows: each rank's cell as "class|text".
    "cells": "[...document.querySelectorAll('section.moment')].map(s => [...s.querySelectorAll("
             "'table[data-group=\"W\"] tr.seq')].map(r => [...r.querySelectorAll('td')].map("
             "c => c.className + '|' + c.innerText)))",
    "external": "[...document.querySelectorAll('[src],[href],link,iframe,object,embed,img')].length",
    "scripts": "document.scripts.length",
}


# ---------------------------------------------------------------- the pieces


def test_step_series_holds_every_step_up_to_its_bound_then_halves() -> None:
    series = StepSeries(bound=10)
    for step in range(1, 11):
        series.add(step, step / 1000)
    assert series.width == 1 and [p[0] for p in series.points()] == list(range(1, 11))
    series.add(11, 0.5)  # one past the bound: pairs of steps merge
    assert series.width == 2
    assert series.points() == [(2, 0.0015, 0.002), (4, 0.0035, 0.004), (6, 0.0055, 0.006), (8, 0.0075, 0.008),
                               (10, 0.0095, 0.01), (12, 0.5, 0.5)]


def test_step_series_stays_bounded_and_keeps_every_step_and_the_slowest_one() -> None:
    series = StepSeries(bound=100)
    times = {step: 0.01 + (0.3 if step == 4321 else 0.0) + (step % 7) / 1000 for step in range(2, 10_001)}
    for step, seconds in times.items():
        series.add(step, seconds)
    assert len(series.buckets) <= 100
    assert sum(int(b[2]) for b in series.buckets) == len(times)
    assert sum(b[1] for b in series.buckets) == pytest.approx(sum(times.values()))
    assert max(most for _, _, most in series.points()) == max(times.values())
    steps = [p[0] for p in series.points()]
    assert steps == sorted(steps) and steps[-1] >= 10_000


def test_a_large_job_keeps_fewer_points_per_rank() -> None:
    line = Timeline()
    line.step(0, 2, 0.01, 2)
    line.step(0, 2, 0.01, 2048)  # the series is sized when its rank's first step arrives
    line.step(1, 2, 0.01, 2048)
    line.step(2, 2, 0.01, 10 ** 6)
    assert [line.series[r].bound for r in range(3)] == [timeline.MAX_POINTS, 200_000 // 2048, timeline.MIN_POINTS]


def _finding(code: str, ranks: list[int], message: str = "m", path: str = "train.py", line: int = 1) -> Finding:
    return Finding(code=code, name=code.lower(), severity=Severity.ERROR, message=message, path=path, line=line,
                   source="guard", details={"ranks": ranks})


def test_only_findings_about_collectives_keep_the_ranks_last_collectives_and_only_the_first_few() -> None:
    waiting = RankState(0, 2, recent={("W", 0): ("barrier", "", "t.py", 3), ("W", 1): ("all_reduce", "f32[1]", "t.py", 4)},
                        inflight=("W", 1, 10.0))
    gone = RankState(1, 2, recent={("W", 0): ("barrier", "", "t.py", 3)}, connected=False)
    kept = Timeline()
    kept.capture(_finding("GRD003", [1]), {0: waiting, 1: gone}, 12.5)
    assert kept.moments == []
    for _ in range(timeline.MAX_MOMENTS + 1):
        kept.capture(_finding("GRD002", [1]), {0: waiting, 1: gone}, 12.5)
    assert len(kept.moments) == timeline.MAX_MOMENTS
    moment = kept.moments[0]
    assert [(c.seq, c.state, c.waited) for c in moment.calls[0]] == [(0, "done", 0.0), (1, "waiting", 2.5)]
    assert moment.status == {0: "running", 1: "exited"}


HOSTILE = "</title></style><script>alert(1)</script>\"><img src=http://127.0.0.9/x onerror=alert(2)>\x1b[31m\ud800"


def hostile_report() -> dict[str, Any]:
    return {"command": [PY, HOSTILE], "exit_code": 1, "world_size": 2, "summary": {"ranks": 2},
            "findings": [{"code": "GRD001", "severity": "error", "ranks": [1], "message": HOSTILE, "path": HOSTILE,
                          "line": 7}]}


def hostile_timeline() -> Timeline:
    line = Timeline()
    ranks = {r: RankState(r, 2, recent={("W", 0): (HOSTILE, HOSTILE, HOSTILE, 9)}) for r in range(2)}
    line.capture(_finding("GRD001", [1]), ranks, 1.0)
    for step in range(2, 40):
        line.step(0, step, 0.01, 2)
        line.step(1, step, 0.02, 2)
    return line


def test_text_from_the_job_is_escaped_everywhere(tmp_path: Path) -> None:
    target = tmp_path / "run.html"
    html.write(str(target), html.render(hostile_report(), hostile_timeline()))
    page = target.read_bytes().decode("utf-8")  # a lone surrogate was written as its escape
    assert page.count("<script") == 1 and page.count("</script>") == 1  # the page's own
    assert "<img" not in page and "alert(1)</script>" not in page and "\x1b" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "\\x1b[31m" in page and "\\ud800" in page


def test_the_policy_allows_exactly_the_inline_style_and_script() -> None:
    page = html.render(hostile_report(), None)
    style = re.search(r"<style>(.*?)</style>", page, re.S)
    script = re.search(r"<script>(.*?)</script>", page, re.S)
    assert style and script
    assert f"style-src '{html._sha256(style.group(1))}'" in page
    assert f"script-src '{html._sha256(script.group(1))}'" in page
    assert "default-src 'none'" in page


def test_write_replaces_the_file_atomically_and_keeps_its_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "run.html"
    target.write_text("old")
    target.chmod(0o640)
    html.write(str(target), "new")
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640

    def broken(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError):
        html.write(str(target), "newer")
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["run.html"]


def test_a_new_page_gets_the_permissions_of_a_new_file(tmp_path: Path) -> None:
    umask = os.umask(0o027)
    try:
        html.write(str(tmp_path / "run.html"), "page")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "run.html").stat().st_mode) == 0o640


def test_a_large_job_draws_the_ranks_the_findings_name_then_the_slowest() -> None:
    line = Timeline()
    for r in range(40):
        for step in range(2, 6):
            line.step(r, step, 0.05 if r == 20 else 0.01 + r / 1e5, 40)
    # Rank 33 (named), then by median step time: rank 20, then 39, 38, ... down to 25 (33 is in already).
    assert html.chosen_ranks(40, line, [33]) == [20, *range(25, 40)]
    page = html.render({"command": ["x"], "exit_code": 0, "world_size": 40, "findings": []}, line)
    assert page.count('<g class="series') == html.MAX_RANKS_DRAWN and "16 of 40 ranks drawn" in page
    assert page.count('<tr class="rank"') == 40  # the table lists every rank


def test_a_run_that_no_rank_joined_still_gets_its_page(tmp_path: Path) -> None:
    page = tmp_path / "run.html"
    run = run_guard("--html", str(page), command=[PY, "-c", "print('no ranks here')"])
    assert run.returncode == 0
    text = page.read_text()
    assert "no rank reported to this guard" in text and "No finding." in text
    assert "No optimizer step was timed" in text and "No collective was recorded." in text


def guard(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*GUARD, *args], cwd=REPO, env=guard_env("html"), capture_output=True, text=True, timeout=60)


def test_an_unwritable_page_is_a_one_line_usage_error_before_the_job_runs(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    job = ["--", PY, "-c", f"open({str(ran)!r}, 'w')"]
    missing = tmp_path / "no" / "run.html"
    result = guard("--html", str(missing), *job)
    assert result.returncode == 2
    assert result.stderr == f"ddpdoctor: error: --html: cannot write {missing}: No such file or directory\n"
    folder = guard("--html", str(tmp_path), *job)
    assert folder.returncode == 2 and len(folder.stderr.strip().splitlines()) == 1
    assert folder.stderr.startswith("ddpdoctor: error: ") and "is a directory" in folder.stderr
    assert not ran.exists()
    with_dumps = guard("--html", str(tmp_path / "run.html"), "--analyze", str(tmp_path))
    assert with_dumps.returncode == 2 and "--html" in with_dumps.stderr
    assert len(with_dumps.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------- in the browser


def test_without_chromium_ci_fails_instead_of_skipping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(browser, "chromium", lambda: None)
    monkeypatch.delenv("DDPDOCTOR_REQUIRE_CHROMIUM", raising=False)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception):
        browser.require_chromium()
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        browser.require_chromium()
    monkeypatch.setenv("DDPDOCTOR_REQUIRE_CHROMIUM", "1")
    with pytest.raises(pytest.fail.Exception):
        browser.require_chromium()


def test_the_browser_check_sees_a_request_when_a_page_makes_one(tmp_path: Path) -> None:
    """The check below must be able to fail: a page that loads an image is caught."""
    page = tmp_path / "leaky.html"
    page.write_text('<!DOCTYPE html><img src="http://127.0.0.9:9/x.png"><script>document.documentElement.'
                    "setAttribute('data-rendered', '1')</script>")
    loaded = browser.load(page, {"rendered": SHOWN["rendered"]})
    assert loaded.requests == ["http://127.0.0.9:9/x.png"] and loaded.values["rendered"] == "1"


def test_hostile_text_stays_text_in_the_browser(tmp_path: Path) -> None:
    page = tmp_path / "hostile.html"
    html.write(str(page), html.render(hostile_report(), hostile_timeline()))
    loaded = browser.load(page, SHOWN)
    assert (loaded.requests, loaded.errors, loaded.messages) == ([], [], [])
    shown = loaded.values
    assert shown["rendered"] == "1" and shown["external"] == 0 and shown["scripts"] == 1
    assert shown["codes"] == ["GRD001"] and "<script>alert(1)</script>" in shown["finding_text"][0]
    assert shown["ranks"] == [0, 1] and shown["lines"] == [[0, 38], [1, 38]]


def test_the_cursor_reads_off_each_ranks_step_time_and_a_click_hides_a_rank(tmp_path: Path) -> None:
    page = tmp_path / "steps.html"
    html.write(str(page), html.render(hostile_report(), hostile_timeline()))
    # Over the chart's middle (step 20 of 2..39), then a click on rank 1's key.
    hover = ("(() => { const svg = document.getElementById('step-chart'), box = svg.getBoundingClientRect();"
             " const x = box.left + (64 + (960 - 16 - 64) * (20 - 2) / (39 - 2)) * box.width / 960;"
             " svg.dispatchEvent(new MouseEvent('mousemove', {clientX: x, clientY: box.top + 50}));"
             " return document.getElementById('readout').textContent; })()")
    click = ("(() => { document.querySelector('ul.keys li[data-rank=\"1\"]').click();"
             " return [...document.querySelectorAll('#step-chart g.series')].map(g => g.classList.contains('hidden'));"
             " })()")
    loaded = browser.load(page, {"hover": hover, "click": click, "after": hover})
    assert (loaded.errors, loaded.messages) == ([], [])
    assert loaded.values["hover"] == "step 20 \u2014 rank 0: 10.0 ms, rank 1: 20.0 ms"
    assert loaded.values["click"] == [False, True]
    assert loaded.values["after"] == "step 20 \u2014 rank 0: 10.0 ms"


def load_run(page: Path) -> dict[str, Any]:
    loaded = browser.load(page, SHOWN)
    assert (loaded.requests, loaded.errors, loaded.messages) == ([], [], []), loaded
    assert loaded.values["rendered"] == "1" and loaded.values["external"] == 0
    return loaded.values


def run_with_page(tmp_path: Path, *args: str, command: list[str]) -> tuple[Any, dict[str, Any]]:
    page = tmp_path / "run.html"
    run = run_guard("--html", str(page), *args, command=command)
    return run, load_run(page)


@pytest.mark.slow
def test_a_stall_shows_the_waiting_rank_beside_the_one_that_never_came(tmp_path: Path) -> None:
    run, shown = run_with_page(tmp_path, "--stall-timeout", "3", command=forklaunch(2, "blocked_rank.py"))
    assert run.returncode == 1 and run.codes() == ["GRD002"], run.stderr[-3000:]
    assert shown["ranks"] == [0, 1] and shown["codes"] == ["GRD002"]
    assert f"blocked_rank.py:{planted('blocked_rank.py', 'GRD002')}" in shown["finding_text"][0]
    assert shown["moments"] == ["GRD002"]
    last = shown["cells"][0][-1]  # the position rank 0 waits in, and rank 1 never reached
    assert last[0].startswith("call waiting|DDP gradient all-reduce") and last[1] == "call missing|not entered"
    # Both ranks made two optimizer steps before rank 1 blocked (the first is not timed: nothing before it).
    assert shown["lines"] == [[0, 1], [1, 1]]


@pytest.mark.slow
def test_a_mismatch_marks_the_odd_call_side_by_side(tmp_path: Path) -> None:
    run, shown = run_with_page(tmp_path, "--stall-timeout", "3", command=forklaunch(3, "extra_collective.py"))
    assert run.returncode == 1 and run.codes() == ["GRD001", "GRD002"], run.stderr[-3000:]
    assert shown["ranks"] == [0, 1, 2] and sorted(shown["codes"]) == ["GRD001", "GRD002"]
    assert shown["moments"][0] == "GRD001"
    odd = [row for row in shown["cells"][0] if any("odd" in cell for cell in row)]
    assert odd, shown["cells"][0]
    row = odd[0]
    line = planted("extra_collective.py", "GRD001")
    assert "odd" in row[1] and f"all_reduce(float32[1])\nfixtures/guard/extra_collective.py:{line}" in row[1]
    assert "odd" not in row[0] and "odd" not in row[2] and "barrier()" in row[0] and "barrier()" in row[2]


@pytest.mark.slow
def test_drift_is_listed_and_every_rank_has_its_step_times(tmp_path: Path) -> None:
    run, shown = run_with_page(tmp_path, command=forklaunch(2, "short_drift.py"))
    assert run.codes() == ["GRD003"], run.stderr[-3000:]
    assert shown["codes"] == ["GRD003"] and f"{SCRIPT.format('short_drift.py')}:" in shown["finding_text"][0]
    assert shown["lines"] == [[0, 29], [1, 29]]  # 30 steps, each timed from the one before
    assert shown["moments"] == [""]  # no finding about collectives: the ranks' last ones, at the end


@pytest.mark.slow
def test_a_clean_run_says_so_and_shows_its_last_collectives(tmp_path: Path) -> None:
    run, shown = run_with_page(tmp_path, command=forklaunch(2, "clean_ddp.py"))
    assert run.returncode == 0 and run.codes() == [], run.stderr[-3000:]
    assert shown["codes"] == [] and shown["ranks"] == [0, 1]
    assert [rank for rank, points in shown["lines"] if points > 1] == [0, 1]
    assert shown["moments"] == [""]
    assert all(cell.startswith("call done|") for row in shown["cells"][0] for cell in row)
    page = (tmp_path / "run.html").read_text()
    assert "No finding." in page
