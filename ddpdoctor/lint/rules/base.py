"""The Rule base class. A rule reads `ModuleModel` and yields `Finding`s; that is all it may touch.

Each rule is one class in a module named for what it catches (`syncbn_after_ddp.py`), with its code
in the class. Severity, name and default on/off live in the catalog page `rules/CODE.md`, written
once. Rules are discovered automatically: a new module in this package is picked up by `all_rules()`.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import ClassVar, Iterator, Optional

import libcst as cst

from ddpdoctor.catalog import RuleInfo, load_catalog
from ddpdoctor.findings import Edit, Finding, Fix
from ddpdoctor.lint.analysis import harness
from ddpdoctor.lint.analysis import Call, ModuleModel


class Rule:
    code: ClassVar[str]
    # Cheap pre-filter: the rule can only fire on a file that mentions one of these words.
    # The engine skips parsing files that mention none of any selected rule's words.
    trigger_words: ClassVar[tuple[str, ...]] = ()
    # And, for rules that only apply to a multi-process script, one of these must appear too.
    context_words: ClassVar[tuple[str, ...]] = ()
    # False for rules about choices that test suites make per test case on purpose (devices, ranks,
    # learning rates): such a rule does not run on test files (see `harness.is_test_module`).
    checks_test_suites: ClassVar[bool] = True

    def __init__(self, model: ModuleModel) -> None:
        self.model = model
        self._findings: list[Finding] = []

    # ---- what a rule implements

    def check(self) -> None:
        """Inspect `self.model`; call `self.report(...)` for each problem."""
        raise NotImplementedError

    # ---- helpers for rules

    @classmethod
    def info(cls) -> RuleInfo:
        info = load_catalog().get(cls.code)
        if info is None:
            raise LookupError(f"rule {cls.code} has no catalog page rules/{cls.code}.md")
        return info

    def report(self, node: cst.CSTNode, message: str, fix: Optional[Fix] = None) -> None:
        info = self.info()
        position = self.model.position(node)
        self._findings.append(
            Finding(
                code=self.code,
                name=info.name,
                severity=info.severity,
                message=message,
                path=self.model.path,
                line=position.start.line,
                column=position.start.column + 1,
                end_line=position.end.line,
                end_column=position.end.column + 1,
                fix=fix,
            )
        )

    def replace(self, node: cst.CSTNode, new_code: str) -> Edit:
        """A text edit that replaces `node`'s source with `new_code`."""
        position = self.model.position(node)
        return Edit(
            position.start.line,
            position.start.column + 1,
            position.end.line,
            position.end.column + 1,
            new_code,
        )

    def insert_line(self, call: Call, statement: str, *, after: bool) -> Optional[Edit]:
        """An edit that puts `statement` on a line of its own just before or after the statement
        holding `call`, at its indentation (so it runs on the same path); None where that statement
        shares its lines with others."""
        lines = self.model.own_lines(call)
        if lines is None:
            return None
        first, last, indent = lines
        at = last + 1 if after else first
        return Edit(at, 1, at, 1, f"{indent}{statement}\n")

    def line(self, node: cst.CSTNode) -> int:
        return self.model.line_of(node)

    def run(self) -> list[Finding]:
        if not self.checks_test_suites and harness.is_test_module(self.model):
            return []
        self.check()
        return self._findings


def _rule_modules() -> Iterator[str]:
    import ddpdoctor.lint.rules as package

    for module in pkgutil.iter_modules(package.__path__):
        if module.name != "base" and not module.name.startswith("_"):
            yield f"{package.__name__}.{module.name}"


_RULES: Optional[dict[str, type[Rule]]] = None


def all_rules() -> dict[str, type[Rule]]:
    """Every rule class, by code (imports each module of this package once)."""
    global _RULES
    if _RULES is None:
        found: dict[str, type[Rule]] = {}
        for module_name in _rule_modules():
            module = importlib.import_module(module_name)
            for value in vars(module).values():
                if isinstance(value, type) and issubclass(value, Rule) and value is not Rule and hasattr(value, "code"):
                    if value.__module__ == module.__name__:
                        found[value.code] = value
        _RULES = dict(sorted(found.items()))
    return _RULES
