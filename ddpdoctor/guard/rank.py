"""The guard inside a rank: what the main thread records, and the reporter thread that sends it.

The main thread's bookkeeping is kept to appending tuples and bumping counters; the reporter
thread wakes every `flush_interval`, sends what accumulated in one message, answers the guard's
requests (`stack`, `stop`) and keeps working while the main thread is blocked in a collective
(torch's collectives release the GIL while they wait). Nothing here may break the user's job:
every failure of the guard turns the guard off, never the training.
"""

from __future__ import annotations

import atexit
import os
import select
import socket
import sys
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable, Optional

from ddpdoctor.guard import frames
from ddpdoctor.guard.options import ACTIVE_ENV, GuardOptions
from ddpdoctor.guard.wire import MAX_LINE, LineReader, encode, nonce, prove, proves

# The one guard of this process, once it is a rank (after init_process_group).
current: Optional["RankGuard"] = None
_start_lock = threading.Lock()
_fork_hook = False


class NotTheGuard(OSError):
    """Something answered on the guard's port without proving the run's secret."""


class LoaderEpoch:
    """One pass over one DataLoader on this rank."""

    __slots__ = ("key", "path", "line", "epoch", "count", "done", "syncing", "joined",
                 "events_seen", "backwards_at_start", "repeat_suspect", "reported_repeat", "sampler_epochs",
                 "sampler_epoch")

    def __init__(self, key: str, path: str, line: int, epoch: int, events_seen: int, backwards: int) -> None:
        self.key, self.path, self.line, self.epoch = key, path, line, epoch
        self.count = 0
        self.done = self.syncing = self.joined = False
        self.events_seen = events_seen
        self.backwards_at_start = backwards
        self.repeat_suspect: Optional[int] = None  # the repeated sampler epoch, until a backward confirms it
        self.reported_repeat = False
        # The shuffling DistributedSampler's completed epochs, and the epoch this pass runs with.
        self.sampler_epochs: Optional[set[int]] = None
        self.sampler_epoch = 0


class RankGuard:
    def __init__(self, options: GuardOptions, rank: int, world_size: int, local_rank: Optional[int],
                 local_world_size: Optional[int]) -> None:
        self.options = options
        self.rank, self.world_size = rank, world_size
        self.local_rank, self.local_world_size = local_rank, local_world_size
        # Recorded by the main thread, taken by the reporter.
        self.events: deque[tuple[str, int, str, str, str, int]] = deque()
        self.event_total = 0
        self.seq: dict[str, int] = {}
        self.inflight: Optional[tuple[str, int, float]] = None
        self.pending_backward: Optional[tuple[str, int]] = None
        self.backward_total = 0
        self.step = 0
        self.last_step_at: Optional[float] = None
        self.waited = 0.0  # seconds in collectives/backward since the last optimizer step
        self.step_times: deque[tuple[int, float]] = deque()
        self.hash_due: Optional[int] = None
        self.hashes: deque[dict[str, Any]] = deque()
        self.local_findings: deque[dict[str, Any]] = deque()
        self.loaders: dict[str, LoaderEpoch] = {}
        self.dirty_loaders: set[str] = set()
        self.join_depth = 0
        self.joins = 0
        self.world_events = 0
        self.batches = 0
        self.forwards = 0  # DDP forwards that sync gradients in the backward that follows
        # Epochs as the script runs them: the values given to DistributedSampler.set_epoch, and each
        # start of one recorded with the counts so far (GRD005 compares them across ranks).
        self.sampler_epoch: Optional[int] = None
        self.epochs_seen = 0
        self.passes_done: dict[str, int] = {}
        self.marks: deque[list[Any]] = deque()
        self.joined_since_mark = False
        self.epoch_loader: tuple[str, int, int] = ("<unknown>", 0, 0)  # path, line, batches of the longest pass
        # The DDP models' parameters, kept only as long as their DDP lives (weakref.finalize), for the
        # replica checks at an epoch's end and at the end of the run.
        self.replicas: list[weakref.finalize] = []
        self.end_hashed_at: Optional[int] = None
        self.group_keys: dict[int, tuple[str, Any]] = {}
        self.last_forward: tuple[str, int] = ("<unknown>", 0)
        self.main_ident = threading.main_thread().ident
        self.sock: Optional[socket.socket] = None
        self.reader: Optional[LineReader] = None
        self.send_lock = threading.Lock()
        self.flush_lock = threading.Lock()
        self.last_sent = 0.0
        self.closed = False
        self.flight_sent_at_exit = False
        # False while the rank said hello before init_process_group returned.
        self.joined = False

    # ------------------------------------------------------------------ connection

    def connect(self, patience: float = 10.0) -> None:
        deadline = time.monotonic() + patience
        while True:  # in-code use: rank 0 may still be opening the side channel
            try:
                sock = socket.create_connection((self.options.host, self.options.port), timeout=patience)
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
                continue
            try:
                self.reader = self._handshake(sock)
                break
            except NotTheGuard:
                sock.close()
                raise
            except (OSError, ValueError) as error:
                # Closed before the hello was answered (a crowd of other connections pushed this
                # one out, say): once more, while there is time.
                sock.close()
                if time.monotonic() > deadline:
                    raise OSError(str(error)) from None
                time.sleep(0.1)
        sock.settimeout(None)
        self.sock = sock
        thread = threading.Thread(target=self._reporter, name="ddpdoctor-guard", daemon=True)
        thread.start()
        atexit.register(self.close)
        # A multiprocessing child (mp.spawn, a forkserver launcher) exits without atexit, but runs these.
        import multiprocessing.util

        multiprocessing.util.Finalize(None, self.send_flight, (True,), exitpriority=0)

    def _handshake(self, sock: socket.socket) -> LineReader:
        """Prove the run's secret on the guard's challenge, and have the guard prove it back on ours:
        the secret itself never travels, and an impostor on the guard's port gets nothing to obey."""
        reader = LineReader(sock)
        challenge = reader.next()
        mine = nonce()
        sock.sendall(encode({"t": "hello", "rank": self.rank, "world_size": self.world_size,
                             "local_rank": self.local_rank, "pid": os.getpid(), "host": socket.gethostname(),
                             "proof": prove(self.options.secret, "rank", str(challenge.get("nonce"))),
                             "nonce": mine}))
        welcome = reader.next()
        if welcome.get("t") != "welcome" or not proves(self.options.secret, "guard", mine, str(welcome.get("proof"))):
            raise NotTheGuard("the side channel did not prove the run's secret")
        return reader

    def _send(self, message: dict[str, Any]) -> None:
        if self.sock is None or self.closed:
            return
        data = encode(message)
        if len(data) > MAX_LINE:
            # Longer than the guard reads: in two messages, each list item sent once.
            for part in split(message):
                self._send(part)
            return
        with self.send_lock:
            try:
                self.sock.sendall(data)
            except OSError:
                self.closed = True  # the guard went away: the job goes on unguarded
        self.last_sent = time.monotonic()

    def close(self) -> None:
        if self.closed:
            return
        self.send_flight(at_exit=True)  # first: the guard asks the other ranks for theirs when it arrives
        self.check_replicas()  # at exit: the last optimizer step's result, if no check saw it yet
        self.flush(final=True)
        self.closed = True
        try:
            assert self.sock is not None
            self.sock.close()
        except (OSError, AssertionError):
            pass

    def _reporter(self) -> None:
        assert self.sock is not None and self.reader is not None
        reader = self.reader
        while not self.closed:
            try:
                readable, _, _ = select.select([self.sock], [], [], 0 if reader.ready else self.options.flush_interval)
                if readable or reader.ready:
                    for message in reader.read():
                        self._handle(message)
            except (OSError, ValueError, ConnectionError):
                self.closed = True
                return
            self.flush()

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message.get("t")
        if kind == "stack":
            frame = sys._current_frames().get(self.main_ident or 0)
            self._send({"t": "stack", "frames": frames.stack_of(frame)})
        elif kind == "fr":
            self.send_flight()
        elif kind == "stop":
            sys.stderr.write(f"ddpdoctor guard: stopping rank {self.rank} ({message.get('why', 'stopped')})\n")
            sys.stderr.flush()
            os._exit(1)

    def send_flight(self, at_exit: bool = False, announce: bool = False) -> None:
        """This rank's Flight Recorder (None where it has none): when the guard asks (a stall, a mismatch), and
        once as the rank exits, so that a rank that ended early has left its record. Announced (whether there is
        one, without its entries) when the process group is up: without one, the guard waits for none."""
        if (at_exit and self.flight_sent_at_exit) or current is not self or not self.joined:
            return  # sent already; a forked child is not this rank; no process group yet
        self.flight_sent_at_exit |= at_exit
        from ddpdoctor.guard.flight.live import recording, snapshot

        on = recording()
        self._send({"t": "fr", "on": on, "dump": snapshot() if on and not announce else None, "exit": at_exit})

    def flush(self, final: bool = False) -> None:
        """Send what the main thread recorded since the last flush (a heartbeat at least every second)."""
        with self.flush_lock:
            self._flush(final)

    def _flush(self, final: bool) -> None:
        events, steps, hashes, local = (_drain(q) for q in (self.events, self.step_times, self.hashes,
                                                             self.local_findings))
        dirty = _drain_set(self.dirty_loaders)
        loaders = {}
        for key in dirty:
            state = self.loaders.get(key)
            if state is not None:
                loaders[key] = [state.path, state.line, state.epoch, state.count, state.done, state.syncing,
                                state.joined]
        inflight = self.inflight
        marks = _drain(self.marks)
        message: dict[str, Any] = {"t": "state", "progress": self.event_total + self.step + self.batches}
        if events:
            message["ev"] = events
        if steps:
            message["steps"] = steps
        if hashes:
            message["hashes"] = hashes
        if local:
            message["local"] = local
        if loaders:
            message["loaders"] = loaders
        if marks:
            message["marks"] = marks
        message["inflight"] = None if inflight is None else [inflight[0], inflight[1], time.monotonic() - inflight[2]]
        if final:
            message["final"] = True
        if len(message) > 3 or final or time.monotonic() - self.last_sent > 1.0 or inflight is not None:
            message["counts"] = self.counts()
            self._send(message)

    def counts(self) -> list[int]:
        """Since the start (doctor.COUNT_NAMES): batches drawn, DDP forwards, backwards, optimizer steps,
        collectives, epochs (set_epoch values, else the most complete passes over one loader), Join
        entries, collectives of the whole world."""
        epochs = self.epochs_seen or max(self.passes_done.values(), default=0)
        return [self.batches, self.forwards, self.backward_total, self.step, self.event_total, epochs, self.joins,
                self.world_events]

    # ------------------------------------------------------------------ what the patches call

    def group_key(self, group: Any) -> str:
        if group is None:
            return "W"
        cached = self.group_keys.get(id(group))
        if cached is not None and cached[1] is group:
            return cached[0]
        import torch.distributed as dist

        try:
            ranks = dist.get_process_group_ranks(group)
        except Exception:  # noqa: BLE001
            ranks = []
        key = "W" if (group is dist.GroupMember.WORLD or len(ranks) == self.world_size) else ",".join(map(str, ranks))
        self.group_keys[id(group)] = (key, group)
        return key

    def record(self, group: str, op: str, signature: str, path: str, line: int) -> int:
        """The call's position in its group's sequence; -1 inside Join, whose ranks rightly run
        different collectives (the finished ones shadow the others' with Join's own), so that nothing
        there is compared and the sequences meet again where Join ends."""
        self.event_total += 1
        if self.join_depth:
            return -1
        seq = self.seq.get(group, 0)
        self.seq[group] = seq + 1
        if not self.closed:  # once the guard is gone, nothing may pile up
            self.events.append((group, seq, op, signature, path, line))
        if group == "W":
            self.world_events += 1
        return seq

    def after_wait(self, started: float) -> None:
        self.inflight = None
        self.waited += time.monotonic() - started

    def on_step(self) -> None:
        now = time.monotonic()
        self.step += 1
        if self.last_step_at is not None and not self.closed:
            busy = now - self.last_step_at - self.waited
            self.step_times.append((self.step, busy if busy > 0.0 else 0.0))
        self.last_step_at, self.waited = now, 0.0
        if self.step % self.options.every == 0:
            self.hash_due = self.step

    def on_set_epoch(self, epoch: int, path: str, line: int) -> None:
        """A DistributedSampler's set_epoch: the start of one of the script's epochs (a repeated value,
        as from a train and a validation sampler, is the same epoch)."""
        if epoch == self.sampler_epoch:
            return
        self.sampler_epoch = epoch
        self.epochs_seen += 1
        if not self.closed:
            loader_path, loader_line, _ = self.epoch_loader
            self.marks.append([self.epochs_seen - 1, epoch, self.counts(), self.joined_since_mark or self.join_depth > 0,
                               loader_path, loader_line, path, line])
        self.joined_since_mark = False
        self.epoch_loader = ("<unknown>", 0, 0)

    def check_replicas(self) -> None:
        """Hash every live DDP model's parameters after this optimizer step, once per step: at an epoch's
        end, when the process group is destroyed and at exit, so that a run shorter than --every is
        compared too. Parameters only: buffers such as BatchNorm's running statistics follow each
        rank's last forward until DDP broadcasts them again."""
        if self.closed or self.step == 0 or self.end_hashed_at == self.step:
            return
        names: list[str] = []
        tensors: list[Any] = []
        for index, finalizer in enumerate(self.replicas):
            held = finalizer.peek()
            if held is None:
                continue
            _, _, (model_names, model_tensors), _ = held
            names.extend(f"model{index}.{n}" if len(self.replicas) > 1 else n for n in model_names)
            tensors.extend(model_tensors)
        self._hash_end(names, tensors)

    def _hash_end(self, names: list[str], tensors: list[Any]) -> None:
        # Under Join a rank that ran out of inputs stops stepping: equal step numbers no longer mean
        # the same point of the training, so these checks are off once it is used.
        if self.closed or self.step == 0 or self.end_hashed_at == self.step or not tensors or self.joins:
            return
        self.end_hashed_at = self.step
        try:
            from ddpdoctor.guard.hashing import digests

            path, line = self.last_forward
            self.hashes.append({"step": self.step, "kind": "end", "names": names, "values": digests(tensors),
                                "path": path, "line": line})
        except Exception:  # noqa: BLE001 - never break the user's job
            pass

    def watch_replica(self, ddp: Any, names: list[str], tensors: list[Any]) -> None:
        # When the DDP goes away (its training function returned), its last state is checked then.
        finalizer = weakref.finalize(ddp, self._hash_end, names, tensors)
        finalizer.atexit = False  # at exit, close() checks what is still alive
        self.replicas = [f for f in self.replicas if f.alive][-7:] + [finalizer]

    def report_local(self, code: str, message: str, path: str, line: int, epoch: Optional[int] = None) -> None:
        if self.closed:
            return
        self.local_findings.append({"code": code, "message": message, "path": path, "line": line,
                                    "step": self.step, "epoch": epoch})

    # DataLoader passes ---------------------------------------------------------

    def loader_epoch(self, loader: Any, path: str, line: int) -> LoaderEpoch:
        registry: dict[int, str] = self.__dict__.setdefault("_loader_keys", {})
        key = registry.get(id(loader))
        if key is None:
            site = f"{path}:{line}"
            ordinal = sum(1 for k in registry.values() if k.startswith(site + "#"))
            key = registry[id(loader)] = f"{site}#{ordinal}"
        previous = self.loaders.get(key)
        epoch = previous.epoch + 1 if previous is not None else 0
        state = LoaderEpoch(key, path, line, epoch, self.event_total, self.backward_total)
        self.loaders[key] = state
        self.dirty_loaders.add(key)
        return state

    def on_batch(self, state: LoaderEpoch) -> None:
        state.count += 1
        self.batches += 1
        if self.event_total > state.events_seen:  # _note_sync, inline: this runs for every batch
            state.syncing = True
        state.events_seen = self.event_total
        if state.count > self.epoch_loader[2]:
            self.epoch_loader = (state.path, state.line, state.count)
        if self.join_depth:
            state.joined = self.joined_since_mark = True
        self.dirty_loaders.add(state.key)
        if state.repeat_suspect is not None and not state.reported_repeat and self.backward_total > state.backwards_at_start:
            state.reported_repeat = True
            # The script's epoch: full passes over this loader before this one (a peek at one batch,
            # `next(iter(loader))`, is not an epoch). Each epoch that repeats says so in the same
            # words, and the guard makes one finding of them, with the epochs it covers.
            self.report_local(
                "GRD004",
                f"the shuffling DistributedSampler of the loader iterated here is still at "
                f"set_epoch({state.repeat_suspect}) when a new epoch runs over it: every epoch repeats the same "
                f"order on every rank (lint's DDP001, confirmed at run time); call sampler.set_epoch(epoch) "
                f"before iterating", state.path, state.line, epoch=self.passes_done.get(state.key, 0))

    def on_loader_end(self, state: LoaderEpoch) -> None:
        self._note_sync(state)
        state.done = True
        self.passes_done[state.key] = self.passes_done.get(state.key, 0) + 1
        if state.count > 1:
            self.check_replicas()  # the end of an epoch (a peek at one batch is not one)
        if state.sampler_epochs is not None:
            state.sampler_epochs.add(state.sampler_epoch)
        self.dirty_loaders.add(state.key)
        self.flush()  # the end of an epoch is what GRD005 compares: send it before any hang

    def _note_sync(self, state: LoaderEpoch) -> None:
        # A pass "syncs" when collectives run between its batches: only then do uneven counts hang.
        if self.event_total > state.events_seen:
            state.syncing = True
        state.events_seen = self.event_total


def start(options: GuardOptions) -> Optional[RankGuard]:
    """Become a guarded rank (called after init_process_group); None if the guard cannot run."""
    def numbered() -> Optional[tuple[int, int, Optional[int], Optional[int]]]:
        import torch.distributed as dist

        if not dist.is_initialized():
            return None
        return dist.get_rank(), dist.get_world_size(), int_env("LOCAL_RANK"), int_env("LOCAL_WORLD_SIZE")

    return _start(options, numbered)


def start_as(options: GuardOptions, job_rank: int, world_size: int, local_rank: Optional[int],
             local_world_size: Optional[int]) -> Optional[RankGuard]:
    """Become a guarded rank as another framework numbers it (Horovod, after hvd.init())."""
    if options.rank0_hosts:
        return None  # in-code use meets rank 0 through torch's store: a torch process group only
    return _start(options, lambda: (job_rank, world_size, local_rank, local_world_size))


def _start(options: GuardOptions,
           numbered: Callable[[], Optional[tuple[int, int, Optional[int], Optional[int]]]]) -> Optional[RankGuard]:
    global current
    with _start_lock:
        if current is not None and current.joined:
            return current
        if current is None and os.environ.get(ACTIVE_ENV) == str(os.getpid()):
            return None
        ids = numbered()
        if ids is None:
            return None
        job_rank, world_size, local_rank, local_world_size = ids
        frames.skip_torch_frames()
        guard = current
        if guard is not None and (guard.closed or (guard.rank, guard.world_size) != (job_rank, world_size)):
            guard.close()  # said hello as another rank than the process group made it: start over
            guard = current = None
        if guard is None:
            if options.rank0_hosts:
                from ddpdoctor.guard.inprocess import meet_rank0

                met = meet_rank0(options, job_rank)
                if met is None:
                    return None
                options = met
            guard = RankGuard(options, job_rank, world_size, local_rank, local_world_size)
            try:
                guard.connect()
            except OSError as error:
                sys.stderr.write(f"ddpdoctor guard: rank {guard.rank} cannot reach the guard at "
                                 f"{options.host}:{options.port} ({error}); running unguarded\n")
                return None
            _became(guard)
        guard.joined = True
        guard.send_flight(announce=True)
        from ddpdoctor.guard import patches

        patches.patch_training()
        return guard


def start_early(options: GuardOptions, rank: Optional[int], world_size: Optional[int]) -> Optional[RankGuard]:
    """Say hello before init_process_group, as the rank the launcher made this process, so that a
    rank stuck before or in the rendezvous is seen (and its stack can be asked for). None when the
    rank is not known yet, or this process is a child of a guarded rank."""
    if options.rank0_hosts or not options.secret or rank is None or world_size is None:
        return None
    if not 0 <= rank < world_size or os.environ.get(ACTIVE_ENV):
        return None
    with _start_lock:
        if current is not None:
            return current
        frames.skip_torch_frames()  # torch.distributed is imported: where init_process_group is called from
        guard = RankGuard(options, rank, world_size, int_env("LOCAL_RANK"), int_env("LOCAL_WORLD_SIZE"))
        try:
            guard.connect(patience=2.0)
        except OSError:
            return None  # init_process_group tries again, with the rank the process group gives
        _became(guard)
        return guard


def elastic_worker() -> tuple[Optional[int], Optional[int]]:
    """(RANK, WORLD_SIZE) in a worker that torch elastic (torchrun) started, else (None, None)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or "LOCAL_RANK" not in os.environ:
        return None, None
    return int_env("RANK"), int_env("WORLD_SIZE")


def _became(guard: RankGuard) -> None:
    global current, _fork_hook
    os.environ[ACTIVE_ENV] = str(os.getpid())
    current = guard
    if not _fork_hook:
        _fork_hook = True
        # A forked child (a DataLoader worker) is not this rank: it must not record or report.
        os.register_at_fork(after_in_child=_forget_in_child)


def _forget_in_child() -> None:
    global current
    current = None


def split(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A state message in two whose items add up to it (the longest list halved), or none when there
    is nothing to halve (such a message cannot be sent: it is dropped)."""
    lists = [(len(v), k) for k, v in message.items() if isinstance(v, list) and len(v) > 1]
    if not lists:
        return []
    key = max(lists)[1]
    items = message[key]
    half = len(items) // 2
    head: dict[str, Any] = {k: message[k] for k in ("t", "progress", "inflight") if k in message}
    return [{**head, key: items[:half]}, {**message, key: items[half:]}]


def _drain(queue: "deque[Any]") -> list[Any]:
    # popleft is atomic, so the main thread may keep appending while this runs.
    return [queue.popleft() for _ in range(len(queue))]


def _drain_set(items: set[str]) -> list[str]:
    taken = []
    while items:
        try:
            taken.append(items.pop())
        except KeyError:
            break
    return taken


def int_env(name: str) -> Optional[int]:
    try:
        value = int(os.environ[name])
    except (KeyError, ValueError):
        return None
    return value if 0 <= value < 1 << 20 else None


def patch_distributed(module: Any) -> None:
    """The import hook's entry: wrap torch.distributed's collectives and init_process_group."""
    from ddpdoctor.guard import patches

    patches.patch_collectives(module)
    options = GuardOptions.from_env()
    if options is not None:
        from ddpdoctor.guard.flight.live import turn_on

        turn_on()
        start_early(options, *elastic_worker())
