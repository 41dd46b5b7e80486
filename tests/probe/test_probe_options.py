"""Options, selection and the command's failure modes -- no ranks launched."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from ddpdoctor.probe.command import probe
from ddpdoctor.probe.devices import select
from ddpdoctor.probe.faults import FaultError, FaultSpec, parse_fault
from ddpdoctor.probe.options import OptionError, ProbeOptions, parse_checks
from ddpdoctor.probe.registry import TORCH, names_for
from probe_helpers import REPO


def test_importing_the_command_does_not_import_torch() -> None:
    code = "import sys, ddpdoctor.probe.command; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


def test_parse_fault() -> None:
    assert parse_fault("hang:3") == FaultSpec("hang", 3)
    for bad in ("hang", "explode:1", "crash:x", "crash:-1"):
        with pytest.raises(FaultError):
            parse_fault(bad)


def test_parse_checks_keeps_canonical_order() -> None:
    assert parse_checks("sampler,world") == ("world", "sampler")
    # By default every check but the link map, which runs on request (--links, or by name).
    assert parse_checks(None) == tuple(name for name in names_for(TORCH) if name != "links")
    assert parse_checks(None, extra=("links",)) == names_for(TORCH)
    assert parse_checks("links,world") == ("world", "links")
    assert parse_checks("world", extra=("links",)) == ("world", "links")
    with pytest.raises(OptionError, match="unknown check"):
        parse_checks("world,nope")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--inject-fault", "explode:1"], "--inject-fault expects KIND:RANK"),
        (["--nproc", "0"], "--nproc must be >= 1"),
        (["--nnodes", "2"], "needs --rdzv-endpoint"),
        (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "127.0.0.1:1"], "--node-rank must be in"),
        (["--rdzv-endpoint", "nohostport"], "HOST:PORT"),
        (["--timeout", "0"], "--timeout must be a finite number of seconds > 0; got 0"),
        (["--timeout", "nan"], "--timeout must be a finite number of seconds > 0; got nan"),
        (["--timeout", "inf"], "--timeout must be a finite number of seconds > 0; got inf"),
        (["--timeout", "-1"], "--timeout must be a finite number of seconds > 0; got -1"),
        (["--join-timeout", "nan"], "--join-timeout must be a finite number of seconds > 0"),
        (["--checks", "optimizer-step"], "unknown check(s) optimizer-step for --framework torch"),
        (["--framework", "horovod", "--checks", "ddp-parity"], "unknown check(s) ddp-parity for --framework horovod"),
        (["--framework", "horovod", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1"], "horovodrun -np N"),
        (["--nproc", "2", "--inject-fault", "hang:5"], "rank 5 does not exist"),
        (["--checks", "bogus"], "unknown check"),
    ],
)
def test_bad_options_exit_2_with_one_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(probe, args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_nccl_on_a_machine_without_enough_gpus_is_refused_before_launch() -> None:
    # torch here is a CPU build (or has fewer GPUs than 64 ranks): refused in one line, nothing launched.
    result = CliRunner().invoke(probe, ["--backend", "nccl", "--nproc", "64", "--force"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "NCCL" in result.output or "nccl" in result.output


def test_missing_torch_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    result = CliRunner().invoke(probe, ["--nproc", "2"])
    assert result.exit_code == 2
    assert "pip install 'ddpdoctor[probe]'" in result.output
    assert "Traceback" not in result.output


def test_auto_picks_nccl_when_every_local_rank_has_a_gpu() -> None:
    sel = select("auto", "auto", 4, torch_has_cuda=True, nccl_available=True, gpu_count=(8, "test"))
    assert (sel.backend, sel.device) == ("nccl", "cuda")
    assert "8 visible GPU(s)" in sel.reason


def test_auto_falls_back_to_gloo_on_cpu_with_too_few_gpus_and_says_why() -> None:
    sel = select("auto", "auto", 4, torch_has_cuda=True, nccl_available=True, gpu_count=(2, "test"))
    assert (sel.backend, sel.device) == ("gloo", "cpu")
    assert "2 visible GPU(s)" in sel.reason and "4 local rank(s)" in sel.reason


def test_default_nproc_is_one_per_gpu_or_two_on_cpu() -> None:
    assert select("auto", "auto", None, torch_has_cuda=True, nccl_available=True, gpu_count=(3, "t")).nproc == 3
    assert select("auto", "auto", None, torch_has_cuda=False, nccl_available=False, gpu_count=(0, "t")).nproc == 2


def test_more_ranks_than_gpus_with_nccl_is_an_error() -> None:
    with pytest.raises(OptionError, match="more than the 2 visible GPU"):
        select("nccl", "auto", 4, torch_has_cuda=True, nccl_available=True, gpu_count=(2, "test"))
    with pytest.raises(OptionError, match="needs --device cuda"):
        select("nccl", "cpu", 1, torch_has_cuda=True, nccl_available=True, gpu_count=(2, "test"))


def test_options_validate_accepts_defaults() -> None:
    ProbeOptions(nproc=2).validate()


def test_unresolvable_master_addr_is_one_line_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    def no_such_host(*args: object, **kwargs: object) -> object:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    # The resolver is faked: a real unknown name would ask the network's DNS.
    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    result = CliRunner().invoke(probe, ["--master-addr", "trainer-head", "--nproc", "2"])
    assert result.exit_code == 2
    assert result.output == "ddpdoctor probe: error: --master-addr 'trainer-head' does not resolve (Name or service not known)\n"


def test_master_addr_that_is_not_ours_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from ddpdoctor.probe import options

    class NotOurs(socket.socket):
        def bind(self, address: object) -> None:
            raise OSError(99, "Cannot assign requested address")

    monkeypatch.setattr(options.socket, "socket", NotOurs)
    with pytest.raises(OptionError, match=r"--master-addr 127.0.0.9: 127.0.0.9 is not an address of this machine "
                                          r"\(Cannot assign requested address\)"):
        options.resolve_local_address("127.0.0.9")


def test_a_loopback_master_addr_is_bindable_here() -> None:
    from ddpdoctor.probe.options import resolve_local_address

    assert resolve_local_address("127.0.0.9") == "127.0.0.9"  # all of 127.0.0.0/8 is local on Linux
    assert resolve_local_address("127.0.0.1") == "127.0.0.1"


def test_timeouts_scale_with_ranks_per_core(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpdoctor.probe import options
    from ddpdoctor.probe.procs import GRACE_S
    from ddpdoctor.probe.runner import scaled_timeouts

    monkeypatch.setattr(options, "cpu_count", lambda: 2)
    assert scaled_timeouts(ProbeOptions(nproc=2, timeout=5.0, join_timeout=60.0)) == (5.0, 60.0, GRACE_S)
    assert scaled_timeouts(ProbeOptions(nproc=16, timeout=5.0, join_timeout=60.0)) == (40.0, 480.0, 8 * GRACE_S)
    assert ProbeOptions(nproc=9).oversubscription() == 4.5
