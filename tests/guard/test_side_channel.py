"""The side channel's pieces on their own: framing, the schema, and the server on a real loopback
socket with the real doctor behind it (no ranks)."""

from __future__ import annotations

import io
import json
import socket
import time
from typing import Any

import pytest

from ddpdoctor.guard import schema, server
from ddpdoctor.guard.doctor import Doctor
from ddpdoctor.guard.notices import Notices
from ddpdoctor.guard.options import GuardOptions
from ddpdoctor.guard.wire import LineReader, LineSplitter, ProtocolError, encode, prove, proves

SECRET = "0123456789abcdef"


def test_lines_split_across_chunks_and_bounded() -> None:
    splitter = LineSplitter(limit=64)
    assert splitter.feed(b'{"a": 1}\n{"b"') == [{"a": 1}]
    assert splitter.feed(b': 2}\n\n') == [{"b": 2}]
    splitter.feed(b"x" * 64)  # exactly the limit, no newline yet: still accepted
    with pytest.raises(ProtocolError, match="longer than 64 bytes"):
        splitter.feed(b"x")
    for bad, said in ((b"not json\n", "not JSON"), (b"[1]\n", "not an object"), (b"[" * 100_000 + b"\n", "not JSON")):
        with pytest.raises(ProtocolError, match=said):
            LineSplitter(limit=1 << 20).feed(bad)


def test_a_long_line_is_not_copied_on_every_chunk() -> None:
    # 4 MiB in 64 KiB chunks: linear, not a re-scan (and re-copy) of the whole buffer per chunk.
    splitter = LineSplitter()
    started = time.process_time()
    for _ in range(63):
        splitter.feed(b"y" * 65536)
    assert splitter.scanned == 63 * 65536
    assert time.process_time() - started < 0.5


def hello(**fields: Any) -> dict[str, Any]:
    """A rank's hello; Channel.connect replaces "secret" with its proof on the server's challenge."""
    return {"t": "hello", "rank": 0, "world_size": 2, "proof": "0" * 64, "nonce": "mine", "secret": SECRET, **fields}


@pytest.mark.parametrize("fields, said", [
    ({"rank": 2}, "rank is not an integer in [0, 1]"),
    ({"rank": -1}, "rank is not an integer in [0, 1]"),
    ({"rank": "0"}, "rank is not an integer"),
    ({"rank": True}, "rank is not an integer"),
    ({"world_size": 10 ** 15}, "world_size is not an integer in [1, 1048576]"),
    ({"world_size": 0}, "world_size is not an integer"),
    ({"local_rank": 1.5}, "local_rank is not an integer"),
    ({"proof": 7}, "proof is not a string"),
    ({"proof": "f" * 65}, "proof is not a string of at most 64 characters"),
    ({"nonce": None}, "nonce is not a string"),
    ({"host": "h" * 300}, "host is not a string of at most 256 characters"),
    ({"t": "state"}, "the first message is not a hello"),
])
def test_bad_hellos(fields: dict[str, Any], said: str) -> None:
    with pytest.raises(schema.BadMessage) as error:
        schema.hello(hello(**fields))
    assert str(error.value).startswith(said)


def state(**fields: Any) -> dict[str, Any]:
    return {"t": "state", "progress": 3, "inflight": None, **fields}


@pytest.mark.parametrize("fields, said", [
    ({"ev": [["W", 0, "all_reduce", "", "t.py"]]}, "an event is not a list of 6 items"),
    ({"ev": [["5", 0, "all_reduce", "", "t.py", 1]]}, "group is not 'W' or a list of ranks"),
    ({"ev": [["0,x", 0, "all_reduce", "", "t.py", 1]]}, "group is not"),
    ({"ev": [["W", 2 ** 60, "all_reduce", "", "t.py", 1]]}, "seq is not an integer"),
    ({"inflight": ["W", 0, float("nan")]}, "inflight seconds is not a finite number"),
    ({"inflight": ["W", 0, 1e300]}, "inflight seconds is not a finite number"),
    ({"steps": [[1, -0.5]]}, "step seconds is not a finite number"),
    ({"loaders": {"k": ["t.py", 1, 0, 1, 1, False, False]}}, "done is not true or false"),
    ({"loaders": []}, "loaders is not an object"),
    ({"hashes": [{"step": 1, "names": ["w"], "values": [2 ** 70]}]}, "a digest is not an integer"),
    ({"local": [{"code": "GRD999", "message": "m", "path": "p", "line": 1}]}, "a local finding's code is not"),
    ({"progress": "3"}, "progress is not an integer"),
    ({"final": 1}, "final is not true or false"),
    ({"t": "stop"}, "a message that is neither state, stack nor fr"),
])
def test_bad_messages(fields: dict[str, Any], said: str) -> None:
    with pytest.raises(schema.BadMessage) as error:
        schema.message(state(**fields), world_size=2)
    assert str(error.value).startswith(said)


def test_text_reaches_the_doctor_with_control_characters_escaped() -> None:
    checked = schema.message(state(ev=[["0,1", 0, "all_reduce", "float32[1]", "t\x1b[31m.py", 9]],
                                   local=[{"code": "GRD004", "message": "a\rb\x9bc", "path": "p", "line": 1}]), 2)
    assert checked["ev"] == [("0,1", 0, "all_reduce", "float32[1]", "t\\x1b[31m.py", 9)]
    assert checked["local"][0]["message"] == "a\\rb\\x9bc"
    frames = schema.message({"t": "stack", "frames": [["t.py", 3, "f\x07"]]}, 2)
    assert frames == {"t": "stack", "frames": [("t.py", 3, "f\\x07")]}


class Channel:
    """A real SideChannel on loopback with the real doctor; warnings collected."""

    def __init__(self, job: str = "", followers: int = 0) -> None:
        self.stream = io.StringIO()
        self.found: list[Any] = []
        self.channel = server.SideChannel("127.0.0.1", 0, SECRET, job=job, followers=followers,
                                          notices=Notices(self.stream))
        self.doctor = Doctor(GuardOptions(), self.channel.send, self.found.append, notices=self.channel.notices)
        self.channel.start(self.doctor)

    def connect(self, *messages: dict[str, Any]) -> socket.socket:
        """Connect, take the server's challenge, send `messages` (a hello's secret as its proof)."""
        sock = socket.create_connection(self.channel.address, timeout=5)
        challenge = LineReader(sock).next()
        assert challenge["t"] == "challenge" and len(challenge["nonce"]) == 32
        for message in messages:
            if "secret" in message and message["t"] == "hello":
                message = {**message, "proof": prove(message.pop("secret"), "rank", challenge["nonce"])}
            sock.sendall(encode(message))
        return sock

    def wait(self, condition: Any) -> bool:
        deadline = time.monotonic() + 5
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.02)
        return bool(condition())

    def warnings(self) -> list[str]:
        return self.stream.getvalue().splitlines()


def closed(sock: socket.socket) -> bool:
    """Whether the server closed the connection in time (whatever it said first)."""
    sock.settimeout(server.HELLO_TIMEOUT_S + 2)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False
    finally:
        sock.close()


@pytest.fixture
def channel() -> Any:
    made = Channel()
    yield made
    made.channel.close()


def test_ranks_with_the_secret_join_and_fix_the_world_size(channel: Channel) -> None:
    first = channel.connect(hello(rank=1))
    assert channel.wait(lambda: channel.doctor.world_size == 2)
    assert closed(channel.connect(hello(rank=0, world_size=3)))  # not the job's world size
    assert closed(channel.connect(hello(rank=1)))  # rank 1 is connected already
    second = channel.connect(hello(rank=0))
    assert channel.wait(lambda: channel.channel.connected() == 2)
    assert sorted(channel.doctor.ranks) == [0, 1]
    first.sendall(encode(state(ev=[["W", 0, "barrier", "", "t.py", 4]])))
    assert channel.wait(lambda: channel.doctor.ranks[1].next_seq == {"W": 1})
    first.close()
    second.close()
    assert channel.wait(lambda: channel.channel.connected() == 0)
    # Both refusals are of one kind (a peer that did not join): said once, the first.
    (warning,) = channel.warnings()
    assert warning.startswith("ddpdoctor guard: warning: dropped a side-channel connection from 127.0.0.1:")
    assert warning.endswith(": world size 3 is not the job's 2")


def test_a_wrong_secret_is_closed_at_once_and_said_once(channel: Channel) -> None:
    for secret in ("", SECRET[:-1], SECRET + "0", "x" * 16):
        assert closed(channel.connect(hello(secret=secret)))
    assert channel.doctor.ranks == {} and channel.doctor.world_size == 0
    (warning,) = channel.warnings()
    assert warning.endswith("it did not prove the run's secret")


def test_a_joined_rank_that_sends_a_bad_message_is_dropped_and_the_doctor_goes_on(channel: Channel) -> None:
    rank0 = channel.connect(hello(rank=0))
    rank1 = channel.connect(hello(rank=1))
    assert channel.wait(lambda: channel.channel.connected() == 2)
    rank1.sendall(encode(state(steps=[[1, float("inf")]])))
    assert closed(rank1)
    assert channel.wait(lambda: not channel.doctor.ranks[1].connected)
    rank0.sendall(encode(state(ev=[["W", 0, "barrier", "", "t.py", 4]])))
    assert channel.wait(lambda: channel.doctor.ranks[0].next_seq == {"W": 1})
    assert not channel.doctor.broken and channel.found == []
    (warning,) = channel.warnings()
    assert "dropped a side-channel connection from rank 1 (127.0.0.1:" in warning
    assert warning.endswith("step seconds is not a finite number of seconds")
    rank0.close()


def test_silent_connections_are_bounded_and_expire(channel: Channel) -> None:
    crowd = [channel.connect() for _ in range(3 * server.MAX_PENDING)]
    # The oldest give way to the newest: a rank that connects now still gets in.
    rank = channel.connect(hello(rank=0))
    assert channel.wait(lambda: channel.channel.connected() == 1)
    assert len(channel.channel.pending) <= server.MAX_PENDING
    assert all(closed(sock) for sock in crowd)
    assert channel.wait(lambda: not channel.channel.pending)
    rank.close()


def test_an_unauthenticated_line_is_bounded_to_a_hello(channel: Channel) -> None:
    sock = channel.connect()
    try:
        sock.sendall(b"{" + b" " * (server.HELLO_LINE + 10))
    except (ConnectionResetError, BrokenPipeError):
        pass
    assert closed(sock)
    assert "longer than 4096 bytes" in channel.warnings()[0]


def test_another_nodes_guard_of_the_same_job_registers_its_ranks_secret() -> None:
    made = Channel(job="torchrun 127.0.0.1:29401 run7", followers=1)
    try:
        def ask(job: str, secret: str) -> dict[str, Any]:
            sock = made.connect({"t": "follower", "secret": secret, "job": job})
            sock.settimeout(5)
            answer = json.loads(sock.recv(4096))
            assert closed(sock)
            return answer

        theirs, third = "their-secret-0123", "third-secret-456"
        assert ask("torchrun 127.0.0.1:29401 run8", theirs) == {"t": "refused",
                                                                "why": "this side channel belongs to another job"}
        assert ask("torchrun 127.0.0.1:29401 run7", "short") == {"t": "refused", "why": "no secret for its ranks"}
        assert ask("torchrun 127.0.0.1:29401 run7", theirs) == {"t": "welcome", "why": ""}
        assert ask("torchrun 127.0.0.1:29401 run7", third) == {"t": "refused", "why": "the job has all its nodes"}
        ranked = made.connect(hello(rank=1, secret=theirs))
        assert made.wait(lambda: made.channel.connected() == 1)
        assert closed(made.connect(hello(rank=0, secret=third)))
        ranked.close()
    finally:
        made.channel.close()


def test_a_rank_splits_a_message_longer_than_a_line_without_repeating_an_item() -> None:
    from ddpdoctor.guard import rank
    from ddpdoctor.guard.wire import MAX_LINE

    events = [["W", seq, "all_reduce", "float32[1]", "train.py", 7] for seq in range(200_000)]
    message = {"t": "state", "progress": 9, "inflight": None, "ev": events, "steps": [[1, 0.1], [2, 0.1]],
               "final": True}
    pending, sent = [message], []
    while pending:
        part = pending.pop()
        if len(encode(part)) > MAX_LINE:
            pending.extend(rank.split(part))
        else:
            sent.append(part)
    assert len(sent) > 1
    assert sorted(e[1] for part in sent for e in part.get("ev", [])) == list(range(200_000))
    assert [part.get("steps") for part in sent if "steps" in part] == [[[1, 0.1], [2, 0.1]]]
    assert sum(1 for part in sent if part.get("final")) == 1
    assert rank.split({"t": "state", "hashes": [{"names": ["x" * MAX_LINE]}]}) == []


def test_with_a_shared_secret_a_follower_proves_it_and_sends_none() -> None:
    made = Channel(job="job-1", followers=2)
    made.channel.shared_secret = True
    try:
        for proof_secret, answer in (("wrong-secret-000", "refused"), (SECRET, "welcome")):
            sock = socket.create_connection(made.channel.address, timeout=5)
            reader = LineReader(sock)
            challenge = reader.next()["nonce"]
            sock.sendall(encode({"t": "follower", "job": "job-1", "proof": prove(proof_secret, "follower", challenge)}))
            assert reader.next()["t"] == answer
            assert closed(sock)
        assert made.channel.secrets == [SECRET]
    finally:
        made.channel.close()


def test_the_guard_proves_the_secret_back_to_a_rank() -> None:
    made = Channel()
    try:
        sock = socket.create_connection(made.channel.address, timeout=5)
        reader = LineReader(sock)
        challenge = reader.next()["nonce"]
        sock.sendall(encode({"t": "hello", "rank": 0, "world_size": 1, "nonce": "rank-nonce",
                             "proof": prove(SECRET, "rank", challenge)}))
        welcome = reader.next()
        assert welcome["t"] == "welcome" and proves(SECRET, "guard", "rank-nonce", welcome["proof"])
        assert not proves("another-secret!!", "guard", "rank-nonce", welcome["proof"])
        sock.close()
    finally:
        made.channel.close()


IMPOSTOR_RANK = r"""
import os, sys
from ddpdoctor.guard.hooks import watch_torch_distributed
watch_torch_distributed()
import torch
import torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
dist.all_reduce(torch.ones(1))
dist.destroy_process_group()  # else torch's C++ teardown may abort at exit
print("trained")
"""


def test_a_rank_does_not_obey_an_impostor_on_the_guards_port() -> None:
    # Something else listens where the guard should: it challenges, accepts anything and says stop.
    import os
    import subprocess
    import sys
    import threading

    impostor = socket.create_server(("127.0.0.1", 0))
    heard: list[dict[str, Any]] = []

    def serve() -> None:
        while True:  # the rank tries as the rendezvous starts and again once it is a rank
            try:
                sock, _ = impostor.accept()
            except OSError:
                return
            reader = LineReader(sock)
            sock.sendall(encode({"t": "challenge", "nonce": "n" * 32}))
            heard.append(reader.next())
            sock.sendall(encode({"t": "welcome", "proof": "0" * 64}) + encode({"t": "stop", "why": "impostor"}))
            sock.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    options = GuardOptions(port=impostor.getsockname()[1], secret=SECRET)
    env = {**os.environ, "DDPDOCTOR_GUARD": options.to_env()}
    result = subprocess.run([sys.executable, "-c", IMPOSTOR_RANK], env=env, capture_output=True, text=True,
                            timeout=120)
    impostor.close()
    assert result.returncode == 0 and result.stdout == "trained\n", result.stderr[-2000:]
    assert "(the side channel did not prove the run's secret); running unguarded" in result.stderr
    assert "stopping rank" not in result.stderr
    # It heard a proof, never the secret.
    assert len(heard) == 2 and SECRET not in json.dumps(heard)
    assert {h["proof"] for h in heard} == {prove(SECRET, "rank", "n" * 32)}


@pytest.mark.parametrize("fields, said", [
    ({"counts": [1, 2, 3]}, "counts is not a list of 8 items"),
    ({"counts": [1, 2, 3, 4, 5, 6, 7, -1]}, "a count is not an integer"),
    ({"marks": [[0, 0, [0] * 8, False, "t.py", 1, "t.py"]]}, "an epoch mark is not a list of 8 items"),
    ({"marks": [[0, 0, [0] * 8, "no", "t.py", 1, "t.py", 2]]}, "joined is not true or false"),
    ({"marks": [[0, 0, [0] * 7, False, "t.py", 1, "t.py", 2]]}, "counts is not a list of 8 items"),
    ({"hashes": [{"step": 1, "kind": "later", "names": [], "values": []}]}, "a hash report's kind is not"),
])
def test_bad_counts_marks_and_hash_kinds(fields: dict[str, Any], said: str) -> None:
    with pytest.raises(schema.BadMessage) as error:
        schema.message(state(**fields), world_size=2)
    assert str(error.value).startswith(said)


def test_counts_marks_and_end_hashes_pass_checked() -> None:
    checked = schema.message(state(counts=list(range(8)), marks=[[1, 1, [3] * 8, False, "t\x1b.py", 4, "t.py", 2]],
                                   hashes=[{"step": 3, "kind": "end", "names": ["w"], "values": [7]}]), 2)
    assert checked["counts"] == list(range(8))
    assert checked["marks"] == [[1, 1, [3] * 8, False, "t\\x1b.py", 4, "t.py", 2]]
    assert checked["hashes"][0]["kind"] == "end"
    assert schema.message(state(hashes=[{"step": 3, "names": [], "values": []}]), 2)["hashes"][0]["kind"] == "forward"
