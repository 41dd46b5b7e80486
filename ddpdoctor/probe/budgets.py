"""How long a run, and each phase of it, may take before the parent counts it as hung.

One set of terms serves both judgments the parent's watchdog makes (ddpdoctor.probe.procs): the
overall deadline, the safety net for the whole run, and the per-phase bound by which it judges that
no rank is making progress any more. Every wait inside a rank is bounded by one of these terms, so a
rank silent for longer than its phase's bound is stuck, not slow. No torch here.
"""

from __future__ import annotations

from ddpdoctor.probe.config import RankConfig
from ddpdoctor.probe.linkmap import NAME as LINKS
from ddpdoctor.probe.linkmap import time_budget
from ddpdoctor.probe.stall import startup_budget

STARTUP = "startup"  # a rank file's `running` before its first check
# Scheduling slack on top of a check's timeouts, and on top of the whole run's.
CHECK_SLACK_S = 2.0
RUN_SLACK_S = 10.0


def check_worst_case(timeout: float) -> float:
    """A check's worst case on one rank: its run (timeout), rank 0's wait for the others' results
    (timeout) and the others' wait for rank 0's decision (timeout + 1 s, see exchange), with slack."""
    return 3 * timeout + CHECK_SLACK_S


def links_budget(config: RankConfig, world_size: int) -> float:
    """The link map's own time on top of a check's, which grows with the number of rank pairs."""
    return time_budget(world_size) if LINKS in config.checks else 0.0


def check_budget(config: RankConfig, name: str, world_size: int = 0) -> float:
    return check_worst_case(config.timeout) + (links_budget(config, world_size) if name == LINKS else 0.0)


def overall_deadline(config: RankConfig, world_size: int = 0) -> float:
    """Upper bound on a run: join, plus each check's worst case, plus the link map's own time."""
    return (config.join_timeout + len(config.checks) * check_worst_case(config.timeout)
            + links_budget(config, world_size) + RUN_SLACK_S)


def phase_budgets(config: RankConfig, world_size: int = 0) -> dict[str, float]:
    """Phase (a rank file's `running`) -> how long a rank may go without progress in it.

    Start-up gets the rank's own start-up budget plus a check's slack, so that the stacks the rank
    dumps into its log when start-up outlives that budget (ddpdoctor.probe.stall) are written before
    the parent kills it."""
    budgets = {STARTUP: startup_budget(config.timeout, config.join_timeout) + CHECK_SLACK_S}
    for name in config.checks:
        budgets[name] = check_budget(config, name, world_size)
    return budgets
