"""The guard's small parts: launch arguments, hashing, the device check, what importing costs."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.guard import devices
from ddpdoctor.guard.hashing import digests
from ddpdoctor.guard.launch_args import AddressError, launcher_options, multinode_store, parse_address
from ddpdoctor.guard.options import GuardOptions
from ddpdoctor.guard.report import summary_line
from ddpdoctor.guard.run import exit_status


@pytest.mark.parametrize("command, store", [
    (["torchrun", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "10.1.2.3:29400", "train.py"],
     ("10.1.2.3", 29401)),
    (["torchrun", "--nnodes=1:4", "--rdzv_endpoint=head", "train.py", "--nnodes", "1"], ("head", 29401)),
    (["python3", "-m", "torch.distributed.run", "--nnodes", "2", "--master_addr", "head", "--master_port", "1234",
      "train.py"], ("head", 1235)),
    (["torchrun", "--nproc-per-node", "4", "train.py", "--rdzv-endpoint", "x:1"], None),
    (["torchrun", "--standalone", "--nproc-per-node", "2", "train.py"], None),
    (["python", "train.py", "--nnodes", "2", "--rdzv-endpoint", "x:1"], None),  # the script's options, not torchrun's
])
def test_multinode_store_is_next_to_the_rendezvous(command: list[str], store: object) -> None:
    assert multinode_store(command) == store


def test_launcher_options_stop_at_the_script() -> None:
    assert launcher_options(["torchrun", "--standalone", "--nproc_per_node=2", "t.py", "--lr", "1"]) == {
        "standalone": "", "nproc-per-node": "2"}


@pytest.mark.parametrize("text", ["127.0.0.9", ":80", "host:port", "h:70000"])
def test_bad_addresses(text: str) -> None:
    with pytest.raises(AddressError):
        parse_address(text)


def test_options_travel_through_the_environment() -> None:
    options = GuardOptions(host="127.0.0.1", port=4242, stall_timeout=3.0, every=7)
    assert GuardOptions.from_env({"DDPDOCTOR_GUARD": options.to_env()}) == options
    assert GuardOptions.from_env({}) is None and GuardOptions.from_env({"DDPDOCTOR_GUARD": "{not json"}) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.bool])
def test_one_changed_bit_or_a_swap_changes_the_digest(dtype: torch.dtype) -> None:
    base = (torch.arange(64) % 7).to(dtype).reshape(8, 8)
    flipped = base.clone()
    flipped.view(-1)[5] = ~flipped.view(-1)[5] if dtype == torch.bool else flipped.view(-1)[5] + 1
    swapped = base.clone().view(-1)
    swapped[[0, 1]] = swapped[[1, 0]]
    first, same, other, moved = digests([base, base.clone(), flipped, swapped.view(8, 8)])
    assert first == same and first != other and first != moved


def test_digest_tells_minus_zero_from_zero_and_sees_non_contiguous_views() -> None:
    zero, minus_zero = digests([torch.zeros(3), -torch.zeros(3)])
    assert zero != minus_zero
    matrix = torch.randn(4, 5)
    assert digests([matrix.t()]) == digests([matrix.t().contiguous()])


class FakeCuda(devices.CudaQuery):
    def __init__(self, count: int, current: int, model: int) -> None:
        self.count, self.current, self.model = count, current, model

    def available(self) -> bool:
        return True

    def device_count(self) -> int:
        return self.count

    def current_device(self) -> int:
        return self.current

    def index_of(self, tensor: torch.Tensor) -> int:
        return self.model


@pytest.mark.parametrize("count, current, model, local_rank, expect", [
    (4, 1, 1, 1, None),                       # right
    (1, 0, 0, 3, None),                       # one visible GPU per process: cuda:0 is right for everyone
    (4, 0, 0, 1, "its model is on cuda:0 and its current device is cuda:0"),
    (4, 2, 0, 2, "its model is on cuda:0"),
    (4, 0, 3, 3, "its current device is cuda:0"),
    (4, 0, 0, None, None),                    # local rank unknown: no guess
])
def test_wrong_device(monkeypatch: pytest.MonkeyPatch, count: int, current: int, model: int, local_rank: object,
                      expect: object) -> None:
    monkeypatch.setattr(devices, "query", FakeCuda(count, current, model))
    problem = devices.wrong_device(torch.nn.Linear(2, 2), local_rank, 4 if count > 1 else None)  # type: ignore[arg-type]
    if expect is None:
        assert problem is None
    else:
        assert problem is not None and f"should use cuda:{local_rank}, but {expect}:" in problem


def test_no_cuda_means_no_device_finding() -> None:
    assert devices.wrong_device(torch.nn.Linear(2, 2), 1, 2) is None or torch.cuda.is_available()


def test_importing_the_guard_and_the_cli_does_not_import_torch() -> None:
    code = ("import sys, ddpdoctor.guard, ddpdoctor.guard.command, ddpdoctor.guard.run, ddpdoctor.cli; "
            "from ddpdoctor import guard; assert callable(guard.install); print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


LATE_START = r"""
import os, sys, time
from ddpdoctor.guard.doctor import Doctor
from ddpdoctor.guard.options import GuardOptions
from ddpdoctor.guard.server import SideChannel
from ddpdoctor.guard.hooks import watch_torch_distributed

channel = SideChannel("127.0.0.1", 0, "run-secret")
options = GuardOptions(port=channel.address[1], secret="run-secret")
doctor = Doctor(options, channel.send, print)
channel.start(doctor)
os.environ["DDPDOCTOR_GUARD"] = options.to_env()
watch_torch_distributed()
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

# A framework that starts the process group without torch.distributed.init_process_group:
distributed_c10d.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
dist.all_reduce(torch.ones(2))
dist.barrier()
deadline = time.monotonic() + 20
while time.monotonic() < deadline and not (0 in doctor.ranks and doctor.ranks[0].next_seq.get("W") == 2):
    time.sleep(0.1)
print(doctor.world_size, doctor.ranks[0].next_seq)
"""


def test_a_process_group_started_another_way_is_guarded_from_its_first_collective() -> None:
    result = subprocess.run([sys.executable, "-c", LATE_START], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    # The rank connected at its first collective; the barrier after it was recorded too.
    assert result.stdout.split()[-3:] == ["1", "{'W':", "2}"]


def _finding(severity: "Severity") -> "Finding":
    return Finding(code="GRD006", name="straggler", severity=severity, message="m", path="t.py", line=1,
                   source="guard", details={"ranks": [1]})


@pytest.mark.parametrize("fail_on, severities, expected", [
    ("warning", ["warning"], 1), ("error", ["warning"], 0), ("error", ["error"], 1), ("info", ["info"], 1),
    ("warning", ["info"], 0), ("never", ["error"], 0), ("warning", [], 0),
])
def test_fail_on_picks_the_severities_that_fail_a_successful_job(fail_on: str, severities: list[str],
                                                                 expected: int) -> None:
    findings = [_finding(Severity(s)) for s in severities]
    assert exit_status(0, False, findings, fail_on) == expected


def test_the_jobs_own_failure_and_a_stop_win_over_fail_on() -> None:
    assert exit_status(3, False, [], "never") == 3
    assert exit_status(-9, False, [_finding(Severity.ERROR)], "never") == 128 + 9
    assert exit_status(0, True, [], "never") == 1


def test_summary_line_says_what_was_watched() -> None:
    summary = {"ranks": 2, "epochs": 3, "steps": 96, "collectives": 412, "replica_checks": 1}
    assert summary_line(summary, [], 0) == ("ddpdoctor guard: 2 ranks, 3 epochs, 96 steps, 412 collectives, "
                                            "1 replica check, no finding")
    two = [_finding(Severity.WARNING), _finding(Severity.ERROR)]
    assert summary_line(summary, two, 1).endswith("1 replica check, 2 findings (GRD006); exit 1")
