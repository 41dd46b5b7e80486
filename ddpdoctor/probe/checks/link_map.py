"""The link map, on each rank: point-to-point bandwidth and latency to every other rank, over the
backend's send/recv (gloo on CPU, NCCL between GPUs: one rank per GPU, the local rank's device).

Pairs meet in the rounds of a round-robin tournament (ddpdoctor.probe.linkmap.rounds), so no rank
is in two measurements at once; a barrier closes each round (on CPU, each pair's turn in it). Within a pair the lower rank leads, so
both sides agree on the order of every message:

- bandwidth, each direction: the sender times a message of `bytes` until the receiver's one-element
  acknowledgement is back, the best of ITERS tries (noise only ever slows a try down);
- latency, each side leading once: half the best round trip of a one-element ping-pong.

Each rank reports the links it sent on; rank 0's judge (linkmap.judge) builds the matrix.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks.base import Context
from ddpdoctor.probe.linkmap import ITERS, LATENCY_ITERS, PASSES, judge, partner, rounds

NAME = "links"
CPU_BYTES = 1 << 20
CUDA_BYTES = 64 << 20
__all__ = ["run", "judge"]


def run(ctx: Context) -> R.RankEntry:
    if ctx.world_size < 2:
        return R.entry(ctx.rank, R.SKIP, "one rank: no link to measure")
    nbytes = ctx.link_bytes or (CUDA_BYTES if ctx.on_cuda else CPU_BYTES)
    payload = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=ctx.device)
    best: dict[int, tuple[float, float]] = {}  # peer -> (seconds to send, round trip)
    for _ in range(PASSES):
        for pairs in rounds(ctx.world_size):
            # GPUs measure a round's pairs at once, as the tournament intends. CPU ranks share the
            # host's cores: pairs measured side by side would time each other's load, so there each
            # pair of a round has its turn (every rank knows the device, so all agree on the turns).
            for turn in ([[pair] for pair in pairs] if not ctx.on_cuda else [pairs]):
                peer = partner(turn, ctx.rank)
                if peer is not None:
                    seconds, round_trip = _measure(ctx, peer, payload)
                    old = best.get(peer, (float("inf"), float("inf")))
                    best[peer] = (min(old[0], seconds), min(old[1], round_trip))
                dist.barrier()
    nbytes = payload.numel() * 4
    links = [{"peer": peer, "GBps": nbytes / seconds / 1e9, "seconds": seconds, "latency_us": round_trip / 2 * 1e6}
             for peer, (seconds, round_trip) in sorted(best.items())]
    return R.entry(ctx.rank, R.PASS, f"{len(links)} link(s) measured", links=links, node=ctx.node_rank,
                   bytes=nbytes, device=ctx.device.type)


def _measure(ctx: Context, peer: int, payload: torch.Tensor) -> tuple[float, float]:
    """(best seconds to send `payload` to `peer` and have it acknowledged, best round trip)."""
    lead = ctx.rank < peer
    delay = ctx.faults.link_delay(peer)
    token = torch.zeros(1, dtype=torch.float32, device=ctx.device)

    def sync() -> None:
        if ctx.on_cuda:
            torch.cuda.synchronize(ctx.device)

    def send(t: torch.Tensor) -> None:
        if delay:
            time.sleep(delay)  # --inject-fault slow-link / slow-rank: every message on this link is late
        dist.send(t, peer)
        sync()

    def recv(t: torch.Tensor) -> None:
        dist.recv(t, peer)
        sync()

    def best_of(tries: int, first: Callable[[], None], second: Callable[[], None], timed: bool) -> float:
        best = float("inf")
        for _ in range(tries):
            started = time.perf_counter()
            first()
            second()
            if timed:
                best = min(best, time.perf_counter() - started)
        return best

    # Warm-up both ways: setting up the connection (NCCL builds a communicator per pair) is no link speed.
    if lead:
        send(payload)
        recv(payload)
    else:
        recv(payload)
        send(payload)
    seconds = 0.0
    round_trip = 0.0
    for leader_sends in (True, False):
        if lead == leader_sends:  # this rank sends the payload; the peer acknowledges
            seconds = best_of(ITERS, lambda: send(payload), lambda: recv(token), True)
        else:
            best_of(ITERS, lambda: recv(payload), lambda: send(token), False)
    for leader_starts in (True, False):
        if lead == leader_starts:
            round_trip = best_of(LATENCY_ITERS, lambda: send(token), lambda: recv(token), True)
        else:
            best_of(LATENCY_ITERS, lambda: recv(token), lambda: send(token), False)
    return seconds, round_trip
