"""Per-check result exchange through the c10d TCPStore, which doubles as the heartbeat.

Every rank posts its entry for a check under `r/<check>/<rank>`. Rank 0 waits (at most the check
timeout) for all of them, judges the check and publishes the record under `d/<check>`; the others
wait for that decision. A rank whose key never appears is named as missing, which is how a hung or
dead rank is detected without a collective that would hang with it. The store is used rather than a
collective precisely because it has timeouts that do not depend on the missing peer.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any, Callable, Optional

from ddpdoctor.probe import results as R

POLL_S = 0.01
SLICE_S = 0.2


def _wait(store: Any, keys: list[str], seconds: float) -> bool:
    """True when all keys exist; False when `seconds` passed first."""
    if seconds <= 0:
        return all(_check(store, k) for k in keys)
    try:
        store.wait(keys, timedelta(seconds=seconds))
        return True
    except Exception:  # noqa: BLE001 -- the store reports a timeout as an error
        return False


def _check(store: Any, key: str) -> bool:
    return bool(store.check([key]))


def post_crash(store: Any, rank: int, text: str) -> None:
    """Best effort, from a dying rank, so that rank 0 stops waiting for it at once."""
    try:
        store.set(f"crash/{rank}", R.clip_traceback(text))
    except Exception:
        pass


def exchange(
    store: Any,
    check: str,
    rank: int,
    world_size: int,
    mine: R.RankEntry,
    timeout: float,
    judge: Callable[[list[R.RankEntry]], R.CheckRecord],
) -> tuple[R.CheckRecord, list[int]]:
    """Returns (the check record, the ranks that did not report). Identical on every rank that gets
    rank 0's decision; a rank that does not hear from rank 0 builds its own record naming it."""
    store.set(f"r/{check}/{rank}", json.dumps(mine))
    if rank == 0:
        return _decide(store, check, world_size, timeout, judge)
    # Rank 0 may itself be waiting up to `timeout` for a late rank, so wait a little longer.
    deadline = time.monotonic() + 2 * timeout + 1.0
    key = f"d/{check}"
    while time.monotonic() < deadline:
        if _wait(store, [key], min(SLICE_S, deadline - time.monotonic())):
            decided = json.loads(store.get(key))
            return decided["record"], decided["missing"]
        if _check(store, "crash/0"):
            break
    # No decision: rank 0 is hung or dead. Report what we can see ourselves.
    return _gather(store, check, world_size, 0.0, judge, waited_for=timeout, no_decision=True)


def _decide(
    store: Any,
    check: str,
    world_size: int,
    timeout: float,
    judge: Callable[[list[R.RankEntry]], R.CheckRecord],
) -> tuple[R.CheckRecord, list[int]]:
    rec, missing = _gather(store, check, world_size, timeout, judge, waited_for=timeout)
    store.set(f"d/{check}", json.dumps({"record": rec, "missing": missing}))
    return rec, missing


def _gather(
    store: Any,
    check: str,
    world_size: int,
    timeout: float,
    judge: Callable[[list[R.RankEntry]], R.CheckRecord],
    waited_for: float,
    no_decision: bool = False,
) -> tuple[R.CheckRecord, list[int]]:
    deadline = time.monotonic() + timeout
    pending = set(range(world_size))
    crashed: dict[int, str] = {}
    # Fast path: block on the keys themselves (no polling latency), in slices so that a rank that
    # posted a crash report is noticed between slices.
    all_keys = [f"r/{check}/{r}" for r in range(world_size)]
    while timeout > 0 and time.monotonic() < deadline:
        if _wait(store, all_keys, min(SLICE_S, deadline - time.monotonic())):
            break
        if any(_check(store, f"crash/{r}") for r in range(world_size)):
            break
    while True:
        for r in sorted(pending):
            if _check(store, f"r/{check}/{r}"):
                pending.discard(r)
            elif _check(store, f"crash/{r}"):
                crashed[r] = store.get(f"crash/{r}").decode(errors="replace")
                pending.discard(r)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    entries: list[R.RankEntry] = []
    for r in range(world_size):
        if r in crashed:
            entries.append(
                R.entry(r, R.FAIL, f"rank {r} crashed during {check}: {_last_line(crashed[r])}", traceback=crashed[r], crashed=True)
            )
        elif r in pending:
            entries.append(R.entry(r, R.FAIL, missing_message(r, check, waited_for, no_decision and r == 0), missing=True))
        else:
            entries.append(json.loads(store.get(f"r/{check}/{r}")))
    missing = sorted(pending | set(crashed))
    return judge(entries), missing


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no message)"


def missing_message(rank: int, check: str, waited_for: float, no_decision: bool = False) -> str:
    """What a rank that went silent during `check` is reported as (here, and by the parent when it
    had to kill every rank because none was left to report)."""
    why = " (and rank 0 published no verdict)" if no_decision else ""
    return f"rank {rank} did not report {check} within {waited_for:g}s: hung, dead, or its node was lost{why}"


def missing_advice(missing: list[int]) -> Optional[str]:
    if not missing:
        return None
    return (
        f"{R.format_ranks(missing)} stopped responding. Look at that rank's traceback or log; for a hang, "
        "dump its stacks (py-spy dump --pid) and check the network between nodes (NCCL_SOCKET_IFNAME / "
        "GLOO_SOCKET_IFNAME, firewalls)."
    )
