"""The judges' tolerances, pinned: each passes just inside its bound and fails just past it, the
bounds are the arithmetic's (not constants), and healthy reductions at many ranks stay inside."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks.allreduce import judge_mean, judge_sum
from ddpdoctor.probe.judges import judge_step, step_bound, step_detail
from ddpdoctor.probe.tolerance import gamma, mean_tolerance, step_tolerance, sum_tolerance, unit_roundoff


def test_unit_roundoff_is_half_an_ulp_of_one() -> None:
    for name in ("float16", "bfloat16", "float32", "float64"):
        assert unit_roundoff(name) == torch.finfo(getattr(torch, name)).eps / 2
    assert unit_roundoff("int64") == 0.0
    with pytest.raises(ValueError, match="complex64"):
        unit_roundoff("complex64")


def test_sum_bound_is_gamma_of_the_number_of_terms() -> None:
    u = 2.0 ** -24
    assert sum_tolerance("float32", 2) == pytest.approx(2 * u / (1 - 2 * u), rel=1e-12)
    assert mean_tolerance("float32", 2) == pytest.approx(3 * u / (1 - 3 * u), rel=1e-12)
    assert sum_tolerance("int64", 64) == 0.0
    # It grows with the ranks summed, and there is no bound once n*u reaches 1.
    assert sum_tolerance("bfloat16", 16) > sum_tolerance("bfloat16", 9) > sum_tolerance("bfloat16", 2)
    assert gamma(256, 2.0 ** -8) == math.inf


@pytest.mark.parametrize("dtype, world", [("float32", 2), ("float32", 4), ("float16", 3), ("bfloat16", 16)])
def test_all_reduce_judge_passes_just_inside_and_fails_just_past_its_bound(dtype: str, world: int) -> None:
    exact = torch.full((5,), 1000.0, dtype=torch.float64)
    tol = sum_tolerance(dtype, world)
    assert judge_sum(exact * (1 + 0.99 * tol), exact, dtype, world) == {}
    failure = judge_sum(exact * (1 + 1.01 * tol), exact, dtype, world)
    assert failure["dtype"] == dtype and failure["max_rel_err"] > tol and failure["first_bad_index"] == 0
    assert judge_mean(exact * (1 + 0.99 * mean_tolerance(dtype, world)), exact, dtype, world) == {}
    assert judge_mean(exact * (1 + 1.01 * mean_tolerance(dtype, world)), exact, dtype, world) != {}


def test_all_reduce_float32_error_of_1e_3_fails_on_two_ranks() -> None:
    # What a loose constant (say 1e-1) would let through.
    exact = torch.tensor([3.0, 6.0], dtype=torch.float64)
    assert judge_sum(exact * (1 + 1e-3), exact, "float32", 2) != {}
    assert judge_sum(torch.tensor([3.0, 7.0]), exact, "int64", 2)["first_bad_index"] == 1


def _sum_in(dtype: torch.dtype, parts: list[torch.Tensor], order: str) -> torch.Tensor:
    """Add the parts with one rounding per addition in `dtype`, sequentially or pairwise."""
    if order == "pairwise":
        while len(parts) > 1:
            parts = [parts[i] + parts[i + 1] if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
        return parts[0]
    ordered = parts if order == "forward" else parts[::-1]
    total = ordered[0].clone()
    for part in ordered[1:]:
        total = total + part
    return total


@pytest.mark.parametrize("world", [2, 3, 9, 16, 64])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("order", ["forward", "backward", "pairwise"])
def test_healthy_low_precision_sums_over_many_ranks_pass(world: int, dtype: str, order: str) -> None:
    # The probe's own inputs, reduced in the target dtype in several orders: whatever order a
    # backend uses, a healthy sum stays inside the bound (issue 15: 9 and 16 bfloat16 ranks failed).
    base = torch.arange(1023) % 7 + 1
    parts = [(base * (r + 1)).to(getattr(torch, dtype)) for r in range(world)]
    got = _sum_in(getattr(torch, dtype), parts, order)
    exact = base.double() * (world * (world + 1) // 2)
    if dtype == "float16" and 7 * world * (world + 1) // 2 > 65504:
        pytest.skip("beyond float16's range")
    assert judge_sum(got, exact, dtype, world) == {}


def test_an_off_by_one_element_fails_in_the_exact_dtypes() -> None:
    base = torch.arange(1023) % 7 + 1
    for world in (2, 9, 16):
        exact = base.double() * (world * (world + 1) // 2)
        for dtype in ("int64", "float32", "float64"):
            got = exact.to(getattr(torch, dtype)).clone()
            got[511] += 1
            assert judge_sum(got, exact, dtype, world), (dtype, world)


def _step_entry(rank: int, diff: float, **overrides: Any) -> R.RankEntry:
    detail = step_detail(diff, "float64", samples=6, shards=2, lr=0.5, grad_abs_sum=0.8, param_abs_max=0.6)
    detail.update(overrides)
    return R.entry(rank, R.PASS, "", **detail)


def test_step_judge_passes_just_inside_and_fails_just_past_its_bound() -> None:
    bound = step_bound(_step_entry(0, 0.0)["detail"])
    rec = judge_step("ddp-parity", "x", [_step_entry(0, 0.99 * bound), _step_entry(1, 1.01 * bound)])
    assert R.ranks_with(rec, R.FAIL) == [1]
    assert "> bound" in rec["ranks"][1]["message"] and rec["summary"].startswith("rank 1:")
    rec = judge_step("ddp-parity", "x", [_step_entry(0, 0.99 * bound), _step_entry(1, 0.0)])
    assert rec["status"] == R.PASS and "rounding bound" in rec["summary"]
    assert judge_step("ddp-parity", "x", [_step_entry(0, float("nan"))])["status"] == R.FAIL


def test_the_float64_step_bound_is_far_below_any_real_error() -> None:
    # A loose constant (1e-2, 1e-5) would hide a gradient scaled wrong by a part in a million.
    assert step_tolerance("float64", 6, 2, 0.5, 0.8, 0.6) < 1e-13
    assert step_tolerance("float64", 48, 16, 0.5, 0.8, 0.6) < 1e-13
    assert step_tolerance("float32", 6, 2, 0.5, 0.8, 0.6) > step_tolerance("float64", 6, 2, 0.5, 0.8, 0.6) * 1e8


def _model() -> nn.Module:
    from ddpdoctor.probe.checks.ddp_parity import _model as parity_model

    return parity_model(torch.device("cpu"))


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7, 16])
def test_averaged_shard_gradients_stay_inside_the_step_bound(world: int) -> None:
    # DDP's arithmetic without the processes: per-shard gradients averaged, against the whole batch.
    from ddpdoctor.probe.checks.base import abs_grad_sum, param_abs_max
    from ddpdoctor.probe.checks.ddp_parity import LR, PER_RANK

    gen = torch.Generator().manual_seed(99)
    n = PER_RANK * world
    x = torch.randn(n, 6, generator=gen, dtype=torch.float64)
    y = torch.randn(n, 3, generator=gen, dtype=torch.float64)
    reference = _model()
    grad_sum = abs_grad_sum(reference, lambda i: nn.functional.mse_loss(reference(x[i:i + 1]), y[i:i + 1]) / n, n)
    whole = torch.autograd.grad(nn.functional.mse_loss(reference(x), y), list(reference.parameters()))
    shards = [torch.autograd.grad(nn.functional.mse_loss(reference(x[k * PER_RANK:(k + 1) * PER_RANK]),
                                                         y[k * PER_RANK:(k + 1) * PER_RANK]), list(reference.parameters()))
              for k in range(world)]
    with torch.no_grad():
        averaged = [sum(g[i] for g in shards) / world for i in range(len(whole))]
        p_ref = [p - LR * g for p, g in zip(reference.parameters(), whole)]
        p_ddp = [p - LR * g for p, g in zip(reference.parameters(), averaged)]
        summed = [p - LR * sum(g[i] for g in shards) for i, p in enumerate(reference.parameters())]
    diff = max(float((a - b).abs().max()) for a, b in zip(p_ref, p_ddp))
    bound = step_tolerance("float64", n, world, LR, grad_sum, max(float(p.abs().max()) for p in p_ref))
    assert diff <= bound
    if world > 1:  # summing instead of averaging is caught by orders of magnitude
        assert max(float((a - b).abs().max()) for a, b in zip(p_ref, summed)) > 1e6 * bound
    assert param_abs_max(reference) > 0
