"""The registry is the one list of checks; the package has no import cycles; the parts the linter,
the options and `guard` import stay free of torch."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.probe.config import RankConfig
from ddpdoctor.probe.faults import FAULT_KINDS, LINK_FAULTS, FaultSpec
from ddpdoctor.probe.registry import CHECKS, FRAMEWORKS, HOROVOD, TORCH, checks_for, detector, names_for
from probe_helpers import REPO

PACKAGE = REPO / "ddpdoctor"


def test_every_fault_kind_is_caught_by_exactly_one_check_per_framework() -> None:
    for framework in FRAMEWORKS:
        # The link faults are planted in the link map, which only torch ranks run.
        for kind in (k for k in FAULT_KINDS if framework == TORCH or k not in LINK_FAULTS):
            catchers = [s.name for s in checks_for(framework) if kind in s.faults]
            assert len(catchers) == 1, (framework, kind, catchers)
            assert detector(framework, kind).name == catchers[0]
    assert detector(TORCH, "param-desync").name == "param-sync"
    assert detector(HOROVOD, "param-desync").name == "broadcast-parameters"
    assert detector(TORCH, "slow-link").name == detector(TORCH, "slow-rank").name == "links"


def test_each_check_is_declared_once_with_an_implementation() -> None:
    keys = [(s.framework, s.name) for s in CHECKS]
    assert len(keys) == len(set(keys))
    for spec in CHECKS:
        assert importlib.util.find_spec(f"ddpdoctor.probe.checks.{spec.module}") is not None, spec.module
        assert spec.proves and (spec.advice or spec.name == "bandwidth")
    assert names_for(TORCH)[:2] == ("world", "liveness")
    assert names_for(HOROVOD)[:2] == ("world", "liveness")
    # Only the first check may run before the process group exists.
    for framework in FRAMEWORKS:
        assert [s.needs_process_group for s in checks_for(framework)][1:] == [True] * (len(names_for(framework)) - 1)


def test_rank_config_round_trips_through_json() -> None:
    config = RankConfig(framework=HOROVOD, timeout=2.5, faults=(FaultSpec("hang", 1), FaultSpec("slow-link", 0, 2)),
                        checks=("world", "liveness"), store_addr="127.0.0.1", store_port=1234, link_bytes=4096)
    assert RankConfig.from_json(config.to_json()) == config
    # Unknown keys from a newer parent are ignored, not fatal.
    assert RankConfig.from_dict({"timeout": 1.0, "later_option": True}).timeout == 1.0


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the package modules it imports, at module level or inside functions alike."""
    modules = {_module_name(p): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_in_the_probe_package() -> None:
    graph = import_graph(PACKAGE / "probe")
    assert "ddpdoctor.probe.registry" in graph["ddpdoctor.probe.options"]
    assert find_cycle(graph) == []


@pytest.mark.parametrize("module", [
    "ddpdoctor.probe.registry", "ddpdoctor.probe.results", "ddpdoctor.probe.config", "ddpdoctor.probe.options",
    "ddpdoctor.probe.command", "ddpdoctor.probe.report", "ddpdoctor.probe.tolerance", "ddpdoctor.probe.judges",
    "ddpdoctor.probe.merge", "ddpdoctor.probe.views", "ddpdoctor.probe.faults", "ddpdoctor.probe.procs",
    "ddpdoctor.probe.linkmap", "ddpdoctor.probe.rendezvous", "ddpdoctor.probe.plot",
])
def test_torch_free_modules_import_alone_without_torch(module: str) -> None:
    # matplotlib neither: only `--plot` loads it, after the run.
    code = f"import sys, {module}; sys.exit(3 if {{'torch', 'matplotlib'}} & set(sys.modules) else 0)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr or f"{module} imported torch"
