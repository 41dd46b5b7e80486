"""`ddpdoctor server` end to end over stdio with a real LSP client (pytest-lsp): diagnostics on
open, change and save, across the project's modules; fixes as code actions, safe and unsafe; the
rule page on hover."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest_lsp = pytest.importorskip("pytest_lsp", reason="the server tests need the 'server' extra (pytest-lsp)")
pytest.importorskip("pygls", reason="the server needs the 'server' extra: pip install 'ddpdoctor[server]'")

from lsprotocol import types  # noqa: E402
from pytest_lsp import ClientServerConfig, LanguageClient  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BUGGY = (ROOT / "examples" / "buggy_train.py").read_text(encoding="utf-8")
SAVE = "import torch\n\ndef save(model, path):\n    torch.save(model.state_dict(), path)\n"
MAIN = "import torch.distributed as dist\nfrom ckpt import save\n\ndist.init_process_group('gloo')\nmodel = object()\nsave(model, 'm.pt')\n"
# An unsafe fix only (DDP001's set_epoch in a loop whose sampler is built under a condition).
UNSAFE = (ROOT / "fixtures" / "fixes" / "DDP001" / "conditional_sampler_not_applied.in.py").read_text(encoding="utf-8")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text("[tool.ddpdoctor]\n")
    (tmp_path / "ckpt.py").write_text(SAVE)
    (tmp_path / "main.py").write_text(MAIN)
    (tmp_path / "train.py").write_text(BUGGY)
    (tmp_path / "unsafe.py").write_text(UNSAFE)
    return tmp_path


@pytest_lsp.fixture(config=ClientServerConfig(server_command=[sys.executable, "-m", "ddpdoctor", "server"]))
async def client(lsp_client: LanguageClient, project: Path):  # type: ignore[no-untyped-def]
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=types.ClientCapabilities(), root_uri=project.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=project.as_uri(), name="p")]))
    yield
    await lsp_client.shutdown_session()


async def open_and_wait(client: LanguageClient, path: Path) -> list[types.Diagnostic]:
    client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(
        uri=path.as_uri(), language_id="python", version=1, text=path.read_text())))
    await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    return list(client.diagnostics[path.as_uri()])


async def change_and_wait(client: LanguageClient, path: Path, text: str, version: int) -> list[types.Diagnostic]:
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=path.as_uri(), version=version),
        content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)]))
    await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    return list(client.diagnostics[path.as_uri()])


def where(diagnostics: list[types.Diagnostic]) -> list[tuple[str, int, int]]:
    return [(str(d.code), d.range.start.line, d.range.start.character) for d in diagnostics]


@pytest.mark.asyncio
async def test_open_and_change_publish_diagnostics(client: LanguageClient, project: Path) -> None:
    train = project / "train.py"
    diagnostics = await open_and_wait(client, train)
    # 0-based: the CLI's train.py:33:31 and 39:5.
    assert where(diagnostics) == [("DDP001", 32, 30), ("DDP008", 38, 4)]
    assert {d.source for d in diagnostics} == {"ddpdoctor"}
    assert diagnostics[0].severity == types.DiagnosticSeverity.Warning
    fixed = BUGGY.replace("    for epoch in range(10):\n", "    for epoch in range(10):\n        sampler.set_epoch(epoch)\n")
    assert where(await change_and_wait(client, train, fixed, 2)) == [("DDP008", 39, 4)]
    assert await change_and_wait(client, train, "x = (\n", 3) == []  # no distributed API: not parsed


@pytest.mark.asyncio
async def test_the_project_is_followed_and_a_saved_module_is_read_again(client: LanguageClient, project: Path) -> None:
    main = project / "main.py"
    assert where(await open_and_wait(client, main)) == [("DDP008", 5, 0)]  # the save inside ckpt.save
    # ckpt.py now saves only on rank 0: once saved, main.py is re-linted against the new text.
    (project / "ckpt.py").write_text(SAVE.replace("    torch.save", "    if torch.distributed.get_rank() == 0:\n        torch.save"))
    client.text_document_did_save(types.DidSaveTextDocumentParams(
        text_document=types.TextDocumentIdentifier(uri=(project / "ckpt.py").as_uri())))
    await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    assert list(client.diagnostics[main.as_uri()]) == []


@pytest.mark.asyncio
async def test_fixes_are_code_actions_labelled_safe_or_unsafe(client: LanguageClient, project: Path) -> None:
    train = project / "train.py"
    diagnostics = await open_and_wait(client, train)
    actions = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=train.as_uri()), range=diagnostics[0].range,
        context=types.CodeActionContext(diagnostics=diagnostics)))
    assert actions is not None
    titles = [a.title for a in actions if isinstance(a, types.CodeAction)]
    assert titles == ["DDP001: call `sampler.set_epoch(epoch)` at the start of each epoch",
                      "DDP008: save only where `dist.get_rank() == 0` (unsafe)",
                      "ddpdoctor: fix all safe problems"]
    assert [a.is_preferred for a in actions if isinstance(a, types.CodeAction)] == [True, False, None]
    quick = actions[0]
    assert isinstance(quick, types.CodeAction) and quick.is_preferred and quick.edit and quick.edit.changes
    (edit,) = quick.edit.changes[train.as_uri()]
    assert edit.range.start == types.Position(line=32, character=0) and "sampler.set_epoch(epoch)" in edit.new_text

    unsafe = project / "unsafe.py"
    diagnostics = await open_and_wait(client, unsafe)
    actions = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=unsafe.as_uri()), range=diagnostics[0].range,
        context=types.CodeActionContext(diagnostics=diagnostics, only=[types.CodeActionKind.QuickFix])))
    assert actions is not None
    (action,) = actions
    assert isinstance(action, types.CodeAction)
    assert action.title.endswith(" (unsafe)") and not action.is_preferred


@pytest.mark.asyncio
async def test_hover_shows_the_rule_page(client: LanguageClient, project: Path) -> None:
    train = project / "train.py"
    await open_and_wait(client, train)
    found = await client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=train.as_uri()), position=types.Position(line=38, character=6)))
    assert found is not None and isinstance(found.contents, types.MarkupContent)
    assert found.contents.kind == types.MarkupKind.Markdown
    assert found.contents.value.startswith("# DDP008 unguarded-checkpoint-save")
    nothing = await client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=train.as_uri()), position=types.Position(line=0, character=0)))
    assert nothing is None


@pytest.mark.asyncio
async def test_wide_characters_are_counted_in_utf16_units(client: LanguageClient, project: Path) -> None:
    path = project / "wide.py"
    path.write_text("import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"
                    "𝒙 = 1; torch.save(model, 'a.pt')\n")
    (diagnostic,) = await open_and_wait(client, path)
    # 𝒙 is one character but two UTF-16 units: `torch` starts at character 8, not 7.
    assert (diagnostic.code, diagnostic.range.start.line, diagnostic.range.start.character) == ("DDP008", 3, 8)


@pytest.mark.asyncio
async def test_a_burst_of_changes_is_linted_at_its_newest_version_only(client: LanguageClient, project: Path) -> None:
    train = project / "train.py"
    await open_and_wait(client, train)
    features = client.protocol.fm.features
    record = features[types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS]
    versions: list[int | None] = []

    def recording(params: types.PublishDiagnosticsParams) -> None:
        versions.append(params.version)
        record(params)

    features[types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS] = recording
    for version in range(2, 12):  # typing: ten changes faster than a lint
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=train.as_uri(), version=version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=BUGGY + f"# {version}\n")]))
    while not versions or versions[-1] != 11:
        await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    assert versions == sorted(versions) and len(versions) <= 3, versions  # not one lint per keystroke
    assert len(client.diagnostics[train.as_uri()]) == 2
