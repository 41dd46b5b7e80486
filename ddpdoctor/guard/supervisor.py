"""The guard's supervisor: a small process that outlives a SIGKILLed guard and stops its job.

    python -m ddpdoctor.guard.supervisor GUARD_PID

Started by the guard in a session of its own (Ctrl-C in the terminal does not reach it), with a
pipe on its standard input of which the guard holds the only write end. It remembers, once a second,
every process below the guard (reaper.Job). The guard writes `launcher PID` once the job
runs and `done` when it has cleaned up itself; end of file without `done` means the guard died,
and then the supervisor stops every process it remembers, as the guard would have.
"""

from __future__ import annotations

import os
import select
import sys

from ddpdoctor.guard.reaper import WATCH_S, Job, stop
from ddpdoctor.procfs import read_stat


def supervise(guard: int) -> int:
    stat = read_stat(guard)
    if stat is None:
        return 0
    job = Job(guard)
    launcher = None
    buffered = b""
    while True:
        readable, _, _ = select.select([0], [], [], WATCH_S)
        job.refresh()
        if readable:
            chunk = os.read(0, 256)
            if not chunk:
                break  # the guard is gone
            buffered += chunk
            for line in buffered.split(b"\n")[:-1]:
                if line == b"done":
                    return 0
                if line.startswith(b"launcher ") and line[9:].isdigit():
                    launcher = int(line[9:])
            buffered = buffered[buffered.rfind(b"\n") + 1:][-256:]
    job.refresh()
    left = job.alive()
    if left:
        sys.stderr.write(f"ddpdoctor guard: the guard was killed; stopping the {len(left)} processes of its job\n")
        sys.stderr.flush()
        stop(job, launcher)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(supervise(int(sys.argv[1])))
    except KeyboardInterrupt:
        sys.exit(130)
