"""The pre-commit hook, run for real: `pre-commit try-repo` against this repository."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

BUGGY = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
local_rank = dist.get_rank() % torch.cuda.device_count()
torch.cuda.set_device(local_rank)
model = DDP(Net().cuda(), device_ids=[local_rank])
torch.save(model.module.state_dict(), "checkpoint.pt")
"""

CLEAN = BUGGY.replace(
    'torch.save(model.module.state_dict(), "checkpoint.pt")\n',
    'if dist.get_rank() == 0:\n    torch.save(model.module.state_dict(), "checkpoint.pt")\n',
)


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="git is required")
def test_pre_commit_hook_fails_on_bug_and_passes_on_clean(tmp_path: Path) -> None:
    assert BUGGY != CLEAN
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q")
    git(work, "config", "user.email", "ci@example.invalid")
    git(work, "config", "user.name", "ci")
    (work / "buggy_train.py").write_text(BUGGY)
    (work / "clean_train.py").write_text(CLEAN)
    (work / "README.md").write_text("not python: the hook's `types: [python]` skips it\n")
    git(work, "add", ".")
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"), "NO_COLOR": "1"}

    def try_repo(*files: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pre_commit", "try-repo", str(ROOT), "ddpdoctor", "--files", *files],
            cwd=work, env=env, capture_output=True, text=True, timeout=600,
        )

    bad = try_repo("buggy_train.py", "README.md")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "buggy_train.py:9:1: DDP008" in bad.stdout
    good = try_repo("clean_train.py", "README.md")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "Passed" in good.stdout


def readme_snippet() -> dict:
    import yaml

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```yaml\n(# \.pre-commit-config\.yaml\n.*?)```", readme, re.DOTALL)
    assert block, "the README shows no .pre-commit-config.yaml"
    config: dict = yaml.safe_load(block.group(1))
    return config


def test_the_readme_snippet_pins_the_release_tag_of_this_version() -> None:
    from ddpdoctor import __version__

    (repo,) = readme_snippet()["repos"]
    assert repo["rev"] == f"v{__version__}" and [hook["id"] for hook in repo["hooks"]] == ["ddpdoctor"]
    tags = subprocess.run(["git", "tag"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if tags:  # once releases are tagged, the snippet must name one that exists
        assert repo["rev"] in tags


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="git is required")
def test_the_readme_snippet_works_with_real_pre_commit(tmp_path: Path) -> None:
    """The README's .pre-commit-config.yaml, verbatim but for the repository's address: a clone of
    this one, tagged as a release is, so that its `rev` resolves as it does on GitHub."""
    import yaml

    config = readme_snippet()
    (repo,) = config["repos"]
    clone = tmp_path / "ddpdoctor"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, capture_output=True)
    git(clone, "-c", "user.email=ci@example.invalid", "-c", "user.name=ci", "tag", repo["rev"])
    repo["repo"] = str(clone)
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q")
    (work / ".pre-commit-config.yaml").write_text(yaml.safe_dump(config))
    (work / "train.py").write_text(BUGGY)
    notebook = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                           "source": BUGGY.splitlines(keepends=True)}],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (work / "nb.ipynb").write_text(json.dumps(notebook, indent=1))
    git(work, "add", ".")
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"), "NO_COLOR": "1"}
    done = subprocess.run([sys.executable, "-m", "pre_commit", "run", "--all-files"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "train.py:9:1: DDP008" in done.stdout
    assert "nb.ipynb:cell 1:9:1: DDP008" in done.stdout
