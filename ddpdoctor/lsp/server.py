"""The Language Server: diagnostics on open, change and save; each fix as a code action (safe or
unsafe, labelled), all safe fixes as `source.fixAll.ddpdoctor`; the rule's page on hover.

Positions: findings count columns in characters (code points) from 1; the protocol counts from 0
in the client's code units (UTF-16 unless negotiated), which pygls's position codec converts.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument
from pygls.workspace.position_codec import ServerTextPosition, ServerTextRange

from ddpdoctor import __version__
from ddpdoctor.catalog import rule_info
from ddpdoctor.findings import Edit, Finding, Severity
from ddpdoctor.lsp.linting import ConfigError, DocumentLinter

SOURCE = "ddpdoctor"
FIX_ALL = "source.fixAll.ddpdoctor"
DEBOUNCE_S = 0.01  # how long a change waits for the next before it is linted
_SEVERITY = {
    Severity.ERROR: types.DiagnosticSeverity.Error,
    Severity.WARNING: types.DiagnosticSeverity.Warning,
    Severity.INFO: types.DiagnosticSeverity.Information,
}


@dataclass
class Published:
    version: Optional[int]
    findings: list[Finding]


class DoctorServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("ddpdoctor", __version__)
        self.linter = DocumentLinter()
        self.published: dict[str, Published] = {}
        self.latest: dict[str, int] = {}  # the newest version each document has changed to

    def document_path(self, document: TextDocument) -> Optional[Path]:
        """The file a document lints as; None for what ddpdoctor does not lint (an untitled
        buffer has no project, a notebook is synchronised cell by cell)."""
        if not document.uri.startswith("file:") or document.uri.endswith(".ipynb"):
            return None
        path = to_fs_path(document.uri)
        return Path(path) if path else None

    def publish(self, uri: str) -> None:
        document = self.workspace.get_text_document(uri)
        path = self.document_path(document)
        if path is None:
            return
        try:
            findings = self.linter.lint(path, document.source).findings
        except ConfigError as error:
            self.window_show_message(types.ShowMessageParams(type=types.MessageType.Error, message=f"ddpdoctor: {error}"))
            findings = []
        self.published[uri] = Published(document.version, findings)
        self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(
            uri=uri, version=document.version, diagnostics=[diagnostic(document, f) for f in findings]))


def text_range(document: TextDocument, line: int, column: int, end_line: int, end_column: int) -> types.Range:
    """1-based (line, column in characters), end exclusive -> the client's 0-based units."""
    server_range = ServerTextRange(
        start=ServerTextPosition(line=max(line - 1, 0), character=max(column - 1, 0)),
        end=ServerTextPosition(line=max(end_line - 1, 0), character=max(end_column - 1, 0)),
    )
    return document.range_to_client_units(server_range)


def diagnostic(document: TextDocument, finding: Finding) -> types.Diagnostic:
    return types.Diagnostic(
        range=text_range(document, finding.line, finding.column, finding.end_line, finding.end_column),
        message=finding.message,
        severity=_SEVERITY[finding.severity],
        code=finding.code,
        source=SOURCE,
        data={"name": finding.name, "fix": finding.fix.to_dict() if finding.fix else None},
    )


def text_edits(document: TextDocument, edits: Sequence[Edit]) -> list[types.TextEdit]:
    return [types.TextEdit(range=text_range(document, e.line, e.column, e.end_line, e.end_column), new_text=e.content)
            for e in edits]


def fix_title(code: str, fix: dict[str, Any]) -> str:
    """As ruff labels them: a safe fix by its description, an unsafe one marked so."""
    return f"{code}: {fix['description']}" + ("" if fix.get("applicable", True) else " (unsafe)")


def code_actions(server: DoctorServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    document = server.workspace.get_text_document(params.text_document.uri)
    wanted = [str(getattr(kind, "value", kind)) for kind in params.context.only or ()]
    actions: list[types.CodeAction] = []
    if not wanted or any(kind.startswith("quickfix") for kind in wanted):
        for diag in params.context.diagnostics:
            data = diag.data if isinstance(diag.data, dict) else {}
            fix = data.get("fix")
            if diag.source != SOURCE or not fix or not fix.get("edits"):
                continue
            edits = [Edit(**edit) for edit in fix["edits"]]
            actions.append(types.CodeAction(
                title=fix_title(str(diag.code), fix),
                kind=types.CodeActionKind.QuickFix,
                diagnostics=[diag],
                is_preferred=bool(fix.get("applicable", True)),
                edit=types.WorkspaceEdit(changes={document.uri: text_edits(document, edits)}),
            ))
    if not wanted or any(FIX_ALL.startswith(kind) for kind in wanted):
        path = server.document_path(document)
        if path is not None:
            try:
                fixed = server.linter.lint(path, document.source, fix=True).fixed_source
            except ConfigError:
                fixed = None
            if fixed is not None and fixed != document.source:
                whole = types.Range(start=types.Position(line=0, character=0),
                                    end=types.Position(line=len(document.lines), character=0))
                actions.append(types.CodeAction(
                    title="ddpdoctor: fix all safe problems",
                    kind=FIX_ALL,  # a sub-kind of source.fixAll, as ruff's server names its own
                    edit=types.WorkspaceEdit(changes={document.uri: [types.TextEdit(range=whole, new_text=fixed)]}),
                ))
    return actions


def hover(server: DoctorServer, params: types.HoverParams) -> Optional[types.Hover]:
    """The rule page of each finding under the cursor."""
    published = server.published.get(params.text_document.uri)
    if published is None:
        return None
    document = server.workspace.get_text_document(params.text_document.uri)
    position = document.position_from_client_units(params.position)
    line, column = position.line + 1, position.character + 1
    pages: list[str] = []
    for finding in published.findings:
        inside = (finding.line, finding.column) <= (line, column) <= (finding.end_line, finding.end_column)
        info = rule_info(finding.code) if inside else None
        if info is not None and info.body not in pages:
            pages.append(info.body)
    if not pages:
        return None
    return types.Hover(contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value="\n---\n".join(pages)))


def build() -> DoctorServer:
    server = DoctorServer()

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: DoctorServer, params: types.DidOpenTextDocumentParams) -> None:
        ls.publish(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    async def did_change(ls: DoctorServer, params: types.DidChangeTextDocumentParams) -> None:
        # Typing sends a change per keystroke: let the ones already waiting be read first (pygls
        # reads a message a line at a time through the loop), and lint only the newest text: an
        # older version's diagnostics would be stale on arrival.
        uri, version = params.text_document.uri, params.text_document.version
        ls.latest[uri] = version
        await asyncio.sleep(DEBOUNCE_S)
        if ls.latest.get(uri) == version:
            ls.publish(uri)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: DoctorServer, params: types.DidSaveTextDocumentParams) -> None:
        # What other documents read of this file is now its saved text: re-lint every open one.
        path = to_fs_path(params.text_document.uri)
        if path:
            ls.linter.changed_on_disk(Path(path))
        for uri in list(ls.published):
            ls.publish(uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: DoctorServer, params: types.DidCloseTextDocumentParams) -> None:
        ls.published.pop(params.text_document.uri, None)
        ls.latest.pop(params.text_document.uri, None)
        ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[]))

    @server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def did_change_watched(ls: DoctorServer, params: types.DidChangeWatchedFilesParams) -> None:
        for change in params.changes:
            path = to_fs_path(change.uri)
            if path:
                ls.linter.changed_on_disk(Path(path))

    @server.feature(
        types.TEXT_DOCUMENT_CODE_ACTION,
        types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL]),
    )
    def code_action(ls: DoctorServer, params: types.CodeActionParams) -> list[types.CodeAction]:
        return code_actions(ls, params)

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    def on_hover(ls: DoctorServer, params: types.HoverParams) -> Optional[types.Hover]:
        return hover(ls, params)

    return server


def serve() -> None:
    """Speak LSP over standard input and output until the client says exit."""
    build().start_io()
