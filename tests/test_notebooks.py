"""Jupyter notebooks: linted cell by cell (IPython lines skipped, line numbers kept), findings at
`nb.ipynb:cell N:line:col`, fixes written back into the notebook's JSON, malformed notebooks a
one-line error and never "All checks passed"."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from cli_helpers import invoke
from ddpdoctor import lint_paths, lint_source
from ddpdoctor.findings import Finding
from ddpdoctor.lint import notebook

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "notebooks" / "ddp_train.ipynb"




def cells(*sources: str, kind: str = "code", **document: Any) -> str:
    body = [{"cell_type": kind, "metadata": {}, "source": source.splitlines(keepends=True),
             **({"execution_count": None, "outputs": []} if kind == "code" else {})} for source in sources]
    return json.dumps({"cells": body, "metadata": {}, "nbformat": 4, "nbformat_minor": 5, **document}, indent=1)


def pins(path: Path) -> list[tuple[int, int, str]]:
    """(cell, line, code) of every `# expect: CODE` comment in the notebook's cells."""
    found = []
    for number, cell in enumerate(json.loads(path.read_text())["cells"], 1):
        for line, text in enumerate("".join(cell["source"]).splitlines(), 1):
            found += [(number, line, code) for code in re.findall(r"# expect: (\w+)", text)]
    return found


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    shutil.copy(FIXTURE, tmp_path / "nb.ipynb")
    return tmp_path


def test_the_fixture_is_linted_cell_by_cell_with_its_pinned_findings() -> None:
    findings = lint_paths([FIXTURE], config=False)
    assert [(f.cell, f.line, f.code) for f in findings] == pins(FIXTURE) == [(6, 3, "DDP001"), (7, 4, "DDP008")]
    # The IPython lines kept every line of Python where it was: `loader` on line 3, column 17.
    assert (findings[0].column, findings[1].column) == (17, 1)
    # A message's own line references are the notebook's cells and lines, not the joined text's.
    assert "(cell 4, line 6)" in findings[0].message and "epoch loop (cell 6, line 2)" in findings[0].message
    assert "init_process_group at cell 4, line 3" in findings[1].message


def test_text_and_json_name_the_cell(copy: Path) -> None:
    text = invoke(["lint", "--no-cache", "nb.ipynb"], copy)
    assert text.exit_code == 1
    lines = text.stdout.splitlines()
    assert lines[0].startswith("nb.ipynb:cell 6:3:17: DDP001 ")
    assert lines[1].startswith("nb.ipynb:cell 7:4:1: DDP008 ")
    assert lines[2] == "Found 2 problems (2 warnings) in 1 file. 2 fixable with --fix."
    data = json.loads(invoke(["lint", "--no-cache", "--format", "json", "nb.ipynb"], copy).stdout)
    assert [(f["cell"], f["line"], f["column"]) for f in data] == [(6, 3, 17), (7, 4, 1)]
    # The fix edits are in the cell's own lines: DDP008's guard replaces cell 7's line 4 (up to
    # the start of the line after it).
    assert {(e["line"], e["end_line"]) for e in data[1]["fix"]["edits"]} == {(4, 5)}


def test_a_folder_includes_its_notebooks_but_not_their_checkpoints(copy: Path) -> None:
    (copy / ".ipynb_checkpoints").mkdir()
    shutil.copy(FIXTURE, copy / ".ipynb_checkpoints" / "nb-checkpoint.ipynb")
    findings = lint_paths([copy], config=False)
    assert {Path(f.path).name for f in findings} == {"nb.ipynb"}


def test_fix_writes_the_cells_back_and_keeps_everything_else(copy: Path) -> None:
    before = (copy / "nb.ipynb").read_text()
    result = invoke(["lint", "--no-cache", "--fix", "nb.ipynb"], copy)
    assert result.exit_code == 0, result.output
    assert "Fixed 2 problems." in result.stdout
    after = (copy / "nb.ipynb").read_text()
    document = json.loads(after)
    assert document["cells"][5]["source"][:3] == [
        "%%time\n", "for epoch in range(3):\n", "    sampler.set_epoch(epoch)\n"]
    assert document["cells"][6]["source"][2:] == [
        "files = !ls\n", "if dist.get_rank() == 0:\n",
        '    torch.save(model.module.state_dict(), "last.pt")  # expect: DDP008']
    # Only the two edited cells changed, and the file is written as Jupyter writes it.
    original = json.loads(before)
    for index, cell in enumerate(original["cells"]):
        if index not in (5, 6):
            assert document["cells"][index] == cell
    assert after == json.dumps(document, indent=1, ensure_ascii=False) + "\n"
    added = [line for line in after.splitlines() if line not in before.splitlines()]
    assert added == ['    "    sampler.set_epoch(epoch)\\n",',
                     '    "    torch.save(model.module.state_dict(), \\"last.pt\\")  # expect: DDP008"']
    assert lint_paths([copy / "nb.ipynb"], config=False) == []


def test_diff_shows_the_notebook_json_change_and_writes_nothing(copy: Path) -> None:
    before = (copy / "nb.ipynb").read_bytes()
    result = invoke(["lint", "--no-cache", "--diff", "nb.ipynb"], copy)
    assert result.exit_code == 1
    assert '+    "    sampler.set_epoch(epoch)\\n",' in result.stdout
    assert (copy / "nb.ipynb").read_bytes() == before


@pytest.mark.parametrize(
    "content, error",
    [
        ("", "nb.ipynb: not valid JSON: Expecting value at line 1 column 1"),
        ("{\"cells\": [", "nb.ipynb: not valid JSON: Expecting value at line 1 column 12"),
        ("[1, 2]", "nb.ipynb: not a Jupyter notebook: no 'cells' list (only nbformat 4 is read)"),
        ('{"cells": [{"source": "x"}]}', "nb.ipynb: cell 1 is not a cell (no 'cell_type')"),
        ('{"cells": [{"cell_type": "code", "source": 3}]}',
         "nb.ipynb: cell 1: 'source' must be a string or a list of strings"),
    ],
)
def test_a_malformed_notebook_is_a_one_line_error_never_a_pass(tmp_path: Path, content: str, error: str) -> None:
    (tmp_path / "nb.ipynb").write_text(content)
    result = invoke(["lint", "--no-cache", "nb.ipynb"], tmp_path)
    assert result.exit_code == 2
    assert result.stderr == f"ddpdoctor: error: {error}\n"
    assert "All checks passed" not in result.stdout


def test_ipython_lines_are_skipped_and_python_cell_magics_kept() -> None:
    book = notebook.read(cells(
        "%matplotlib inline\nimport torch\n!ls -l\nfiles = !ls\nx = %time f()\ntorch?\n??torch\n# why? a comment\n",
        "%%bash\ntorch.save(1, 'x')\n",
        "%%time\ny = 1  # kept\n",
        "# only a comment",
    ))
    joined = book.python.splitlines()
    assert joined[0] == "# %% [ddpdoctor cell 1]"
    assert [line for line in joined if "pass  # ddpdoctor" not in line] == [
        "# %% [ddpdoctor cell 1]", "import torch", "# why? a comment",
        "# %% [ddpdoctor cell 2]", "# %% [ddpdoctor cell 3]", "y = 1  # kept", "# %% [ddpdoctor cell 4]",
        "# only a comment"]
    assert book.ipython_lines[:6] == ["%matplotlib inline", "!ls -l", "files = !ls", "x = %time f()", "torch?", "??torch"]
    compile(book.python, "nb", "exec")  # the joined text is Python


def test_an_ipython_line_inside_a_block_keeps_the_block_valid() -> None:
    book = notebook.read(cells("for i in range(3):\n    !echo $i\n"))
    compile(book.python, "nb", "exec")
    assert book.python.splitlines()[2].startswith("    pass")


def test_the_markers_map_lines_to_cells() -> None:
    book = notebook.read(cells("a = 1\nb = 2\n", "x", "c = 3\n", kind="code") )
    where = notebook.CellMap.of(book.python)
    assert [where.place(line) for line in range(1, 8)] == [None, (1, 1), (1, 2), None, (2, 1), None, (3, 1)]


def test_fixes_that_broke_a_cell_boundary_or_an_ipython_line_are_not_written() -> None:
    text = cells("!ls\nimport torch\n", "x = 1\n")
    book = notebook.read(text)
    unchanged = notebook.write_back(book, text, book.python)
    assert unchanged == text
    no_marker = book.python.replace("# %% [ddpdoctor cell 2]\n", "")
    assert isinstance(notebook.write_back(notebook.read(text), text, no_marker), notebook.NotebookError)
    no_magic = re.sub(r"pass  # ddpdoctor: ipython line 0\n", "", book.python)
    assert isinstance(notebook.write_back(notebook.read(text), text, no_magic), notebook.NotebookError)
    above = "import os\n" + book.python
    assert isinstance(notebook.write_back(notebook.read(text), text, above), notebook.NotebookError)


def test_string_sources_stay_strings_and_escaped_json_stays_escaped() -> None:
    document = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                           "source": "x = 'é'\ny = 2"}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    text = json.dumps(document, indent=2)  # escaped: \u00e9
    book = notebook.read(text)
    written = notebook.write_back(book, text, book.python.replace("y = 2", "y = 3"))
    assert isinstance(written, str)
    assert written == json.dumps({**document, "cells": [{**document["cells"][0], "source": "x = 'é'\ny = 3"}]}, indent=2)


def test_suppression_comments_and_parse_errors_work_in_cells() -> None:
    source = cells(
        "import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n",
        "torch.save(model, 'a.pt')  # noqa: DDP008\n",
        "torch.save(model, 'b.pt')\n",
    )
    assert [(f.cell, f.line, f.code) for f in lint_source(source, "nb.ipynb")] == [(3, 1, "DDP008")]
    broken = cells("import torch.distributed as dist\ndist.init_process_group('nccl')\n", "x = (\n")
    assert [(f.cell, f.code) for f in lint_source(broken, "nb.ipynb")] == [(2, "DDP999")]


def test_a_notebook_in_another_language_has_nothing_to_lint(tmp_path: Path) -> None:
    (tmp_path / "r.ipynb").write_text(cells("library(torch)\n", metadata={"language_info": {"name": "R"}}))
    assert lint_paths([tmp_path / "r.ipynb"], config=False) == []


def test_stdin_with_a_notebook_name(tmp_path: Path) -> None:
    result = invoke(["lint", "--no-cache", "-", "--stdin-filename", "nb.ipynb"], tmp_path, stdin=FIXTURE.read_bytes())
    assert result.exit_code == 1
    assert result.stdout.startswith("nb.ipynb:cell 6:3:17: DDP001")


def test_github_and_sarif_name_the_cell_not_a_line_of_the_json(copy: Path) -> None:
    github = invoke(["lint", "--no-cache", "--format", "github", "nb.ipynb"], copy).stdout.splitlines()
    assert github[0].startswith("::warning file=nb.ipynb,title=DDP001 (missing-set-epoch) at cell 6%2C line 3::")
    sarif = json.loads(invoke(["lint", "--no-cache", "--format", "sarif", "nb.ipynb"], copy).stdout)
    result = sarif["runs"][0]["results"][0]
    assert "region" not in result["locations"][0]["physicalLocation"]
    assert result["properties"] == {"cell": 6, "cellLine": 3, "cellColumn": 17}


def test_untouched_cells_keep_their_exact_source_and_trailing_blank_lines() -> None:
    text = cells("import torch\n\n", "a = 1\r\nb = 2\n", "x = 1")
    book = notebook.read(text)
    written = notebook.write_back(book, text, book.python.replace("x = 1", "x = 2\ny = 3"))
    assert isinstance(written, str)
    sources = [cell["source"] for cell in json.loads(written)["cells"]]
    assert sources == [["import torch\n", "\n"], ["a = 1\r\n", "b = 2\n"], ["x = 2\n", "y = 3"]]


def test_the_cache_keeps_the_cells(copy: Path) -> None:
    first = invoke(["lint", "nb.ipynb"], copy)
    assert (copy / ".ddpdoctor_cache").exists()
    second = invoke(["lint", "nb.ipynb"], copy)
    assert second.stdout == first.stdout and second.stdout.startswith("nb.ipynb:cell 6:3:17: DDP001")


# ---------------------------------------------------------------- the mapping, piece by piece

MAPPED = cells("import torch\n", "a = 1\nb = 2\n")  # joined: marker, import, marker, a, b


def _finding(line: int, end_line: int, message: str = "m", edits: tuple = ()) -> Finding:
    from ddpdoctor.findings import Fix, Severity

    fix = Fix("do it", True, edits) if edits else None
    return Finding("DDP008", "n", Severity.WARNING, message, "nb.ipynb", line, 3, end_line, 7, fix)


def test_a_finding_maps_its_start_end_and_the_lines_its_message_names() -> None:
    where = notebook.CellMap.of(notebook.read(MAPPED).python)
    mapped = where.finding(_finding(4, 5, "see line 2, line 5, ckpt.py line 4 and line 1 and line 99"))
    assert (mapped.cell, mapped.line, mapped.column, mapped.end_line, mapped.end_column) == (2, 1, 3, 2, 7)
    assert mapped.message == "see cell 1, line 1, cell 2, line 2, ckpt.py line 4 and line 1 and line 99"
    across = where.finding(_finding(2, 5))  # ends in another cell: kept to its first line
    assert (across.cell, across.line, across.end_line, across.end_column) == (1, 1, 1, 3)
    on_a_marker = where.finding(_finding(3, 3))  # a parse error at the next cell's marker: the line before it
    assert (on_a_marker.cell, on_a_marker.line) == (1, 1)
    assert where.place(0) is None and where.place(len(where.places) + 1) is None


def test_fix_edits_are_mapped_into_their_cell_or_left_out_of_the_report() -> None:
    from ddpdoctor.findings import Edit

    where = notebook.CellMap.of(notebook.read(MAPPED).python)
    inside = where.finding(_finding(4, 4, edits=(Edit(4, 1, 5, 1, "x"), Edit(5, 2, 5, 3, "y"))))
    assert inside.fix is not None and [(e.line, e.end_line) for e in inside.fix.edits] == [(1, 2), (2, 2)]
    for outside in (Edit(2, 1, 2, 2, "x"), Edit(3, 1, 3, 1, "x"), Edit(4, 1, 2, 1, "x")):
        assert where.finding(_finding(4, 4, edits=(outside,))).fix is None, outside


def test_write_back_says_why_it_refuses() -> None:
    text = cells("!ls\nimport torch\n", "x = 1\n")
    book = notebook.read(text)
    refusals = {
        book.python.replace("# %% [ddpdoctor cell 2]\n", ""): "a fix moved a cell boundary or an IPython line",
        book.python.replace("pass  # ddpdoctor: ipython line 0\n", ""): "a fix moved a cell boundary or an IPython line",
        "import os\n" + book.python: "a fix wrote above the first cell",
        book.python.replace("x = 1", "pass  # ddpdoctor: ipython line 0"): "a fix changed an IPython line",
        book.python.replace("x = 1", "pass  # ddpdoctor: ipython line 7"): "a fix changed an IPython line",
    }
    for python, why in refusals.items():
        refused = notebook.write_back(notebook.read(text), text, python)
        assert isinstance(refused, notebook.NotebookError) and str(refused) == why
    assert notebook.write_back(notebook.read(text), text, "\n\n" + book.python) == text  # blank lines above: fine


def test_a_changed_cell_keeps_its_final_newline_or_its_lack_of_one() -> None:
    text = cells("x = 1\n", "y = 1")
    book = notebook.read(text)
    written = notebook.write_back(book, text, book.python.replace("x = 1", "x = 2").replace("y = 1", "y = 2"))
    assert isinstance(written, str)
    assert [cell["source"] for cell in json.loads(written)["cells"]] == [["x = 2\n"], ["y = 2"]]


@pytest.mark.parametrize("language", ["python", "Python3", "ipython3", "ipython"])
def test_python_kernels_are_linted_and_others_are_not(language: str) -> None:
    bug = FIXTURE.read_text()
    assert lint_source(bug, "nb.ipynb") != []
    named = json.loads(bug)
    named["metadata"]["language_info"]["name"] = language
    assert [f.code for f in lint_source(json.dumps(named), "nb.ipynb")] == ["DDP001", "DDP008"]
    named["metadata"]["language_info"]["name"] = "R"  # the same text under an R kernel: nothing to lint
    assert lint_source(json.dumps(named), "nb.ipynb") == []


def test_json_nested_past_the_parser_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "nb.ipynb").write_text("[" * 200_000 + "]" * 200_000)
    result = invoke(["lint", "--no-cache", "nb.ipynb"], tmp_path)
    assert result.exit_code == 2
    assert result.stderr == "ddpdoctor: error: nb.ipynb: not valid JSON: nested too deeply\n"


def test_findings_off_the_cells_go_to_the_nearest_cell_line() -> None:
    where = notebook.CellMap.of(notebook.read(MAPPED).python)
    assert [(where.finding(_finding(line, line)).cell, where.finding(_finding(line, line)).line)
            for line in (1, 3, 5, 6, 40)] == [(1, 1), (1, 1), (2, 2), (2, 3), (2, 3)]
    first_code_cell_later = json.loads(MAPPED)
    first_code_cell_later["cells"].insert(0, {"cell_type": "markdown", "metadata": {}, "source": ["# Title"]})
    where = notebook.CellMap.of(notebook.read(json.dumps(first_code_cell_later)).python)
    assert (where.finding(_finding(1, 1)).cell, where.finding(_finding(1, 1)).line) == (2, 1)  # too large, say
    assert notebook.CellMap.of("").finding(_finding(1, 1)).cell == 1


@pytest.mark.parametrize(
    "metadata", [[], {"language_info": "python"}, {"language_info": {"name": 3}}, {"language_info": {}}])
def test_odd_metadata_is_read_as_python(metadata: object) -> None:
    book = notebook.read(cells("import torch\n", metadata=metadata))
    assert "import torch" in book.python


def test_cell_magics_hide_their_cell_unless_python() -> None:
    hidden = notebook.read(cells("%%\nx = 1\n", "%%bash -e\ny = 1\n", "%%  time\nz = 1\n", "%%timeit -n 3\nw = 1\n"))
    kept = [line for line in hidden.python.splitlines() if not line.startswith(("#", "pass"))]
    assert kept == ["z = 1", "w = 1"]


def test_a_placeholder_past_the_last_ipython_line_is_refused() -> None:
    text = cells("!ls\nx = 1\n")
    book = notebook.read(text)
    refused = notebook.write_back(book, text, book.python.replace("x = 1", "pass  # ddpdoctor: ipython line 1"))
    assert isinstance(refused, notebook.NotebookError)


@pytest.mark.parametrize(
    "original, expected_start",
    [
        ("tab", '{\n\t"cells": [\n\t\t{'),
        ("minified", '{"cells": [{"cell_type"'),
        ("raw", '{\n "cells": ['),
    ],
)
def test_the_json_is_written_as_the_original_was(original: str, expected_start: str) -> None:
    document = json.loads(cells("x = 'é'\n"))
    text = {"tab": json.dumps(document, indent="\t", ensure_ascii=False),
            "minified": json.dumps(document),
            "raw": json.dumps(document, indent=1, ensure_ascii=False) + "\n"}[original]
    book = notebook.read(text)
    written = notebook.write_back(book, text, book.python.replace("x = 'é'", "x = 'é2'"))
    assert isinstance(written, str) and written.startswith(expected_start)
    assert ("\\u00e9" in written) == (original == "minified") and written.endswith("\n") == (original == "raw")
    assert json.loads(written)["cells"][0]["source"] == ["x = 'é2'\n"]


def test_nothing_changed_returns_the_original_text_exactly() -> None:
    document = json.loads(cells("x = 1\n"))
    odd = json.dumps(document, indent=4, separators=(",", ":"))  # not how it would be written again
    assert notebook.write_back(notebook.read(odd), odd, notebook.read(odd).python) == odd
    prose = cells("# Title\n", kind="markdown")  # no code cell at all
    assert notebook.write_back(notebook.read(prose), prose, notebook.read(prose).python) == prose
