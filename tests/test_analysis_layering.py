"""The analysis layer stays layered: nothing below imports anything above, rules import only the
package, and the static half never imports torch. Read from the source with `ast`, so a new
upward import fails here before it becomes a cycle."""

from __future__ import annotations

import ast
import pathlib

import pytest

import ddpdoctor.lint.analysis as analysis_package

ANALYSIS = pathlib.Path(analysis_package.__file__).parent
RULES = ANALYSIS.parent / "rules"
PACKAGE = "ddpdoctor.lint.analysis"

# Bottom first. A module may import only the ones before it.
LAYERS = ["syntax", "imports", "launchfiles", "model", "collectives", "conditions", "callorder", "lazy", "stepping", "reads", "launch", "harness", "ranks", "launcher_env", "devices", "divergence", "summaries", "checkpoint_loads",
          "sharding", "evaluation", "rank_arguments", "shared_writes", "project"]


def imported_modules(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            out.add(node.module)
    return out


def analysis_modules() -> list[pathlib.Path]:
    return sorted(p for p in ANALYSIS.glob("*.py") if p.name != "__init__.py")


def test_every_analysis_module_has_a_layer() -> None:
    assert {p.stem for p in analysis_modules()} <= set(LAYERS)


@pytest.mark.parametrize("path", analysis_modules(), ids=lambda p: p.stem)
def test_no_upward_import(path: pathlib.Path) -> None:
    level = LAYERS.index(path.stem)
    allowed = {f"{PACKAGE}.{name}" for name in LAYERS[:level]}
    for module in imported_modules(path):
        if module == PACKAGE:
            pytest.fail(f"{path.name} imports the package {PACKAGE} itself (import its modules below it)")
        if module.startswith(PACKAGE + "."):
            assert module in allowed, f"{path.name} imports {module}, which is not below it in {LAYERS}"
        elif module.startswith("ddpdoctor."):
            pytest.fail(f"{path.name} imports {module}: the analysis knows no rule, engine or command")
        assert module.split(".")[0] != "torch", f"{path.name} imports torch"


@pytest.mark.parametrize("path", sorted(RULES.glob("*.py")), ids=lambda p: p.stem)
def test_rules_use_only_the_analysis_package(path: pathlib.Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            names = [node.module]
        for module in names:
            if module.startswith("ddpdoctor.lint."):
                assert module in (PACKAGE, "ddpdoctor.lint.rules", "ddpdoctor.lint.rules.base"), f"{path.name} imports {module}"
            assert module.split(".")[0] != "torch", f"{path.name} imports torch"


def test_the_layering_check_catches_an_upward_import(tmp_path: pathlib.Path) -> None:
    # The check itself must be able to fail: a model that reaches up into ranks.
    bad = tmp_path / "model.py"
    bad.write_text("from ddpdoctor.lint.analysis.ranks import who_runs\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="not below it"):
        test_no_upward_import(bad)


@pytest.mark.parametrize("path", sorted(RULES.glob("*.py")), ids=lambda p: p.stem)
def test_rules_ask_containment_through_syntax_contains(path: pathlib.Path) -> None:
    # `order < x < end_order` is answered in one place (syntax.contains), not re-derived per rule.
    assert "end_order" not in path.read_text(encoding="utf-8"), f"{path.name} compares end_order itself"


# What walks the syntax tree: the analysis layer's walking helpers, libcst's own visitors and matchers,
# and a node's `children`. A rule asks the analysis layer a question instead (`names_in`, which only
# lists the names an expression reads, and reading a call's own arguments are questions, not walks).
WALKING_NAMES = frozenset({"walk", "child_fields"})
WALKING_ATTRIBUTES = frozenset({"walk", "child_fields", "children", "visit"})


def tree_walks(source: str) -> list[str]:
    """Where a rule's source walks the syntax tree itself, as `line: what`."""
    out: list[str] = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module.startswith("libcst.matchers"):
                out.append(f"{line}: imports {node.module}")
            out.extend(f"{line}: imports {a.name}" for a in node.names if a.name in WALKING_NAMES)
        elif isinstance(node, ast.Import):
            out.extend(f"{line}: imports {a.name}" for a in node.names if a.name.startswith("libcst.matchers"))
        elif isinstance(node, ast.Name) and node.id in WALKING_NAMES:
            out.append(f"{line}: {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in WALKING_ATTRIBUTES:
            out.append(f"{line}: .{node.attr}")
        elif isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                if name.endswith(("Visitor", "Transformer")):
                    out.append(f"{line}: class {node.name}({name})")
    return out


@pytest.mark.parametrize("path", sorted(RULES.glob("*.py")), ids=lambda p: p.stem)
def test_rules_do_not_walk_the_tree(path: pathlib.Path) -> None:
    assert tree_walks(path.read_text(encoding="utf-8")) == [], f"{path.name} walks the syntax tree itself"


@pytest.mark.parametrize(
    "source",
    [
        "from ddpdoctor.lint.analysis import walk\n",
        "from ddpdoctor.lint.analysis import syntax\nnodes = list(syntax.walk(expr))\n",
        "stack = [expr]\nstack.extend(stack.pop().children)\n",
        "import libcst.matchers as m\n",
        "import libcst as cst\nclass Finder(cst.CSTVisitor):\n    pass\n",
        "module.visit(finder)\n",
    ],
)
def test_the_walk_check_catches_a_walk(source: str) -> None:
    assert tree_walks(source) != []


def test_the_walk_check_lets_questions_through() -> None:
    # Reading a call's arguments and asking for the names an expression reads are not walks.
    source = "from ddpdoctor.lint.analysis import names_in\nnames = list(names_in(call.arg(0)))\nfirst = call.args[0].value\n"
    assert tree_walks(source) == []
