"""The guard under Horovod, for real: `ddpdoctor guard -- horovodrun -np 2 ...` on gloo (tiny tensors, CPU),
each fixture planting one bug; and the pieces that need no Horovod (launcher variables, the import
hook that must not import it, the doctor's handling of hvd.join)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

import pytest

from guard_helpers import FIXTURES, GuardResult, planted, run_guard

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "probe"))
from hvd_helpers import require_horovod  # noqa: E402

from ddpdoctor.guard import horovod, patches  # noqa: E402
from test_guard_doctor import Harness  # noqa: E402

SCRIPT = "fixtures/guard/{}"
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
OPTIMIZER = "hvd.DistributedOptimizer gradient allreduce(4 params, float32[161])"


def run_horovod(script: str, *guard_args: str, script_args: Sequence[str] = ()) -> GuardResult:
    require_horovod()
    return run_guard(*guard_args, command=[HOROVODRUN, "-np", "2", "-H", "localhost:2", sys.executable,
                                           SCRIPT.format(script), *script_args], timeout=200)


def at(result: GuardResult, code: str, script: str) -> dict[str, Any]:
    finding = result.finding(code)
    assert (finding["path"], finding["line"]) == (SCRIPT.format(script), planted(script, code)), finding
    return finding


# ---------------------------------------------------------------- real horovodrun jobs


@pytest.mark.slow
def test_clean_horovod_job_is_silent_and_counts_what_it_watched() -> None:
    run = run_horovod("clean_horovod.py")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.report["findings"] == []
    # hvd.init, broadcast_parameters, broadcast_optimizer_state, 2 x 4 optimizer synchronizes, 2 loss
    # allreduces: each step counted once (torch's step hooks fire twice for a DistributedOptimizer).
    assert run.report["summary"] == {"ranks": 2, "epochs": 2, "steps": 8, "collectives": 13, "replica_checks": 2}
    assert "ddpdoctor guard: 2 ranks, 2 epochs, 8 steps, 13 collectives, 2 replica checks, no finding" in run.stderr


@pytest.mark.slow
def test_a_rank_that_allreduces_another_shape_is_named_with_both_shapes() -> None:
    run = run_horovod("horovod_shape.py")
    assert run.returncode == 1 and run.codes() == ["GRD001"], run.stderr[-3000:]
    mismatch = at(run, "GRD001", "horovod_shape.py")
    assert mismatch["ranks"] == [0, 1]  # two ranks: a tie, no majority
    line = planted("horovod_shape.py", "GRD001")
    assert (f"rank 0 called hvd.allreduce(float32[2], Average, name='metrics') at fixtures/guard/horovod_shape.py:"
            f"{line} while rank 1 called hvd.allreduce(float32[3], Average, name='metrics')") in mismatch["message"]
    assert mismatch["message"].startswith("at collective #3, ")  # after broadcast_parameters and one step


@pytest.mark.slow
@pytest.mark.parametrize("how, rank1", [("continue", "4 batches, 3 backwards, 3 optimizer steps, 4"),
                                        ("break", "2 batches, 1 backwards, 1 optimizer steps, 2")])
def test_a_rank_that_skips_a_batch_or_stops_early_is_named_with_its_last_line(how: str, rank1: str) -> None:
    run = run_horovod("horovod_skip.py", script_args=[how])
    assert run.returncode == 1 and run.codes() == ["GRD005"], run.stderr[-3000:]
    uneven = at(run, "GRD005", "horovod_skip.py")
    assert uneven["ranks"] == [1]
    assert "rank 1 finished after fewer collectives than the others" in uneven["message"]
    assert f"rank 1: {rank1} collectives" in uneven["message"]
    assert f"its last collective was {OPTIMIZER}" in uneven["message"]
    assert "call hvd.join()" in uneven["message"] and "Join([model])" not in uneven["message"]


@pytest.mark.slow
def test_a_rank_that_stalls_is_named_with_where_it_is() -> None:
    run = run_horovod("horovod_stall.py", "--stall-timeout", "3")
    assert run.returncode == 1 and run.codes() == ["GRD002"], run.stderr[-3000:]
    stall = at(run, "GRD002", "horovod_stall.py")
    line = planted("horovod_stall.py", "GRD002")
    assert stall["ranks"] == [1]
    assert f"and rank 1 never arrived: rank 1 is at fixtures/guard/horovod_stall.py:{line} in <module>" in stall[
        "message"]
    assert "rank 0 waited" in stall["message"] and OPTIMIZER in stall["message"]
    assert "the job was stopped" in stall["message"] and run.seconds < 120


@pytest.mark.slow
def test_a_rank_stuck_before_hvd_init_is_named_by_its_launchers_rank() -> None:
    run = run_horovod("horovod_late_init.py", "--stall-timeout", "3")
    assert run.returncode == 1 and run.codes() == ["GRD002"], run.stderr[-3000:]
    stall = at(run, "GRD002", "horovod_late_init.py")
    line = planted("horovod_late_init.py", "GRD002")
    assert stall["ranks"] == [1] and "rank 0 waited" in stall["message"] and "in hvd.init()" in stall["message"]
    assert f"rank 1 is at fixtures/guard/horovod_late_init.py:{line} in <module>" in stall["message"]


@pytest.mark.slow
def test_replicas_that_drift_are_compared_right_after_the_step() -> None:
    run = run_horovod("horovod_drift.py", "--every", "2")
    assert run.returncode == 1 and run.codes() == ["GRD003"], run.stderr[-3000:]
    drift = at(run, "GRD003", "horovod_drift.py")
    # Nudged after step 3: step 2's check agrees, step 4's does not.
    assert drift["ranks"] == [0, 1] and drift["step"] == 4
    assert "'0.bias' on ranks 0, 1 differs from each other (1 of 4 parameters differ" in drift["message"]
    assert "after Horovod's gradient allreduce (checked right after the optimizer step" in drift["message"]


@pytest.mark.slow
def test_drift_in_a_run_shorter_than_every_is_caught_at_the_end() -> None:
    run = run_horovod("horovod_drift.py")
    assert run.returncode == 1 and run.codes() == ["GRD003"], run.stderr[-3000:]
    drift = run.finding("GRD003")
    assert drift["step"] == 6 and "after the last step of an epoch or of the run" in drift["message"]


@pytest.mark.slow
def test_a_straggler_is_named_with_where_it_spends_its_time() -> None:
    run = run_horovod("horovod_straggler.py", "--straggler-window", "5")
    assert run.returncode == 1 and run.codes() == ["GRD006"], run.stderr[-3000:]
    slow = at(run, "GRD006", "horovod_straggler.py")
    assert slow["ranks"] == [1] and "median step time outside collectives" in slow["message"]


@pytest.mark.slow
def test_uneven_shards_with_hvd_join_are_fine() -> None:
    run = run_horovod("horovod_joined.py")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.report["findings"] == []
    assert run.report["summary"]["steps"] == 6  # rank 0's 3 + 3: the busiest rank's


# ---------------------------------------------------------------- no Horovod needed


@pytest.mark.parametrize("environ, expected", [
    ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2"}, (1, 2, 1, 2)),
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}, (3, 4, 1, None)),
    ({"PMI_RANK": "0", "PMI_SIZE": "8"}, (0, 8, None, None)),
    ({"HOROVOD_RANK": "1"}, (None, None, None, None)),  # no size: not a rank yet
    ({"HOROVOD_RANK": "-1", "HOROVOD_SIZE": "2"}, (None, None, None, None)),
    ({"HOROVOD_RANK": "x", "HOROVOD_SIZE": "2", "PMI_RANK": "1", "PMI_SIZE": "2"}, (1, 2, None, None)),
    ({}, (None, None, None, None)),
])
def test_launch_ids_from_each_launchers_variables(environ: dict[str, str], expected: tuple[Any, ...]) -> None:
    assert horovod.launch_ids(environ) == expected


def test_the_bootstrap_never_imports_horovod() -> None:
    # The guard's hooks are installed in every Python process of the job; Horovod is imported only
    # by a script that imports it, and then patched right after.
    code = ("import sys; import ddpdoctor.guard.horovod as h; h.watch(); "
            "import ddpdoctor.guard.hooks as k; k.watch_torch_distributed(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('horovod', 'torch')))")
    env = {**os.environ, "DDPDOCTOR_GUARD": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]"


def test_the_import_hook_patches_horovod_torch_when_imported() -> None:
    require_horovod()
    code = ("import ddpdoctor.guard.horovod as h; h.watch(); import horovod.torch as hvd; "
            "import horovod.torch.mpi_ops as m; "
            "print([hasattr(f, '__wrapped__') for f in (hvd.allreduce_async_, hvd.DistributedOptimizer, hvd.join, "
            "hvd.init, hvd.synchronize, hvd.broadcast_parameters, m.allreduce, hvd.rank)])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # What users call through horovod.torch is wrapped; Horovod's own modules keep the originals.
    assert out.stdout.strip() == str([True] * 6 + [False, False])


def test_a_patched_distributed_optimizer_still_works_with_an_lr_scheduler() -> None:
    # The scheduler re-wraps `optimizer.step.__func__`: the guard's step must stay a bound method, and
    # torch must still see the step (no "lr_scheduler.step() before optimizer.step()" warning).
    require_horovod()
    code = ("import warnings; warnings.simplefilter('error'); import ddpdoctor.guard.horovod as h; h.watch(); "
            "import horovod.torch as hvd, torch; hvd.init(); net = torch.nn.Linear(2, 1); "
            "opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), "
            "named_parameters=net.named_parameters()); "
            "sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)\n"
            "for _ in range(2):\n"
            "    opt.zero_grad(); net(torch.ones(4, 2)).sum().backward(); opt.step(); sched.step()\n"
            "print(opt.param_groups[0]['lr'], opt.__dict__['_ddpdoctor_counts_itself'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["0.025", "True"]


def _allreduce(tensor: Any, average: Any = None, name: Any = None, op: Any = None, process_set: Any = None) -> None:
    pass


def _broadcast(tensor: Any, root_rank: int, name: Any = None, process_set: Any = None) -> None:
    pass


def _allgather(tensor: Any, name: Any = None, process_set: Any = None) -> None:
    pass


def _broadcast_parameters(params: Any, root_rank: int) -> None:
    pass


FAKE_HVD = SimpleNamespace(Average=1, Sum=2, Adasum=3, Min=4, Max=5, Product=6)


@pytest.mark.parametrize("operation, function, args, kwargs, expected", [
    ("allreduce", _allreduce, ("T23",), {}, "float32[2, 3], Average"),
    ("allreduce", _allreduce, ("T23",), {"op": 2}, "float32[2, 3], Sum"),
    ("allreduce", _allreduce, ("T23", False), {}, "float32[2, 3], Sum"),  # the old average=False
    ("allreduce", _allreduce, ("T23",), {"name": "loss", "op": 4}, "float32[2, 3], Min, name='loss'"),
    ("grouped_allreduce", _allreduce, (["T23", "T4"],), {}, "2xfloat32[10], Average"),
    ("broadcast", _broadcast, ("T4", 1), {}, "float32[4], root 1"),
    ("allgather", _allgather, ("T23",), {}, "float32"),  # the first dimension may differ between ranks
    ("broadcast_parameters", _broadcast_parameters, ({"a": "T4", "b": "T23"},), {"root_rank": 0}, "2 tensors, root 0"),
    ("broadcast_parameters", _broadcast_parameters, ([("a", "T4")], 0), {}, "1 tensor, root 0"),
])
def test_what_horovod_ranks_must_agree_on(operation: str, function: Any, args: tuple[Any, ...],
                                          kwargs: dict[str, Any], expected: str) -> None:
    import torch

    made = {"T23": torch.zeros(2, 3), "T4": torch.zeros(4)}

    def real(value: Any) -> Any:
        if isinstance(value, list):
            return [real(v) for v in value]
        if isinstance(value, dict):
            return {k: real(v) for k, v in value.items()}
        if isinstance(value, tuple):
            return tuple(real(v) for v in value)
        return made.get(value, value) if isinstance(value, str) else value

    at = {name: patches.parameter_index(function, name) for name in ("op", "average", "root_rank", "name")}
    signature = horovod._signature(FAKE_HVD, operation, real(args), real(kwargs), at, torch.Tensor)
    assert signature == expected


def test_process_sets_key_like_torch_subgroups() -> None:
    guard = SimpleNamespace(world_size=4)
    assert horovod.group_key(guard, None) == "W"  # type: ignore[arg-type]
    assert horovod.group_key(guard, SimpleNamespace(ranks=[0, 1, 2, 3])) == "W"  # type: ignore[arg-type]
    assert horovod.group_key(guard, SimpleNamespace(ranks=[3, 1])) == "1,3"  # type: ignore[arg-type]


def test_hvd_join_realigns_the_sequences_after_uneven_inputs() -> None:
    h = Harness(2)
    stride = horovod.JOIN_STRIDE
    for seq in range(3):
        h.call(0, seq, "hvd.DistributedOptimizer gradient allreduce", "4 params, float32[161]", 20)
    for seq in range(2):
        h.call(1, seq, "hvd.DistributedOptimizer gradient allreduce", "4 params, float32[161]", 20)
    h.call(1, stride, "hvd.join", "", 24)
    h.doctor.tick()
    assert h.codes() == [] and 2 in h.doctor.sequence["W"]  # rank 0's extra step: not judged, not dropped yet
    h.call(0, stride, "hvd.join", "", 24)
    # After the join both ranks call the same allreduce: it lines up although rank 0 ran one more before.
    h.call(0, stride + 1, "hvd.allreduce", "float32[1], Average", 25)
    h.call(1, stride + 1, "hvd.allreduce", "float32[1], Sum", 25)
    h.clock.now += 2
    h.doctor.tick()
    assert h.codes() == ["GRD001"] and "float32[1], Sum" in h.printed[0].message
    assert 2 not in h.doctor.sequence["W"]


def horovod_state(count: int, done: bool) -> dict[str, Any]:
    return {"loaders": {"train.py:40#0": ["train.py", 40, 0, count, done, True, False]},
            "ev": [["W", count, "hvd.DistributedOptimizer gradient allreduce", "2 params, float32[3]", "train.py", 42]]}


def test_horovod_uneven_batches_wait_for_a_rank_that_is_stuck_not_one_about_to_join() -> None:
    h = Harness(2)
    h.state(0, **horovod_state(3, False))
    h.state(1, **horovod_state(2, True))
    h.doctor.tick()
    assert h.codes() == []  # rank 1 may be about to call hvd.join()
    h.state(0, inflight=["W", 3, 0.2])
    h.clock.now += 0.5
    h.doctor.tick()
    assert h.codes() == []
    h.clock.now += 0.6  # rank 0 has waited past the tolerance in its allreduce: no partner is coming
    h.doctor.tick()
    assert h.codes() == ["GRD005"] and h.printed[0].details["ranks"] == [0]
    assert "call hvd.join() when a rank's data runs out" in h.printed[0].message


def test_horovod_uneven_batches_are_fine_once_a_rank_joined() -> None:
    h = Harness(2)
    h.state(0, **horovod_state(3, False), inflight=["W", 3, 5.0])
    h.state(1, **horovod_state(2, True), counts=[2, 0, 2, 2, 3, 0, 1, 3])
    h.doctor.tick(final=True)
    assert h.codes() == []
