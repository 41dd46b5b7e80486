"""The start-up watchdog: dumps a stalled rank's stacks once, with the GIL held, never crashes it."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
import time

from ddpdoctor.probe import stall


def waiting_for_the_store(seconds: float) -> None:
    time.sleep(seconds)


def test_an_armed_watchdog_dumps_the_main_threads_stack_once() -> None:
    out = io.StringIO()
    stall.arm(0.1, stream=out)
    waiting_for_the_store(0.6)
    stall.disarm()
    text = out.getvalue()
    assert text.count(stall.HEADER.format(seconds=0.1)) == 1
    assert "waiting_for_the_store" in text
    assert "ddpdoctor-startup-watchdog" not in text  # its own stack is noise


def test_a_disarmed_watchdog_says_nothing() -> None:
    out = io.StringIO()
    stall.arm(0.2, stream=out)
    stall.disarm()
    time.sleep(0.4)
    assert out.getvalue() == ""


def test_arming_again_replaces_the_earlier_timer() -> None:
    first, second = io.StringIO(), io.StringIO()
    stall.arm(0.2, stream=first)
    stall.arm(0.3, stream=second)
    time.sleep(0.6)
    stall.disarm()
    assert first.getvalue() == ""
    assert stall.HEADER.format(seconds=0.3) in second.getvalue()


def test_disarm_without_arm_is_harmless() -> None:
    stall.disarm()
    stall.disarm()


def test_the_budget_covers_join_and_process_group_not_just_one_check() -> None:
    # A spawned rank spends seconds importing torch before it even connects: the per-check
    # timeout (2 s in the tests) alone would dump every slow start-up.
    assert stall.startup_budget(timeout=2.0, join_timeout=60.0) == 62.0
    assert stall.startup_budget(timeout=5.0, join_timeout=0.5) == 5.5


def test_a_real_process_stalled_in_start_up_logs_its_stack_and_lives_on() -> None:
    script = textwrap.dedent(
        """
        import threading, time
        from ddpdoctor.probe import stall

        def busy():  # another thread churning frames while the dump reads them
            end = time.time() + 1.5
            while time.time() < end:
                sum(i for i in range(100))

        def connecting_to_rank_zero():
            time.sleep(1.0)

        threading.Thread(target=busy).start()
        stall.arm(0.3)
        connecting_to_rank_zero()
        stall.disarm()
        print("still alive")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "still alive"
    assert stall.HEADER.format(seconds=0.3) in proc.stderr
    assert "connecting_to_rank_zero" in proc.stderr
    assert "busy" in proc.stderr
