"""The README's promises: its set-up commands are the ones CI runs, and it lists every rule."""

from __future__ import annotations

import re
from pathlib import Path

from ddpdoctor.catalog import load_catalog

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
    shown = re.findall(r"^examples/buggy_train\.py:(\d+):(\d+): ([A-Z]+\d{3}) ", README, re.MULTILINE)
    run, _ = lint_paths([str(example)], Settings(), jobs=1, use_cache=False)
    found = [(str(f.line), str(f.column), f.code) for f in run.findings]
    assert found == shown
    assert len(found) == example.read_text(encoding="utf-8").count("# Bug:")
