"""Reading Flight Recorder dumps as untrusted input, and `ddpdoctor guard --analyze` as a command."""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import subprocess
import sys
from pathlib import Path

import pytest
from fr_synthetic import dump, entry, write
from guard_helpers import GUARD, REPO, guard_env

from ddpdoctor.guard.flight import dumps as fr_dumps
from ddpdoctor.guard.flight.dumps import DumpError, decode, read_dump


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_a_pickle_that_would_run_a_command_is_refused_and_runs_nothing(tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps(dump([entry(1), {"x": _Exploit(marker)}]), protocol=protocol)
    assert b"system" in payload
    (tmp_path / "fr_0").write_bytes(payload)
    # torch writes protocol 2 or later; older protocols are not taken for a dump at all.
    said = (r"^refers to (posix|os|nt)\.system, which a Flight Recorder dump never does$" if protocol >= 2 else
            r"^is neither a pickled nor a JSON Flight Recorder dump$")
    with pytest.raises(DumpError, match=said):
        read_dump(str(tmp_path / "fr_0"), 0)
    assert not marker.exists()


def test_other_ways_to_reach_code_are_refused() -> None:
    # BUILD on a plain dict, a persistent id: neither gets past plain data.
    build = b"\x80\x02}q\x00}q\x01\x62."  # PROTO 2, EMPTY_DICT, BINPUT, EMPTY_DICT, BINPUT, BUILD, STOP
    with open(os.devnull, "w") as sink:
        pickletools.dis(build, out=sink)  # a well-formed pickle, so the refusal is ours
    with pytest.raises(DumpError, match="^is not a readable pickle"):
        decode(build)
    with pytest.raises(DumpError, match="persistent id"):
        decode(b"\x80\x02X\x01\x00\x00\x00aQ.")  # BINPERSID


@pytest.mark.parametrize(("data", "said"), [
    (b"", "is neither a pickled nor a JSON Flight Recorder dump"),
    (b"\x00\x01garbage", "is neither a pickled nor a JSON Flight Recorder dump"),
    (pickle.dumps(dump([entry(1)]))[:-9], "is not a readable pickle (UnpicklingError)"),
    (pickle.dumps([1, 2]), "has no list of entries: not a Flight Recorder dump"),
    (b'{"entries": [', "is not valid JSON"),
    (b"[" * 100_000, "is neither a pickled nor a JSON Flight Recorder dump"),
    (b'{"entries": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "is not valid JSON"),
])
def test_junk_is_one_line(data: bytes, said: str) -> None:
    with pytest.raises(DumpError) as error:
        decode(data)
    assert str(error.value).startswith(said) and "\n" not in str(error.value)


@pytest.mark.parametrize(("field", "value", "said"), [
    ("input_sizes", [["2"]], "has a input sizes that is not an integer"),
    ("input_sizes", [[1] * 17], "has input sizes that are not a list of shapes"),
    ("collective_seq_id", 2**64, "has a sequence id that is not an integer"),
    ("collective_seq_id", True, "has a sequence id that is not an integer"),
    ("process_group", "0", "has an entry without a (name, description) process group"),
    ("profiling_name", 7, "has a profiling name that is not text"),
    ("frames", [["train.py", 3]], "has a frame that is not a dict"),
])
def test_entries_of_the_wrong_shape_are_refused(tmp_path: Path, field: str, value: object, said: str) -> None:
    bad = entry(1)
    bad[field] = value
    (tmp_path / "fr_0").write_bytes(pickle.dumps(dump([bad])))
    with pytest.raises(DumpError, match="^" + said.replace("(", r"\(").replace(")", r"\)") + "$"):
        read_dump(str(tmp_path / "fr_0"), 0)


def test_sizes_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "fr_0"
    path.write_bytes(pickle.dumps(dump([entry(1), entry(2)])))
    monkeypatch.setattr(fr_dumps, "MAX_DUMP_BYTES", path.stat().st_size)
    assert len(read_dump(str(path), 0).entries) == 2  # just inside
    monkeypatch.setattr(fr_dumps, "MAX_DUMP_BYTES", path.stat().st_size - 1)
    with pytest.raises(DumpError, match="bytes, more than the"):
        read_dump(str(path), 0)
    monkeypatch.setattr(fr_dumps, "MAX_ENTRIES", 1)
    monkeypatch.setattr(fr_dumps, "MAX_DUMP_BYTES", 10**6)
    with pytest.raises(DumpError, match="^has 2 entries, more than 1$"):
        read_dump(str(path), 0)
    shared = [0] * 1000
    path.write_bytes(pickle.dumps(dump([entry(1)]) | {"junk": [shared] * 1000}))  # 20 kB, a million values
    monkeypatch.setattr(fr_dumps, "MAX_NODES", 500_000)
    with pytest.raises(DumpError, match="too many values"):
        read_dump(str(path), 0)


def test_text_from_a_dump_reaches_no_terminal_raw(tmp_path: Path) -> None:
    sneaky = entry(1)
    sneaky["profiling_name"] = "gloo:all_reduce\x1b[2J"
    sneaky["frames"][2]["filename"] = "/job/tr\x1b]0;x\x07ain.py"
    (tmp_path / "fr_0").write_bytes(pickle.dumps(dump([sneaky])))
    read = read_dump(str(tmp_path / "fr_0"), 0).entries[0]
    assert read.operation == "gloo:all_reduce?[2J" and read.frames[2].path == "/job/tr?]0;x?ain.py"


def test_json_dumps_are_read_too(tmp_path: Path) -> None:
    data = dump([entry(1), entry(2)])
    for e in data["entries"]:
        e["process_group"] = list(e["process_group"])  # JSON has no tuples
    (tmp_path / "fr_1").write_text(json.dumps(data))
    read = read_dump(str(tmp_path / "fr_1"), 1)
    assert [e.seq for e in read.entries] == [1, 2] and read.entries[0].group == "0"


def analyze_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*GUARD, "--analyze", *args], cwd=REPO, env=guard_env("fr-cli"), capture_output=True,
                          text=True, timeout=60)


def test_cli_usage_errors_exit_2_in_one_line(tmp_path: Path) -> None:
    cases = [
        ((str(tmp_path),), f"{tmp_path}: no Flight Recorder dumps (files named PREFIX<rank>, as "
                           "TORCH_FR_DUMP_TEMP_FILE makes them)"),
        ((str(tmp_path / "nowhere" / "fr_"),), f"{tmp_path / 'nowhere' / 'fr_'}: no such directory or dump prefix"),
        ((str(tmp_path), "--", sys.executable, "-c", "pass"),
         "--analyze reads dumps and runs no command: drop the command or --analyze"),
    ]
    for args, said in cases:
        result = analyze_cli(*args)
        assert (result.returncode, result.stderr, result.stdout) == (2, f"ddpdoctor: error: {said}\n", "")
    write(tmp_path, {0: dump([entry(1)]), 1: dump([entry(1)])}, prefix="a_")
    write(tmp_path, {0: dump([entry(1)]), 1: dump([entry(1, sizes=((3,),))])}, prefix="b_")
    result = analyze_cli(str(tmp_path))
    assert result.returncode == 2 and "several sets of dumps ('a_', 'b_'): name one by its prefix" in result.stderr
    assert analyze_cli(str(tmp_path / "a_")).returncode == 0
    assert analyze_cli(str(tmp_path / "b_")).returncode == 1
    (tmp_path / "c_0").write_bytes(b"junk")
    result = analyze_cli(str(tmp_path / "c_"))
    assert result.returncode == 2
    assert result.stderr == (f"ddpdoctor: error: {tmp_path / 'c_'}: no usable Flight Recorder dump "
                             f"({tmp_path / 'c_0'} is neither a pickled nor a JSON Flight Recorder dump; left out)\n")


def test_cli_reports_findings_in_text_and_json(tmp_path: Path) -> None:
    write(tmp_path, {0: dump([entry(1), entry(2, line=5)]), 1: dump([entry(1)])})
    (tmp_path / "fr_2").write_bytes(b"\x80\x04junk")  # a rank killed while writing: left out, the rest judged
    text = analyze_cli(str(tmp_path))
    assert text.returncode == 1
    assert text.stdout.startswith("/job/train.py:5: GRD002 [rank 1] rank 0 entered all_reduce(float32[2]) at "
                                  "/job/train.py:5 (collective #2 of the world group, from the Flight Recorder)")
    assert text.stderr.splitlines() == [
        f"ddpdoctor: warning: {tmp_path / 'fr_2'} is not a readable pickle (UnpicklingError); left out",
        "ddpdoctor guard --analyze: ranks 0, 1, 2 collectives in 1 process group: 1 finding (GRD002)"]
    report = tmp_path / "report.json"
    as_json = analyze_cli(str(tmp_path), "--format", "json", "--report", str(report))
    assert as_json.returncode == 1
    payload = json.loads(as_json.stdout)
    assert payload == json.loads(report.read_text())
    assert payload["ranks"] == [0, 1] and payload["collectives"] == 2
    (finding,) = payload["findings"]
    assert (finding["code"], finding["ranks"], finding["line"]) == ("GRD002", [1], 5)
    assert finding["evidence"]["ranks"]["0"]["frames"] == ["/job/train.py:5 in main"]


def test_cli_clean_dumps_exit_0(tmp_path: Path) -> None:
    write(tmp_path, {0: dump([entry(1), entry(2)]), 1: dump([entry(1), entry(2)])})
    result = analyze_cli(str(tmp_path))
    assert (result.returncode, result.stdout) == (0, "")
    assert result.stderr == "ddpdoctor guard --analyze: ranks 0, 1, 2 collectives in 1 process group: no finding\n"


def test_the_post_mortem_never_imports_torch() -> None:
    code = ("import sys, ddpdoctor.cli, ddpdoctor.guard.flight.analyze; "
            "sys.exit('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=guard_env("fr-notorch"), timeout=60)
    assert result.returncode == 0
