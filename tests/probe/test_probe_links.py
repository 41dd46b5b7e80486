"""The link map: its tournament schedule, its judge just inside and just past its tolerance, its
matrix and picture, its faults and options -- and 4 real gloo ranks with a slowed pair and a slowed
rank, which it must name."""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Optional

import pytest
from click.testing import CliRunner

from ddpdoctor.probe import linkmap
from ddpdoctor.probe import results as R
from ddpdoctor.probe.command import probe
from ddpdoctor.probe.config import RankConfig
from ddpdoctor.probe.launch import overall_deadline
from ddpdoctor.probe.faults import LINK_DELAY_S, FaultError, Faults, FaultSpec, parse_fault
from ddpdoctor.probe.options import OptionError, ProbeOptions, parse_size
from ddpdoctor.probe.views import link_table
from probe_helpers import PROBE, REPO, assert_no_leftovers, bad_ranks, free_port, probe_env, run_probe


@pytest.mark.parametrize("n", range(1, 10))
def test_rounds_meet_every_pair_once_and_no_rank_twice_in_a_round(n: int) -> None:
    schedule = linkmap.rounds(n)
    met = [pair for pairs in schedule for pair in pairs]
    assert sorted(met) == list(itertools.combinations(range(n), 2))
    for pairs in schedule:
        ranks = [r for pair in pairs for r in pair]
        assert len(ranks) == len(set(ranks))
    assert len(schedule) == (n - 1 if n % 2 == 0 else n) or n == 1
    if n >= 2:
        assert all(pairs for pairs in schedule)


def _entries(n: int, gbps: Any = 1.0, latency: Any = 20.0, device: str = "cpu",
             nodes: Optional[list[int]] = None) -> list[R.RankEntry]:
    """A synthetic map: gbps/latency are numbers or functions of (sender, receiver)."""
    def value(v: Any, a: int, b: int) -> float:
        return float(v(a, b)) if callable(v) else float(v)

    return [R.entry(a, R.PASS, "", node=(nodes or [0] * n)[a], bytes=65536, device=device,
                    links=[{"peer": b, "GBps": value(gbps, a, b), "latency_us": value(latency, a, b)}
                           for b in range(n) if b != a])
            for a in range(n)]


def _slow_pair(pair: tuple[int, int], gbps: float) -> Any:
    return lambda a, b: gbps if {a, b} == set(pair) else 1.0


@pytest.mark.parametrize("device, limit", [("cpu", 5.0), ("cuda", 2.0)])
def test_a_pair_just_past_the_factor_is_slow_and_just_inside_is_not(device: str, limit: float) -> None:
    inside = linkmap.judge(_entries(4, _slow_pair((1, 2), 1 / (limit * 0.99)), device=device))
    assert inside["status"] == R.PASS and inside["detail"]["slow_pairs"] == []
    past = linkmap.judge(_entries(4, _slow_pair((1, 2), 1 / (limit * 1.01)), device=device))
    assert past["status"] == R.FAIL
    assert R.ranks_with(past, R.FAIL) == [1, 2]
    assert [p["ranks"] for p in past["detail"]["slow_pairs"]] == [[1, 2]]
    assert past["summary"].startswith(f"slow: link 1<->2: {1 / (limit * 1.01):.3g} GB/s, {limit * 1.01:.1f}x below the typical 1 GB/s")


def test_latency_must_be_past_the_factor_and_the_floor() -> None:
    # CPU: factor 5 and floor 200 us over the typical 20 us.
    def slow(latency: float) -> Any:
        return lambda a, b: latency if {a, b} == {0, 3} else 20.0

    assert linkmap.judge(_entries(4, latency=slow(219.0)))["status"] == R.PASS  # 11x, but only 199 us more
    past = linkmap.judge(_entries(4, latency=slow(221.0)))
    assert R.ranks_with(past, R.FAIL) == [0, 3]
    assert "latency 221 us, 11.1x the typical 20 us" in past["summary"]
    # Past the factor but under the floor (4.95x, 79 us more): slow on GPUs (2x, 20 us), not on CPU.
    assert linkmap.judge(_entries(4, latency=slow(99.0)))["status"] == R.PASS
    assert linkmap.judge(_entries(4, latency=slow(99.0), device="cuda"))["status"] == R.FAIL


def test_gpu_latency_uses_the_gpu_tolerance() -> None:
    def slow(latency: float) -> Any:
        return lambda a, b: latency if {a, b} == {0, 3} else 10.0

    assert linkmap.judge(_entries(4, latency=slow(29.0), device="cuda"))["status"] == R.PASS  # 2.9x, 19 us more
    assert linkmap.judge(_entries(4, latency=slow(31.0), device="cuda"))["status"] == R.FAIL  # 3.1x, 21 us more


def test_a_rank_slow_with_every_peer_is_named_alone() -> None:
    rec = linkmap.judge(_entries(4, lambda a, b: 0.05 if 3 in (a, b) else 1.0))
    assert rec["detail"]["slow_ranks"] == [3]
    assert R.ranks_with(rec, R.FAIL) == [3]
    assert rec["summary"] == "slow: rank 3: slow with every peer, a median 20.0x off the typical link"


def test_a_slow_rank_among_three_does_not_drag_the_typical_link_down() -> None:
    # Half of ranks 0 and 1's links are slow: the faster middle value keeps the yardstick at 1 GB/s.
    rec = linkmap.judge(_entries(3, lambda a, b: 0.1 if 2 in (a, b) else 1.0))
    assert rec["detail"]["typical"]["intra-node"]["GBps"] == 1.0
    assert rec["detail"]["slow_ranks"] == [2]


def test_two_ranks_compare_the_two_directions_of_their_one_link() -> None:
    even = linkmap.judge(_entries(2, 0.001))
    assert even["status"] == R.PASS
    assert even["summary"] == "1 pair(s), both ways: intra-node typically 0.001 GB/s, 20 us; its two directions within 5x of each other"
    lopsided = linkmap.judge(_entries(2, lambda a, b: 0.1 if a == 0 else 1.0))
    assert R.ranks_with(lopsided, R.FAIL) == [0, 1]  # a link, never a rank: with two, no telling which end
    assert lopsided["detail"]["slow_ranks"] == []
    assert lopsided["summary"].startswith("slow: link 0<->1: 0.1 GB/s, 10.0x below")


def test_inter_node_links_are_compared_with_inter_node_links() -> None:
    nodes = [0, 0, 1, 1]
    healthy = linkmap.judge(_entries(4, lambda a, b: 1.0 if nodes[a] == nodes[b] else 0.1, nodes=nodes))
    assert healthy["status"] == R.PASS
    assert set(healthy["detail"]["typical"]) == {"intra-node", "inter-node"}
    one_bad = linkmap.judge(_entries(4, lambda a, b: (1.0 if nodes[a] == nodes[b] else 0.1) / (6 if {a, b} == {1, 2} else 1),
                                     nodes=nodes))
    assert [p["ranks"] for p in one_bad["detail"]["slow_pairs"]] == [[1, 2]]


def test_the_matrix_marks_the_slow_pair_both_ways() -> None:
    table = link_table(linkmap.judge(_entries(3, _slow_pair((0, 2), 0.01))))
    assert table is not None
    assert table.headers == ("from\\to", "r0", "r1", "r2")
    assert table.rows[0] == ("r0", "-", "1 GB/s 20 us", "*0.01 GB/s 20 us")
    assert table.rows[2][1] == "*0.01 GB/s 20 us"
    assert "64 KiB messages" in table.title


def test_link_faults_parse_and_delay_only_their_link() -> None:
    assert parse_fault("slow-link:2,1") == FaultSpec("slow-link", 1, 2)
    assert str(parse_fault("slow-link:2,1")) == "slow-link:1,2"
    for bad in ("slow-link:1", "slow-link:1,1", "slow-link:a,2", "slow-link:-1,2", "slow-rank:x"):
        with pytest.raises(FaultError):
            parse_fault(bad)
    specs = (FaultSpec("slow-link", 1, 2), FaultSpec("slow-rank", 3))
    assert Faults(specs, 1).link_delay(2) == Faults(specs, 2).link_delay(1) == LINK_DELAY_S
    assert Faults(specs, 1).link_delay(0) == 0.0
    assert Faults(specs, 0).link_delay(3) == Faults(specs, 3).link_delay(0) == LINK_DELAY_S


@pytest.mark.parametrize("options, message", [
    (ProbeOptions(nproc=4, faults=(FaultSpec("slow-link", 1, 2),)), r"slow-link is caught by the links check.*\(--links\)"),
    (ProbeOptions(nproc=2, checks=("world", "links"), faults=(FaultSpec("slow-link", 1, 2),)), "rank 2 does not exist"),
    (ProbeOptions(framework="horovod", nproc=2, checks=("world",), faults=(FaultSpec("slow-rank", 1),)),
     "no --framework horovod check catches slow-rank"),
])
def test_link_fault_options_are_checked(options: ProbeOptions, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        options.validate()


@pytest.mark.parametrize("text, size", [("4096", 4096), ("64K", 65536), ("64KiB", 65536), ("1M", 1 << 20), ("1.5k", 1536)])
def test_link_size(text: str, size: int) -> None:
    assert parse_size("--link-size", text) == size


@pytest.mark.parametrize("text", ["", "abc", "0", "2", "5G", "nan", "inf", "1e20", "-4K"])
def test_bad_link_size_is_a_usage_error(text: str) -> None:
    with pytest.raises(OptionError, match="--link-size"):
        parse_size("--link-size", text)


@pytest.mark.parametrize("args, message", [
    (["--plot", "map.png"], "--plot draws the link map: add --links"),
    (["--links", "--plot", "map.pdf"], "--plot map.pdf: the picture is written as .png or .svg"),
    (["--links", "--link-size", "lots"], "--link-size expects a size"),
])
def test_plot_and_size_options_fail_in_one_line_before_launch(args: list[str], message: str) -> None:
    result = CliRunner().invoke(probe, ["--nproc", "2", *args])
    assert result.exit_code == 2
    assert result.output.startswith(f"ddpdoctor probe: error: {message}")
    assert len(result.output.strip().splitlines()) == 1


def test_plot_without_matplotlib_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = CliRunner().invoke(probe, ["--nproc", "2", "--links", "--plot", "map.svg"])
    assert result.exit_code == 2
    assert result.output == "ddpdoctor probe: error: --plot needs matplotlib: pip install 'ddpdoctor[plot]'\n"


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_the_picture_is_drawn(tmp_path: Path, suffix: str, magic: bytes) -> None:
    pytest.importorskip("matplotlib")
    from ddpdoctor.probe.plot import draw_link_map

    rec = linkmap.judge(_entries(4, _slow_pair((1, 2), 0.01)))
    path = tmp_path / f"map{suffix}"
    draw_link_map(rec["detail"], str(path), "test")
    assert path.read_bytes().startswith(magic)
    if suffix == ".svg":
        assert b"bandwidth (GB/s)" in path.read_bytes() and b"latency (us)" in path.read_bytes()


# -- real gloo ranks -------------------------------------------------------------------------------

LINKS = ("--nproc", "4", "--checks", "world", "--links", "--link-size", "4K", "--timeout", "10", "--format", "json")


@pytest.mark.slow
def test_four_ranks_name_the_slowed_pair_and_draw_it(tmp_path: Path) -> None:
    picture = tmp_path / "links.png"
    plot = ["--plot", str(picture)] if _has_matplotlib() else []
    run = run_probe(*LINKS, "--inject-fault", "slow-link:1,2", *plot)
    assert run.returncode == 1, run.stderr
    rec = run.check("links")
    assert bad_ranks(rec) == [1, 2]
    assert [p["ranks"] for p in rec["detail"]["slow_pairs"]] == [[1, 2]]
    assert rec["detail"]["slow_ranks"] == []
    assert rec["summary"].startswith("slow: link 1<->2: ")
    matrix = rec["detail"]["bandwidth_GBps"]
    assert all((matrix[a][b] is None) == (a == b) for a in range(4) for b in range(4))
    if plot:
        assert picture.read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_four_ranks_name_the_slowed_rank() -> None:
    run = run_probe(*LINKS, "--inject-fault", "slow-rank:3")
    assert run.returncode == 1, run.stderr
    rec = run.check("links")
    assert rec["detail"]["slow_ranks"] == [3]
    assert bad_ranks(rec) == [3]
    assert rec["summary"].startswith("slow: rank 3: slow with every peer, a median ")


@pytest.mark.slow
def test_four_healthy_ranks_print_the_map_and_name_nothing() -> None:
    run = run_probe(*LINKS[:-2])
    assert run.returncode == 0, run.stdout + run.stderr
    assert "link map, 4 KiB messages (row sends to column; * slow)" in run.stdout
    assert "*" not in run.stdout.split("link map", 1)[1].split("\n", 1)[1]
    assert "none more than 5x off" in run.stdout


def _has_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def test_the_run_waits_long_enough_for_the_link_map() -> None:
    with_links, without = RankConfig(checks=("world", "links")), RankConfig(checks=("world",))
    assert overall_deadline(with_links, 16) - overall_deadline(with_links, 0) == linkmap.time_budget(16)
    assert overall_deadline(without, 16) == overall_deadline(without, 0)
    # Every message of a slowed rank's links is late by LINK_DELAY_S: well inside the budget.
    assert linkmap.MESSAGE_BUDGET_S >= 2 * LINK_DELAY_S
    assert linkmap.time_budget(2) == 3 * (4 * 10 + 4 * 10 + 2) * 0.01


@pytest.mark.slow
def test_two_nodes_map_intra_and_inter_node_links_apart() -> None:
    port, mark = free_port(), uuid.uuid4().hex
    nodes = [subprocess.Popen([*PROBE, "--nnodes", "2", "--node-rank", str(node), "--rdzv-endpoint", f"127.0.0.1:{port}",
                               "--nproc", "2", "--timeout", "10", "--join-timeout", "30", "--format", "json",
                               "--checks", "world", "--links", "--link-size", "4K", "--inject-fault", "slow-link:1,2"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=probe_env(mark), cwd=REPO)
             for node in (0, 1)]
    outs = [p.communicate(timeout=180) for p in nodes]
    assert_no_leftovers(mark)
    for p, (out, err) in zip(nodes, outs):
        assert p.returncode == 1, err[-3000:]
        rec = next(c for c in json.loads(out)["checks"] if c["name"] == "links")
        assert rec["detail"]["nodes"] == [0, 0, 1, 1]
        assert set(rec["detail"]["typical"]) == {"intra-node", "inter-node"}
        assert [p["ranks"] for p in rec["detail"]["slow_pairs"]] == [[1, 2]]
        assert bad_ranks(rec) == [1, 2]
