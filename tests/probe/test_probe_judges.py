"""The verdict logic on synthetic per-rank entries, and the runtime feature probe, in-process."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.distributed as dist

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks import bandwidth, param_sync, world
from ddpdoctor.probe.results import LaunchOutcome
from ddpdoctor.probe.merge import merge


def _world_entry(rank: int, torch_version: str = "2.5.0", uuid: str = "") -> dict[str, Any]:
    return R.entry(
        rank, R.PASS, "x", host="h", backend="nccl", device=f"cuda:{rank}", gpu={"uuid": uuid} if uuid else {},
        versions={"torch": torch_version, "cuda": "12.4", "nccl": "2.21.5", "python": "3.11.7"},
    )


def test_world_blames_the_rank_whose_versions_disagree() -> None:
    rec = world.judge([_world_entry(0), _world_entry(1, "2.4.1"), _world_entry(2)])
    assert rec["status"] == R.FAIL
    assert R.ranks_with(rec, R.FAIL) == [1]
    assert "torch 2.4.1" in rec["summary"]


def test_world_fails_two_ranks_on_one_gpu() -> None:
    rec = world.judge([_world_entry(0, uuid="GPU-a"), _world_entry(1, uuid="GPU-a"), _world_entry(2, uuid="GPU-b")])
    assert R.ranks_with(rec, R.FAIL) == [0, 1]
    assert "shares GPU GPU-a" in rec["ranks"][0]["message"]


def test_world_passes_when_all_agree() -> None:
    rec = world.judge([_world_entry(r, uuid=f"GPU-{r}") for r in range(4)])
    assert rec["status"] == R.PASS and "versions agree" in rec["summary"]


def _sync_entry(rank: int, h_init: str, h_step: str, d_init: float = 0.0, d_step: float = 1e-8) -> R.RankEntry:
    return R.entry(rank, R.PASS, "", hash_init=h_init, hash_step=h_step, tolerance_step=1e-6,
                   max_diff_vs_reference_init=d_init, max_diff_vs_reference_step=d_step)


def test_param_sync_blames_the_minority_hash() -> None:
    rec = param_sync.judge([_sync_entry(0, "a", "b"), _sync_entry(1, "a", "b"), _sync_entry(2, "z", "y", 1e-3, 1e-3)])
    assert R.ranks_with(rec, R.FAIL) == [2]


def test_param_sync_without_majority_blames_the_rank_far_from_the_reference() -> None:
    rec = param_sync.judge([_sync_entry(0, "z", "y", 1e-3, 1e-3), _sync_entry(1, "a", "b")])
    assert R.ranks_with(rec, R.FAIL) == [0]


def _bw_entry(rank: int, seconds: float, compute_s: float) -> dict[str, Any]:
    return R.entry(rank, R.PASS, "x", compute_s=compute_s,
                   sweep=[{"bytes": 1 << 20, "time_us": seconds * 1e6, "algbw_GBps": 0.0, "busbw_GBps": 0.0}])


def test_bandwidth_uses_the_nccl_tests_bus_bandwidth_formula() -> None:
    # 1 MiB in 1 ms on the slowest of 4 ranks: algbw = 1.048576 GB/s, busbw = algbw * 2*3/4.
    rec = bandwidth.judge([_bw_entry(r, 0.001 if r == 2 else 0.0005, 0.01) for r in range(4)])
    row = rec["detail"]["sweep"][0]
    assert row["algbw_GBps"] == pytest.approx(1.048576, rel=1e-3)
    assert row["busbw_GBps"] == pytest.approx(1.048576 * 1.5, rel=1e-3)
    assert rec["detail"]["stragglers"] == []


def test_bandwidth_flags_a_straggler_without_failing() -> None:
    rec = bandwidth.judge([_bw_entry(r, 0.001, 0.5 if r == 3 else 0.01) for r in range(4)])
    assert rec["detail"]["stragglers"] == [3]
    assert rec["status"] == R.PASS
    assert "straggler: rank 3" in rec["summary"]


def test_merge_attributes_a_dead_rank_to_the_check_it_was_running() -> None:
    world_rec = R.record("world", [R.entry(r, R.PASS, "ok") for r in range(3)], summary="ok")
    files = {
        r: {"rank": r, "pid": 100 + r, "running": "liveness" if r == 1 else None, "finished": r != 1,
            "records": {"world": copy.deepcopy(world_rec)}, "own": {}}
        for r in range(3)
    }
    outcome = LaunchOutcome(out_dir="/nonexistent", rank_files=files)
    outcome.failures[1] = {"local_rank": 1, "pid": 101, "exitcode": -11, "signal": "SIGSEGV", "message": "", "traceback": ""}
    checks = merge(outcome, ("world", "liveness", "allreduce"), 3, lambda name: f"advice for {name}")
    by_name = {c["name"]: c for c in checks}
    assert by_name["world"]["status"] == R.PASS
    assert by_name["liveness"]["status"] == R.FAIL
    assert R.ranks_with(by_name["liveness"], R.FAIL) == [1]
    assert "killed by SIGSEGV during liveness" in by_name["liveness"]["summary"]
    assert by_name["liveness"]["advice"] == "advice for liveness"
    assert by_name["allreduce"]["status"] == R.SKIP


@pytest.fixture
def single_rank_group() -> Any:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_unsupported_dtype_becomes_a_skip_with_the_reason(single_rank_group: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpdoctor.probe.checks import allreduce
    from ddpdoctor.probe.checks.base import Context, probe_support
    from ddpdoctor.probe.faults import Faults

    real = dist.all_reduce

    def refuse_bf16(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if tensor.dtype == torch.bfloat16:
            raise RuntimeError("Gloo does not support bfloat16")
        return real(tensor, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", refuse_bf16)
    unsupported = probe_support("gloo", torch.device("cpu"), 1)
    assert set(unsupported) == {"bfloat16"}
    assert "Gloo does not support bfloat16" in unsupported["bfloat16"]
    ctx = Context(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, backend="gloo",
                  device=torch.device("cpu"), timeout=5.0, faults=Faults((), 0), unsupported=unsupported)
    entry = allreduce.run(ctx)
    assert entry["status"] == R.PASS
    assert "bfloat16" in entry["detail"]["skipped"]
    assert "skipped: bfloat16" in allreduce.judge([entry])["summary"]


def test_env_doctor_is_optional(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from ddpdoctor.probe.envinfo import env_doctor

    monkeypatch.setitem(sys.modules, "ddpdoctor.env", None)  # as if the package were missing
    doctor = env_doctor(2, "gloo")
    assert doctor["findings"] == [] and doctor["summary"] is None
    assert "ddpdoctor.env unavailable" in doctor["error"]


def test_env_doctor_survives_a_broken_diagnose(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ddpdoctor.env")
    import ddpdoctor.env as env_pkg
    from ddpdoctor.probe.envinfo import env_doctor

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("boom")

    monkeypatch.setattr(env_pkg, "diagnose", broken)
    doctor = env_doctor(2, "gloo")
    assert doctor["error"] == "ddpdoctor.env failed (ValueError: boom)"


# -- tie and majority blame, with 2, 3 and 4 ranks ---------------------------------------------------


def _hashes(*spec: tuple[str, float]) -> list[R.RankEntry]:
    """One param-sync entry per (hash after the step, distance from the local reference)."""
    return [_sync_entry(r, "i", h, 0.0, d) for r, (h, d) in enumerate(spec)]


@pytest.mark.parametrize("spec, blamed", [
    # Two ranks disagree: no majority, so the one far from its reference is blamed, in either order.
    ((("a", 0.0), ("b", 1e-3)), [1]),
    ((("b", 1e-3), ("a", 0.0)), [0]),
    # ... and when neither is far (or both are), nobody can be trusted: both.
    ((("a", 0.0), ("b", 0.0)), [0, 1]),
    ((("a", 1e-3), ("b", 1e-3)), [0, 1]),
    # Three ranks: with every rank within its reference, the strict majority decides; the reference
    # beats the majority: a rank off its reference is blamed, however many agree with it.
    ((("a", 0.0), ("a", 0.0), ("b", 0.0)), [2]),
    ((("b", 1e-3), ("a", 0.0), ("a", 0.0)), [0]),
    ((("b", 0.0), ("a", 1e-3), ("a", 1e-3)), [1, 2]),
    ((("b", 1e-3), ("a", 1e-3), ("a", 1e-3)), [0, 1, 2]),
    # Four ranks: 3-1 is a majority; 2-2 is a tie decided by the distances.
    ((("a", 0.0), ("b", 0.0), ("a", 0.0), ("a", 0.0)), [1]),
    ((("a", 0.0), ("a", 0.0), ("b", 1e-3), ("b", 1e-3)), [2, 3]),
    ((("b", 1e-3), ("b", 1e-3), ("a", 0.0), ("a", 0.0)), [0, 1]),
    ((("a", 0.0), ("b", 0.0), ("c", 1e-3), ("d", 0.0)), [2]),
])
def test_param_sync_blame(spec: tuple[tuple[str, float], ...], blamed: list[int]) -> None:
    rec = param_sync.judge(_hashes(*spec))
    assert R.ranks_with(rec, R.FAIL) == blamed
    assert rec["summary"].startswith(R.format_ranks(blamed))


def test_param_sync_distance_just_inside_its_bound_is_not_far() -> None:
    # tolerance_step is 1e-6 in _sync_entry: a 2-rank tie at exactly the bound blames the other rank.
    rec = param_sync.judge(_hashes(("a", 1e-6), ("b", 1.01e-6)))
    assert R.ranks_with(rec, R.FAIL) == [1]


@pytest.mark.parametrize("versions, blamed", [
    (("2.5.0", "2.4.1"), [0, 1]),
    (("2.5.0", "2.4.1", "2.5.0"), [1]),
    (("2.4.1", "2.5.0", "2.5.0", "2.5.0"), [0]),
    (("2.5.0", "2.5.0", "2.4.1", "2.4.1"), [0, 1, 2, 3]),
])
def test_world_version_blame(versions: tuple[str, ...], blamed: list[int]) -> None:
    rec = world.judge([_world_entry(r, v) for r, v in enumerate(versions)])
    assert R.ranks_with(rec, R.FAIL) == blamed


def _hvd_world_entry(rank: int, horovod: str) -> R.RankEntry:
    return R.entry(rank, R.PASS, "x", host="h", backend="horovod-gloo", device="cpu",
                   versions={"horovod": horovod, "torch": "2.13.0", "python": "3.11.7"})


def test_horovod_world_blames_the_odd_horovod_build() -> None:
    pytest.importorskip("horovod", reason="Horovod is not installed: run scripts/install-horovod")
    from ddpdoctor.probe.checks import horovod_world

    rec = horovod_world.judge([_hvd_world_entry(0, "0.28.1"), _hvd_world_entry(1, "0.27.0"), _hvd_world_entry(2, "0.28.1")])
    assert R.ranks_with(rec, R.FAIL) == [1] and "horovod 0.27.0" in rec["summary"]


def _lr_entry(rank: int, size: int) -> R.RankEntry:
    return R.entry(rank, R.PASS, "", size=size, local_size=size, base_lr=0.1, scaled_lr=0.1 * size)


def test_lr_scaling_judge() -> None:
    pytest.importorskip("horovod", reason="Horovod is not installed: run scripts/install-horovod")
    from ddpdoctor.probe.checks import horovod_lr_scaling

    ok = horovod_lr_scaling.judge([_lr_entry(r, 3) for r in range(3)])
    assert ok["status"] == R.PASS and "scales to 0.3" in ok["summary"]
    bad = horovod_lr_scaling.judge([_lr_entry(0, 3), _lr_entry(1, 2), _lr_entry(2, 3)])
    assert R.ranks_with(bad, R.FAIL) == [1] and "hvd.size() is 2" in bad["summary"]
