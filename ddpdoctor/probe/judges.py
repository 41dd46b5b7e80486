"""Verdict logic shared by several checks, on the entries the ranks reported. No torch: judges
run on rank 0 and in the parent, and their unit tests need no process group."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ddpdoctor.probe import results as R
from ddpdoctor.probe.tolerance import step_tolerance


def step_detail(diff: float, dtype: str, samples: int, shards: int, lr: float, grad_abs_sum: float,
                param_abs_max: float) -> dict[str, Any]:
    """What a rank reports about one distributed step against its single-process reference."""
    return {"max_abs_diff": diff, "dtype": dtype, "samples": samples, "shards": shards, "lr": lr,
            "grad_abs_sum": grad_abs_sum, "param_abs_max": param_abs_max}


def step_bound(detail: dict[str, Any]) -> float:
    return step_tolerance(detail["dtype"], detail["samples"], detail["shards"], detail["lr"],
                          detail["grad_abs_sum"], detail["param_abs_max"])


def judge_step(name: str, what: str, entries: list[R.RankEntry]) -> R.CheckRecord:
    """Fail each rank whose parameters are farther from the reference than the rounding bound."""
    for e in entries:
        if e["status"] != R.PASS:
            continue
        d = e["detail"]
        bound = step_bound(d)
        d["tolerance"] = bound
        if not d["max_abs_diff"] <= bound:  # NaN fails too
            e["status"] = R.FAIL
            e["message"] = f"parameters differ from the single-process step by {d['max_abs_diff']:.3g} (> bound {bound:.3g})"
    rec = R.record(name, entries)
    if not R.blame_failures(rec):
        live = [e for e in entries if e["status"] == R.PASS]
        worst = max((e["detail"]["max_abs_diff"] for e in live), default=0.0)
        bound = min((e["detail"]["tolerance"] for e in live), default=0.0)
        dtype = live[0]["detail"]["dtype"] if live else "?"
        rec["summary"] = f"{what} ({dtype}, max diff {worst:.1g} <= rounding bound {bound:.1g})"
    return rec


def differ_from_reference(entries: list[R.RankEntry], key: str, diff_key: str, tol_key: str) -> set[int]:
    """The ranks whose value of `key` (a hash) is wrong.

    Each rank measured its distance from a reference it computed itself (`diff_key`, allowed
    `tol_key`, 0 when absent): the ranks beyond it are wrong, whatever the others hold -- exact on
    any number of ranks, two included. Only when every rank is within its reference and the hashes
    still disagree (a difference the reference cannot see) does the majority decide: the odd ones
    out, or every rank when no value has a strict majority, since none can be trusted."""
    counts = Counter(e["detail"][key] for e in entries)
    far = {e["rank"] for e in entries if not e["detail"][diff_key] <= e["detail"].get(tol_key, 0.0)}  # NaN is far
    if far or len(counts) <= 1:
        return far
    top, n = counts.most_common(1)[0]
    if n * 2 > len(entries):
        return {e["rank"] for e in entries if e["detail"][key] != top}
    return {e["rank"] for e in entries}


def version_disagreements(entries: list[R.RankEntry], keys: tuple[str, ...]) -> dict[int, list[str]]:
    """rank -> "torch 2.4.1 (others: ...)" for each version key on which the ranks disagree: the
    minority when there is a strict majority, every rank when there is none."""
    problems: dict[int, list[str]] = {}
    for key in keys:
        counts = Counter(str(e["detail"]["versions"].get(key)) for e in entries)
        if len(counts) > 1:
            majority = counts.most_common(1)[0][0]
            for e in entries:
                value = str(e["detail"]["versions"].get(key))
                if value != majority or counts[majority] * 2 <= len(entries):
                    problems.setdefault(e["rank"], []).append(f"{key} {value} (others: {dict(counts)})")
    return problems


def fail_ranks(entries: list[R.RankEntry], problems: dict[int, list[str]]) -> None:
    for e in entries:
        if e["rank"] in problems:
            e["status"] = R.FAIL
            e["message"] = "; ".join(problems[e["rank"]])
