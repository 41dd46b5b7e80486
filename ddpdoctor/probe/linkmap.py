"""The link map's schedule and verdict, on what the ranks measured. No torch: the parent draws the
map and the unit tests judge synthetic maps without a process group.

Schedule: a round-robin tournament (the circle method). In each round every rank is in at most one
pair, so a measured link never shares a rank with another measurement; n ranks need n - 1 rounds
(n rounds when n is odd: each round one rank sits out).

Verdict: every directed link is compared with the typical link of its class -- intra-node links
with intra-node ones, inter-node with inter-node, since a network link is expected to be slower than
NVLink or shared memory. The typical link is the median of each rank's median link (on a tie the
faster of the two middle values): a slow rank makes half of some ranks' links slow, and must not drag
the yardstick down with it. A link is slow past a factor (bandwidth more than FACTOR times below the
typical one, or latency more than FACTOR times above it and by more than the floor; both by device,
see FACTORS). A rank
whose every link is slow is named as the slow one (with 3 ranks or more: with 2 a link cannot be told
from its ends); the other slow pairs are named as links.
"""

from __future__ import annotations

import statistics
from typing import Any, Optional

from ddpdoctor.probe import results as R

NAME = "links"
# How far off the typical link a link may be before it is slow, by the ranks' device. Between GPUs a
# link is a wire (NVLink, PCIe, a NIC): half the typical speed is a fault. Between CPU ranks a link
# is the host's memory and scheduler, shared with every other process on it: on a busy host a healthy
# link measures up to ~3x off in one run, so only 5x is a fault there.
FACTORS = {"cuda": 2.0, "cpu": 5.0}
# Below this, a latency difference is noise on that transport (a scheduler tick on a busy host).
LATENCY_FLOORS_US = {"cuda": 20.0, "cpu": 200.0}

# Tries per measurement and pass. On a loaded host most tries of a one-element round trip wait for a
# time slice (milliseconds, against ~25 us on an idle one: seen at a load of 4 per core); the best of
# 3 x 10 is then clean all but about once in 10^4.
ITERS = 10
LATENCY_ITERS = 10
# The whole tournament runs this many times and each link keeps its best: a busy moment on one host
# (a scheduler tick, another job) then costs one pass, not the link's verdict.
PASSES = 3
# What one message may take in the worst case the run must still wait for (a busy host, a slowed link).
MESSAGE_BUDGET_S = 0.01

Matrix = list[list[Optional[float]]]


def time_budget(world_size: int) -> float:
    """Seconds the link map may take on `world_size` ranks before the run counts as hung: every pair,
    every pass, every message (both ways: payload and acknowledgement, ping and pong) at its budget."""
    pairs = world_size * (world_size - 1) // 2
    messages = 2 * (2 * ITERS) + 2 * (2 * LATENCY_ITERS) + 2
    return pairs * PASSES * messages * MESSAGE_BUDGET_S


def rounds(n: int) -> list[list[tuple[int, int]]]:
    """Pairs (low, high) per round; every pair of 0..n-1 exactly once, no rank twice in a round."""
    players: list[Optional[int]] = list(range(n)) + ([None] if n % 2 else [])
    m = len(players)
    schedule = []
    for _ in range(m - 1):
        pairs = []
        for i in range(m // 2):
            a, b = players[i], players[m - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        schedule.append(sorted(pairs))
        players = [players[0], players[-1], *players[1:-1]]  # keep the first, rotate the rest
    return schedule


def partner(pairs: list[tuple[int, int]], rank: int) -> Optional[int]:
    for a, b in pairs:
        if rank in (a, b):
            return b if rank == a else a
    return None


def matrices(entries: list[R.RankEntry], n: int) -> tuple[Matrix, Matrix]:
    """(bandwidth GB/s, latency us) with [sender][receiver]; None on the diagonal and where unknown."""
    bandwidth: Matrix = [[None] * n for _ in range(n)]
    latency: Matrix = [[None] * n for _ in range(n)]
    for e in entries:
        for link in e["detail"].get("links", []):
            peer = int(link["peer"])
            if 0 <= peer < n and peer != e["rank"]:
                bandwidth[e["rank"]][peer] = float(link["GBps"])
                latency[e["rank"]][peer] = float(link["latency_us"])
    return bandwidth, latency


def _typical(values_per_rank: dict[int, list[float]], faster_is_higher: bool) -> Optional[float]:
    pick = statistics.median_high if faster_is_higher else statistics.median_low
    medians = [pick(values) for values in values_per_rank.values() if values]
    return pick(medians) if medians else None


def link_class(nodes: list[int], a: int, b: int) -> str:
    return "intra-node" if nodes[a] == nodes[b] else "inter-node"


def judge(entries: list[R.RankEntry]) -> R.CheckRecord:
    rec = R.record(NAME, entries)
    if R.blame_failures(rec):
        return rec
    live = [e for e in entries if e["status"] == R.PASS]
    if len(live) < 2:
        rec["summary"] = rec["ranks"][0]["message"] if rec["ranks"] else "skipped"
        return rec
    n = len(entries)
    nodes = [int(e["detail"].get("node", 0)) for e in rec["ranks"]]
    device = "cuda" if any(e["detail"].get("device") == "cuda" for e in live) else "cpu"
    limit, floor_us = FACTORS[device], LATENCY_FLOORS_US[device]
    bandwidth, latency = matrices(live, n)
    directed = [(a, b) for a in range(n) for b in range(n) if a != b and bandwidth[a][b] is not None]
    pairs = sorted({(min(a, b), max(a, b)) for a, b in directed})
    typical = _typical_by_class(directed, nodes, bandwidth, latency)
    # Per pair: its worse direction and dimension, as (factor, phrase).
    slow_pairs: dict[tuple[int, int], tuple[float, str]] = {}
    for a, b in directed:
        worst = _slowness(bandwidth[a][b] or 0.0, latency[a][b] or 0.0, typical[link_class(nodes, a, b)], limit, floor_us)
        key = (min(a, b), max(a, b))
        if worst is not None and (key not in slow_pairs or worst[0] > slow_pairs[key][0]):
            slow_pairs[key] = worst
    pairs_of = {r: [p for p in pairs if r in p] for r in range(n)}
    # With two ranks a slow link cannot be told from a slow end; from three on, a rank slow with every
    # peer is the news, and its links are not named one by one.
    slow_ranks = [r for r in range(n) if n >= 3 and pairs_of[r] and all(p in slow_pairs for p in pairs_of[r])]
    named: list[str] = []
    for r in slow_ranks:
        factor = statistics.median(slow_pairs[p][0] for p in pairs_of[r])
        named.append(f"rank {r}: slow with every peer, a median {factor:.1f}x off the typical link")
        _fail(rec, r, named[-1])
    for a, b in sorted(p for p in slow_pairs if not set(p) & set(slow_ranks)):
        named.append(f"link {a}<->{b}: {slow_pairs[(a, b)][1]}")
        _fail(rec, a, named[-1])
        _fail(rec, b, named[-1])
    rec["status"] = R.aggregate_status(rec["ranks"])
    rec["detail"] = {
        "bytes": int(live[0]["detail"].get("bytes", 0)), "bandwidth_GBps": bandwidth, "latency_us": latency,
        "nodes": nodes, "typical": typical, "factor_limit": limit, "latency_floor_us": floor_us,
        "slow_pairs": [{"ranks": [a, b], "factor": round(factor, 2), "why": why}
                       for (a, b), (factor, why) in sorted(slow_pairs.items())],
        "slow_ranks": slow_ranks,
    }
    if named:
        rec["summary"] = "slow: " + "; ".join(named)
    else:
        rec["summary"] = f"{len(pairs)} pair(s), both ways: " + ", ".join(
            f"{cls} typically {ref['GBps'] or 0:.3g} GB/s, {ref['latency_us'] or 0:.0f} us" for cls, ref in typical.items()
        ) + (f"; none more than {limit:g}x off" if n >= 3 else f"; its two directions within {limit:g}x of each other")
    return rec


def _typical_by_class(directed: list[tuple[int, int]], nodes: list[int], bandwidth: Matrix,
                      latency: Matrix) -> dict[str, dict[str, Optional[float]]]:
    """class -> {"GBps", "latency_us"} of its typical link (see the module's docstring)."""
    typical: dict[str, dict[str, Optional[float]]] = {}
    for cls in sorted({link_class(nodes, a, b) for a, b in directed}):
        bw_by_rank: dict[int, list[float]] = {r: [] for r in range(len(nodes))}
        lat_by_rank: dict[int, list[float]] = {r: [] for r in range(len(nodes))}
        for a, b in directed:
            if link_class(nodes, a, b) == cls:
                for r in (a, b):
                    bw_by_rank[r].append(bandwidth[a][b] or 0.0)
                    lat_by_rank[r].append(latency[a][b] or 0.0)
        typical[cls] = {"GBps": _typical(bw_by_rank, True), "latency_us": _typical(lat_by_rank, False)}
    return typical


def _slowness(gbps: float, latency_us: float, ref: dict[str, Optional[float]], limit: float,
              floor_us: float) -> Optional[tuple[float, str]]:
    """(factor, phrase) when this directed link is slow against `ref`, else None."""
    found: list[tuple[float, str]] = []
    typical_bw, typical_lat = ref["GBps"], ref["latency_us"]
    if typical_bw:
        factor = typical_bw / gbps if gbps > 0 else float("inf")
        if factor > limit:
            found.append((factor, f"{gbps:.3g} GB/s, {factor:.1f}x below the typical {typical_bw:.3g} GB/s"))
    if typical_lat:
        factor = latency_us / typical_lat
        if factor > limit and latency_us - typical_lat > floor_us:
            found.append((factor, f"latency {latency_us:.0f} us, {factor:.1f}x the typical {typical_lat:.0f} us"))
    return max(found) if found else None


def _fail(rec: R.CheckRecord, rank: int, text: str) -> None:
    entry = next(e for e in rec["ranks"] if e["rank"] == rank)
    if entry["status"] == R.FAIL:
        if text not in entry["message"]:
            entry["message"] += f"; {text}"
        return
    entry["status"] = R.FAIL
    entry["message"] = text


def cell(gbps: Optional[float], latency_us: Optional[float]) -> str:
    if gbps is None or latency_us is None:
        return "-"
    return f"{gbps:.3g} GB/s {latency_us:.0f} us"


def slow_cells(detail: dict[str, Any]) -> set[tuple[int, int]]:
    """(sender, receiver) of every directed link of a slow pair (a slow rank's pairs are all slow)."""
    n = len(detail.get("bandwidth_GBps", []))
    pairs = {(int(p["ranks"][0]), int(p["ranks"][1])) for p in detail.get("slow_pairs", [])}
    return {(a, b) for a in range(n) for b in range(n) if a != b and (min(a, b), max(a, b)) in pairs}
