"""The README's promises: its set-up commands are the ones CI runs, it lists every rule, its first screen
says what the tool is, and every command it shows is run here (outputs compared) or parsed by the command."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from ddpdoctor.catalog import load_catalog
from ddpdoctor.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def code_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README, re.DOTALL)


def test_readme_opens_with_the_two_setup_commands() -> None:
    blocks = code_blocks()
    main_job, tests = blocks[0].strip(), blocks[1].strip()
    assert "ddpdoctor lint examples/" in main_job and "ddpdoctor probe" in main_job
    assert tests.endswith("-m pytest")
    # The first two fenced blocks come before any section heading.
    assert README.index(main_job) < README.index("\n## ")


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    tests = code_blocks()[1].strip()
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert tests in ci.splitlines()


def test_the_example_the_readme_lints_exists() -> None:
    main_job = code_blocks()[0]
    for path in re.findall(r"ddpdoctor lint ([\w./-]+)", main_job):
        assert (ROOT / path).is_file(), path


def test_readme_lists_every_rule() -> None:
    for code, info in load_catalog().items():
        assert f"`{code}`" in README, f"README does not list {code}"
        assert info.name in README, f"README does not name {code} {info.name}"


def test_the_example_shows_exactly_the_bugs_the_readme_and_its_comments_name() -> None:
    """`ddpdoctor lint examples/buggy_train.py` reports what the README's console block shows (same
    places, same codes) and one finding per `# Bug:` comment of the example: no third bug hides
    in it (it once built its head with nn.LazyLinear, which DDP refuses: DDP018)."""
    from ddpdoctor.config import Settings
    from ddpdoctor.lint.engine import lint_paths

    example = ROOT / "examples" / "buggy_train.py"
    output = "\n".join(dict(console_runs())["ddpdoctor lint examples/buggy_train.py"])
    shown = re.findall(r"^examples/buggy_train\.py:(\d+):(\d+): ([A-Z]+\d{3}) ", output, re.MULTILINE)
    assert shown
    run, _ = lint_paths([str(example)], Settings(), jobs=1, use_cache=False)
    found = [(str(f.line), str(f.column), f.code) for f in run.findings]
    assert found == shown
    assert len(found) == example.read_text(encoding="utf-8").count("# Bug:")


# ------------------------------------------------------------------ every command shown is run


def command_named(name: str) -> click.Command:
    """A subcommand as `ddpdoctor NAME` finds it (probe, env and guard are imported on demand)."""
    command = main.get_command(click.Context(main), name)
    assert command is not None, f"ddpdoctor has no command {name!r}"
    return command

FIRST_SCREEN = 40
PYTHON_BIN = Path(sys.executable).parent


def first_screen() -> str:
    return README[: README.index("\n---\n")]


def console_runs() -> list[tuple[str, list[str]]]:
    """`$ command` lines in ```console blocks, each with the output shown under it."""
    runs: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", README, re.DOTALL):
        for line in block.splitlines():
            if line.startswith("$ "):
                runs.append((line[2:], []))
            elif runs and block.startswith("$ "):
                runs[-1][1].append(line)
    return runs


def shown_commands() -> list[str]:
    """Every other `ddpdoctor ...` line of a console or bash block (usage lines and examples), less
    its trailing comment."""
    lines = []
    for block in re.findall(r"```(?:console|bash)\n(.*?)```", README, re.DOTALL):
        if block.startswith("$ "):
            continue  # commands with their output: console_runs()
        for line in block.splitlines():
            if line.startswith("ddpdoctor "):
                lines.append(re.split(r"\s+#\s", line)[0].strip())
    return lines


def test_the_first_screen_says_what_it_is_and_shows_setup_and_real_output() -> None:
    screen = first_screen()
    assert len(screen.splitlines()) <= FIRST_SCREEN
    assert "linter and doctor for distributed PyTorch training" in screen.splitlines()[2]
    for block in code_blocks()[:2]:
        assert block in screen
    assert [command for command, _ in console_runs() if f"$ {command}" in screen] == [
        "ddpdoctor lint examples/buggy_train.py",
        "ddpdoctor guard --stall-timeout 3 -- torchrun --standalone --nproc-per-node 3 examples/hang.py",
    ]
    for page in ("docs/measurements.md", "CONTRIBUTING.md"):
        assert f"]({page})" in screen and (ROOT / page).is_file()
    assert "mutmut" not in README and "× parse floor" not in README  # moved to docs/ and CONTRIBUTING.md


# Console commands whose output is shown but too long or machine-dependent to compare here: each is run,
# with the same options and fault, by the named test file (which asserts what the output shows).
RUN_ELSEWHERE = {
    "ddpdoctor probe --nproc 4 --checks world --links --link-size 64K --inject-fault slow-link:1,2 --plot links.png":
        ("tests/probe/test_probe_links.py", ('"--links"', '"slow-link:1,2"', '"--plot"')),
    "ddpdoctor guard --analyze fr/": ("tests/guard/test_flight_runs.py", ("--analyze", "GRD001")),
    "ddpdoctor guard -- torchrun --standalone --nproc-per-node 2 fixtures/guard/fr_unused_branch.py": (
        "tests/guard/test_flight_live.py", ('"fr_unused_branch.py"', '"--standalone", "--nproc-per-node", "2", '
                                            'f"fixtures/guard/{UNUSED}"', "inside DDP (_pre_forward)")),
    # the user's own job, as the Flight Recorder example runs it (tests/guard/fr_job.py plays it)
    "TORCH_FR_BUFFER_SIZE=2000 TORCH_FR_DUMP_TEMP_FILE=$PWD/fr/rank_ torchrun --standalone --nproc-per-node 2 "
    "train.py": ("tests/guard/test_flight_runs.py", ("TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE")),
}


def test_every_console_command_with_output_is_run_by_these_tests() -> None:
    assert sorted(command for command, _ in console_runs()) == sorted(
        [*LINT_RUNS, "ddpdoctor guard --stall-timeout 3 -- torchrun --standalone --nproc-per-node 3 examples/hang.py",
         *RUN_ELSEWHERE]
    )


@pytest.mark.parametrize("command", sorted(RUN_ELSEWHERE))
def test_the_console_commands_run_elsewhere_parse_and_have_their_test(command: str) -> None:
    test_file, pieces = RUN_ELSEWHERE[command]
    text = (ROOT / test_file).read_text(encoding="utf-8")
    for piece in pieces:
        assert piece in text, f"{test_file} no longer runs {piece} of: {command}"
    if command.startswith("ddpdoctor "):
        args = shlex.split(command)[1:]
        command_named(args[0]).make_context(args[0], args[1:])


LINT_RUNS = ["ddpdoctor lint examples/buggy_train.py", "ddpdoctor lint --diff examples/buggy_train.py"]


def _in_a_copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    return tmp_path


@pytest.mark.parametrize("command", LINT_RUNS)
def test_the_lint_output_shown_is_what_lint_prints(command: str, tmp_path: Path) -> None:
    shown = dict(console_runs())[command]
    args = shlex.split(command)[1:]
    done = subprocess.run([sys.executable, "-m", "ddpdoctor", *args], cwd=_in_a_copy(tmp_path),
                          capture_output=True, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"})
    assert done.returncode == 1
    assert (done.stdout + done.stderr).splitlines() == shown


@pytest.mark.slow
def test_the_guard_output_shown_is_what_guard_prints(tmp_path: Path) -> None:
    command = "ddpdoctor guard --stall-timeout 3 -- torchrun --standalone --nproc-per-node 3 examples/hang.py"
    shown = [line for line in dict(console_runs())[command] if not line.startswith("[...")]
    args = shlex.split(command)[1:]
    args[args.index("torchrun")] = str(PYTHON_BIN / "torchrun")
    done = subprocess.run([sys.executable, "-m", "ddpdoctor", *args], cwd=_in_a_copy(tmp_path),
                          capture_output=True, text=True, timeout=300, env={**os.environ, "NO_COLOR": "1"})
    assert done.returncode == 1, done.stderr[-3000:]
    ours = [line for line in (done.stdout + done.stderr).splitlines()
            if line.startswith(("examples/hang.py:", "ddpdoctor guard:"))]

    def waits(lines: list[str]) -> list[str]:
        return [re.sub(r"waited \d+\.\d s", "waited N s", line) for line in lines]

    # The findings and the verdict as shown; the ranks are stopped in whatever order they answer.
    stopping = [line for line in shown if "stopping rank" in line]
    assert waits([line for line in ours if "stopping rank" not in line]) == waits(
        [line for line in shown if "stopping rank" not in line])
    assert sorted(line for line in ours if "stopping rank" in line) == sorted(stopping)


@pytest.mark.parametrize("line", sorted(set(shown_commands())))
def test_every_command_line_shown_is_accepted_by_the_command(line: str) -> None:
    """Usage lines (`[--format text|json]`) name only options the command has; the examples
    parse as given (the multi-node, Horovod and GPU runs are run by their own tests)."""
    args = shlex.split(line)[1:]
    command = command_named(args[0])
    if any("[" in arg for arg in args):
        options = {opt for param in command.params for opt in param.opts}
        for option in re.findall(r"\[(--[\w-]+)", line):
            assert option in options, f"{line}: {command.name} has no {option}"
        return
    command.make_context(args[0], args[1:])


def test_the_python_api_example_prints_what_is_shown() -> None:
    section = README[README.index("## Python API"):]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    shown = re.search(r"```text\n(.*?)```", section, re.DOTALL)
    assert code and shown
    done = subprocess.run([sys.executable, "-c", code.group(1)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout == shown.group(1)


def test_every_editor_snippet_starts_the_server_command() -> None:
    import json

    from ddpdoctor.config import _toml

    tomllib = _toml()

    section = README[README.index("## Editors: `ddpdoctor server`"):README.index("## The rules")]
    blocks = dict(re.findall(r"```(\w+)\n(.*?)```", section, re.DOTALL)[1:])
    helix = tomllib.loads(blocks["toml"])
    assert [helix["language-server"]["ddpdoctor"]["command"], *helix["language-server"]["ddpdoctor"]["args"]] == [
        "ddpdoctor", "server"]
    assert "ddpdoctor" in helix["language"][0]["language-servers"]
    assert 'cmd = { "ddpdoctor", "server" }' in blocks["lua"] and 'vim.lsp.enable("ddpdoctor")' in blocks["lua"]
    manifest = json.loads(blocks["json"])
    assert manifest["main"] == "extension.js" and "vscode-languageclient" in manifest["dependencies"]
    assert '{ command: "ddpdoctor", args: ["server"] }' in blocks["js"]
    command_named("server").make_context("server", ["--stdio"])  # what VS Code's client may add


def test_the_other_command_lines_name_modules_and_scripts_that_exist() -> None:
    """Lines that run ddpdoctor under another launcher (`torchrun ... -m ddpdoctor.probe`) or a
    script of this repository (`scripts/install-horovod`)."""
    import importlib.util

    lines = [line for block in re.findall(r"```(?:console|bash)\n(.*?)```", README, re.DOTALL)
             for line in block.splitlines() if not line.startswith(("ddpdoctor ", "$ ", "python3 -m venv"))]
    modules = {m for line in lines for m in re.findall(r"-m (ddpdoctor[\w.]*)", line)}
    scripts = {s for line in lines for s in re.findall(r"(?:^|\s|=\S*\s)(scripts/[\w-]+)", line)}
    assert modules == {"ddpdoctor.probe"} and scripts == {"scripts/install-horovod", "scripts/gpu-check"}
    for module in modules:
        assert importlib.util.find_spec(module + ".__main__") is not None, module
    for script in scripts:
        assert os.access(ROOT / script, os.X_OK), script
