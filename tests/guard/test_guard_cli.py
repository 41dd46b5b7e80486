"""`ddpdoctor guard` as a command: usage errors, exit status, output formats. No ranks here."""

from __future__ import annotations

import json
import subprocess
import sys

from guard_helpers import GUARD, REPO, guard_env, run_guard

PY = sys.executable


def guard(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*GUARD, *args], cwd=REPO, env=guard_env("cli"), capture_output=True, text=True, timeout=60)


def test_no_command_is_a_one_line_usage_error() -> None:
    for args in ((), ("--",), ("--stall-timeout", "3", "--")):
        result = guard(*args)
        assert result.returncode == 2
        assert result.stderr.startswith("ddpdoctor: error: no command to guard")
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_command_not_found_is_a_one_line_usage_error() -> None:
    for missing, said in (("no-such-launcher-xyz", "command not found: no-such-launcher-xyz"),
                          ("./no/such/train.sh", "command not found or not executable: ./no/such/train.sh")):
        result = guard("--", missing, "--nproc-per-node", "2")
        assert result.returncode == 2
        assert result.stderr.strip() == f"ddpdoctor: error: {said}"


def test_bad_store_address_is_a_usage_error() -> None:
    result = guard("--store", "127.0.0.9", "--", PY, "-c", "pass")
    assert result.returncode == 2
    assert result.stderr.strip() == "ddpdoctor: error: --store: expected HOST:PORT, got '127.0.0.9'"


def test_exit_status_is_the_commands_own_when_it_fails() -> None:
    run = run_guard(command=[PY, "-c", "import sys; sys.exit(3)"])
    assert run.returncode == 3
    assert run.report == {"command": [PY, "-c", "import sys; sys.exit(3)"], "exit_code": 3, "world_size": 0,
                          "findings": []}
    killed = run_guard(command=[PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])
    assert killed.returncode == 128 + 15


def test_clean_command_exits_0_and_says_nothing() -> None:
    run = run_guard(command=[PY, "-c", "print('trained')"])
    assert run.returncode == 0
    assert run.stdout == "trained\n" and run.stderr == ""


def test_format_json_keeps_stdout_for_the_report() -> None:
    result = guard("--format", "json", "--", PY, "-c", "print('trained')")
    assert result.returncode == 0
    assert json.loads(result.stdout) == {"command": [PY, "-c", "print('trained')"], "exit_code": 0,
                                         "world_size": 0, "findings": []}
    assert "trained" in result.stderr  # the command's own output moved to stderr


def test_ranks_inherit_the_bootstrap_and_a_users_sitecustomize_still_runs(tmp_path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE'] = 'ran'\n")
    probe = ("import os, sys; import ddpdoctor.guard.hooks as h; "
             "print(os.environ.get('USER_SITECUSTOMIZE'), any(isinstance(f, h._AfterImport) for f in sys.meta_path),"
             " 'torch' in sys.modules)")
    env = guard_env("cli")
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    result = subprocess.run([*GUARD, "--", PY, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    # The user's sitecustomize ran, the hook waits for torch.distributed, and torch was not imported.
    assert result.stdout.split() == ["ran", "True", "False"]


def test_numbers_that_are_not_finite_or_out_of_bounds_are_usage_errors_before_the_job_runs(tmp_path) -> None:
    ran = tmp_path / "ran"
    job = [PY, "-c", f"open({str(ran)!r}, 'w')"]
    for option, value, said in (("--stall-timeout", "nan", "'nan' is not a number from 0.5 to 604800"),
                                ("--stall-timeout", "inf", "'inf' is not a number from 0.5 to 604800"),
                                ("--stall-timeout", "1e20", "'1e20' is not a number from 0.5 to 604800"),
                                ("--stall-timeout", "0.4", "'0.4' is not a number from 0.5 to 604800"),
                                ("--straggler-window", "1e20", "'1e20' is not an integer from 3 to 100000"),
                                ("--every", "2.5", "'2.5' is not an integer"),
                                ("--every", "0", "'0' is not an integer from 1 to 1000000000")):
        result = guard(option, value, "--", *job)
        assert result.returncode == 2, (option, value)
        assert result.stderr == f"ddpdoctor: error: guard: Invalid value for '{option}': {said}\n"
    # Just inside the bounds: accepted.
    assert guard("--stall-timeout", "0.5", "--every", "1", "--straggler-window", "3", "--", *job).returncode == 0
    assert ran.exists()


def test_an_unwritable_report_is_a_usage_error_before_the_job_runs(tmp_path) -> None:
    ran = tmp_path / "ran"
    for report, said in ((tmp_path / "missing" / "r.json", "No such file or directory"),
                         (tmp_path, "is a directory")):
        result = guard("--report", str(report), "--", PY, "-c", f"open({str(ran)!r}, 'w')")
        assert result.returncode == 2
        assert result.stderr.startswith("ddpdoctor: error: ") and said in result.stderr
        assert len(result.stderr.splitlines()) == 1
    assert not ran.exists()
    # A writable one is left as it was found until the job has run: no empty file if the guard fails.
    fine = tmp_path / "r.json"
    assert guard("--report", str(fine), "--", PY, "-c", "pass").returncode == 0 and fine.exists()


def test_a_second_guard_on_a_store_another_job_holds_refuses_to_start() -> None:
    import socket as socket_module
    import time

    with socket_module.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    first = subprocess.Popen([*GUARD, "--store", f"127.0.0.1:{port}", "--", PY, "-c", "import time; time.sleep(20)"],
                             cwd=REPO, env=guard_env("cli"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:  # until the first guard listens (a loaded machine starts Python slowly)
            try:
                socket_module.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        second = guard("--store", f"127.0.0.1:{port}", "--", PY, "-c", "print('ran')")
        assert second.returncode == 2 and second.stdout == ""
        assert second.stderr == (f"ddpdoctor: error: --store 127.0.0.1:{port} is held by another guard: "
                                 "this side channel belongs to another job\n")
    finally:
        first.terminate()
        first.communicate(timeout=30)


def test_an_unknown_fail_on_is_a_one_line_usage_error() -> None:
    result = guard("--fail-on", "warnings", "--", PY, "-c", "pass")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "--fail-on" in result.stderr
    assert "Traceback" not in result.stderr
