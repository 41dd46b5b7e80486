"""The GitHub Action (action.yml) run for real: its steps' shell commands, as the runner would run
them, install this checkout into a fresh environment and lint a workspace; and the README's
workflow uses it with inputs it has."""

from __future__ import annotations

import json
import os
import re
import site
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
ACTION = yaml.safe_load((ROOT / "action.yml").read_text(encoding="utf-8"))
BUGGY = (ROOT / "examples" / "buggy_train.py").read_text(encoding="utf-8")
EXPRESSION = re.compile(r"\$\{\{\s*([\w.-]+)\s*\}\}")


def expand(value: str, inputs: dict[str, str]) -> str:
    """GitHub's `${{ inputs.x }}` / `${{ github.action_path }}`, the only expressions the action uses."""
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == "github.action_path":
            return str(ROOT)
        assert name.startswith("inputs."), f"action.yml uses an expression this test does not know: {name}"
        return inputs[name[len("inputs."):]]

    return EXPRESSION.sub(one, value)


@pytest.fixture(scope="module")
def python_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh environment the action installs into. Its dependencies (libcst, click, rich) and the
    build backend come from this test's environment through a .pth file, so pip needs no network."""
    venv = tmp_path_factory.mktemp("runner") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    lib = next((venv / "lib").glob("python3*")) / "site-packages"
    (lib / "test-environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return venv / "bin"


def run_action(python_env: Path, workspace: Path, **given: str) -> list[subprocess.CompletedProcess[str]]:
    inputs = {name: spec.get("default", "") for name, spec in ACTION["inputs"].items()}
    unknown = set(given) - set(inputs)
    assert not unknown, f"action.yml has no input {unknown}"
    inputs.update(given)
    env = {
        **os.environ,
        "PATH": f"{python_env}{os.pathsep}{os.environ['PATH']}",
        # The runner's pip, offline here: what the action installs must build from the checkout alone.
        "PIP_NO_INDEX": "1",
        "PIP_NO_BUILD_ISOLATION": "0",
        "NO_COLOR": "1",
    }
    env.pop("VIRTUAL_ENV", None)
    done = []
    for step in ACTION["runs"]["steps"]:
        assert step["shell"] == "bash"
        step_env = {name: expand(str(value), inputs) for name, value in step.get("env", {}).items()}
        assert "${{" not in step["run"], "inputs must reach the script through env, never pasted into it"
        done.append(subprocess.run(["bash", "-e", "-c", step["run"]], cwd=workspace, env={**env, **step_env},
                                   capture_output=True, text=True, timeout=600))
        if done[-1].returncode != 0:
            break
    return done


def test_the_action_is_composite_and_documents_its_inputs() -> None:
    assert ACTION["runs"]["using"] == "composite"
    assert set(ACTION["inputs"]) == {"paths", "args", "sarif-file", "install"}
    assert all(spec["description"] for spec in ACTION["inputs"].values())


@pytest.mark.slow
def test_the_action_annotates_findings_writes_sarif_and_fails_the_job(python_env: Path, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(BUGGY)
    (tmp_path / "clean.py").write_text("import torch\n")
    install, lint = run_action(python_env, tmp_path, args="--extend-select DP002", **{"sarif-file": "out.sarif"})
    assert install.returncode == 0, install.stderr
    assert any((python_env.parent / "lib").glob("python3*/site-packages/ddpdoctor/cli.py")), install.stdout
    assert lint.returncode == 1, lint.stderr
    annotations = lint.stdout.splitlines()
    assert [line.split(" ")[0] for line in annotations] == ["::warning", "::warning"]
    assert annotations[0].startswith("::warning file=train.py,line=33,col=31,")
    assert "title=DDP008 (unguarded-checkpoint-save)" in annotations[1]
    sarif = json.loads((tmp_path / "out.sarif").read_text())
    assert [r["ruleId"] for r in sarif["runs"][0]["results"]] == ["DDP001", "DDP008"]


@pytest.mark.slow
def test_the_action_passes_a_clean_workspace(python_env: Path, tmp_path: Path) -> None:
    (tmp_path / "clean.py").write_text("import torch\n")
    steps = run_action(python_env, tmp_path, paths="clean.py")
    assert [step.returncode for step in steps] == [0, 0], steps[-1].stderr
    assert steps[1].stdout == ""  # no annotation


def workflow_in_readme() -> dict[str, Any]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```yaml\n(# \.github/workflows/[^\n]*\n.*?)```", readme, re.DOTALL)
    assert block, "the README shows no workflow"
    workflow: dict[str, Any] = yaml.safe_load(block.group(1))
    return workflow


def test_the_readme_workflow_uses_the_action_with_inputs_it_has() -> None:
    from ddpdoctor import __version__

    steps = next(iter(workflow_in_readme()["jobs"].values()))["steps"]
    ours = [step for step in steps if str(step.get("uses", "")).startswith("ddpdoctor/ddpdoctor@")]
    assert len(ours) == 1
    assert ours[0]["uses"] == f"ddpdoctor/ddpdoctor@v{__version__}"
    assert set(ours[0].get("with", {})) <= set(ACTION["inputs"])
    upload = [step for step in steps if str(step.get("uses", "")).startswith("github/codeql-action/upload-sarif")]
    assert upload and upload[0]["with"]["sarif_file"] == ours[0]["with"]["sarif-file"]
