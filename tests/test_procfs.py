"""ddpdoctor.procfs against real processes: a shell that starts a sleeper in a session of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ddpdoctor import procfs

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux")


@pytest.fixture
def family():
    """A session leader (sh) with one child (sleep): parent -> sh -> sleep."""
    shell = subprocess.Popen(["sh", "-c", "sleep 30 & wait"], start_new_session=True)
    deadline = time.monotonic() + 10
    while not procfs.children(shell.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    yield shell
    try:
        os.killpg(shell.pid, 9)
    except OSError:
        pass
    shell.wait()


def test_read_stat_of_this_process() -> None:
    stat = procfs.read_stat(os.getpid())
    assert stat is not None
    assert stat.pid == os.getpid()
    assert stat.ppid == os.getppid()
    assert stat.pgrp == os.getpgrp()
    assert stat.session == os.getsid(0)
    assert stat.state in ("R", "S") and not stat.zombie


def test_a_gone_process_has_no_stat() -> None:
    done = subprocess.Popen(["true"])
    done.wait()
    assert procfs.read_stat(done.pid) is None


def test_a_zombie_is_seen_as_one() -> None:
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while (stat := procfs.read_stat(child.pid)) is not None and not stat.zombie and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stat is not None and stat.zombie  # exited, not yet reaped by us
    child.wait()


def test_children_descendants_and_session(family: subprocess.Popen) -> None:
    kids = procfs.children(family.pid)
    assert len(kids) == 1
    grandchild = kids[0]
    assert procfs.children(os.getpid()).count(family.pid) == 1
    below = procfs.descendants(os.getpid())
    assert below.index(family.pid) < below.index(grandchild)  # nearest first
    assert procfs.descendants(family.pid) == [grandchild]
    assert sorted(procfs.session_members(family.pid)) == sorted([family.pid, grandchild])
    assert os.getpid() not in procfs.session_members(family.pid)


def test_a_command_name_with_parentheses_and_spaces_is_parsed(tmp_path) -> None:
    # The name field of /proc/<pid>/stat is "(...)" and may hold ") (" itself: the kernel takes
    # it from the executable's file name.
    odd = tmp_path / "odd) (name"
    odd.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(odd), "30"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{proc.pid}/stat") as handle:
                if "odd" in handle.read():
                    break
            time.sleep(0.02)
        stat = procfs.read_stat(proc.pid)
        assert stat is not None and stat.ppid == os.getpid() and stat.state in ("S", "R")
    finally:
        proc.kill()
        proc.wait()


def test_start_times_and_descent_from_several_roots(family) -> None:
    (grandchild,) = procfs.children(family.pid)
    table = procfs.process_table()
    me = table[os.getpid()]
    assert 0 < me.start <= table[family.pid].start <= table[grandchild].start  # clock ticks since boot
    assert procfs.read_stat(os.getpid()).start == me.start  # stable: with the pid, it names one process
    assert procfs.below({family.pid}, table) == [grandchild]
    assert procfs.below({family.pid, grandchild}, table) == []  # roots are not their own descendants
    mine = procfs.below({os.getpid()}, table)
    assert mine.index(family.pid) < mine.index(grandchild)
