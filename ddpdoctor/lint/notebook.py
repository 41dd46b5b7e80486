"""Jupyter notebooks as Python: code cells joined into one module, findings mapped back to cells.

The joined text puts a marker comment before each code cell (`# %% [ddpdoctor cell 3]`, 3 being the
cell's 1-based position among all the notebook's cells, as ruff counts them) and replaces each IPython
line (`%matplotlib inline`, `!pip install x`, `files = !ls`, `model?`) with a `pass` that names it, so the
text parses, keeps every line of Python where it was, and can be cut back into cells after `--fix` edited
it: the markers find the cells, the `pass` lines give the IPython lines back. A cell under a cell magic
that is not Python (`%%bash`, `%%writefile`) is left out entirely.

Nothing here knows any rule; the engine lints the joined text as it lints a file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence, Union

from ddpdoctor.findings import Edit, Finding

SUFFIX = ".ipynb"
_MARKER = "# %% [ddpdoctor cell {}]"
_MARKER_LINE = re.compile(r"# %% \[ddpdoctor cell (\d+)\]\Z")
_MAGIC_PASS = "pass  # ddpdoctor: ipython line {}"
_MAGIC_PASS_LINE = re.compile(r"(\s*)pass  # ddpdoctor: ipython line (\d+)\Z")
# IPython syntax on one line: a line magic or shell escape, an assignment from one, or a help query.
_IPYTHON_LINE = re.compile(r"\s*(?:[%!]|[\w.]+\s*=\s*[%!][^=]|\?|[\w.\[\]()]+\?\??\s*\Z)")
# A message's reference to a line of the linted file; `utils.py line 7` is another module's line.
_LINE_REFERENCE = re.compile(r"(?<!\.py )\bline (\d+)\b")
# Cell magics whose body is Python all the same; any other (%%bash, %%html, ...) hides the cell.
_PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun", "debug", "skip"})


class NotebookError(ValueError):
    """The file is not a notebook we can read (not JSON, not nbformat 4's shape)."""


class NotPython(Exception):
    """A notebook in another language (an R or Julia kernel): read, and nothing in it to lint."""


def is_notebook(path: str) -> bool:
    return path.lower().endswith(SUFFIX)


@dataclass
class Notebook:
    document: dict[str, Any]  # the parsed JSON, written back with its cells' new sources
    code_cells: list[int]  # indices (0-based) into document["cells"] of the cells that are Python
    ipython_lines: list[str]  # the IPython lines the joined text replaced, by number
    python: str  # the joined text the engine lints


def _source_lines(cell: dict[str, Any], number: int) -> list[str]:
    source = cell.get("source", "")
    if isinstance(source, list) and all(isinstance(part, str) for part in source):
        source = "".join(source)
    if not isinstance(source, str):
        raise NotebookError(f"cell {number}: 'source' must be a string or a list of strings")
    return source.splitlines()


def read(text: str) -> Notebook:
    """Parse a notebook's JSON and join its code cells. Raises NotebookError when it is not one,
    NotPython when its kernel's language is another."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise NotebookError(f"not valid JSON: {error.msg} at line {error.lineno} column {error.colno}") from None
    except RecursionError:
        raise NotebookError("not valid JSON: nested too deeply") from None
    if not isinstance(document, dict) or not isinstance(document.get("cells"), list):
        raise NotebookError("not a Jupyter notebook: no 'cells' list (only nbformat 4 is read)")
    language = document.get("metadata", {}).get("language_info", {}) if isinstance(document.get("metadata"), dict) else {}
    name = language.get("name", "python") if isinstance(language, dict) else "python"
    if isinstance(name, str) and name.lower() not in ("python", "python3", "ipython", "ipython3"):
        raise NotPython(name)
    lines: list[str] = []
    magics: list[str] = []
    code_cells: list[int] = []
    for index, cell in enumerate(document["cells"]):
        if not isinstance(cell, dict) or not isinstance(cell.get("cell_type"), str):
            raise NotebookError(f"cell {index + 1} is not a cell (no 'cell_type')")
        if cell["cell_type"] != "code":
            continue
        source = _source_lines(cell, index + 1)
        code_cells.append(index)
        lines.append(_MARKER.format(index + 1))
        hidden = bool(source) and source[0].startswith("%%") and _cell_magic(source[0]) not in _PYTHON_CELL_MAGICS
        for line in source:
            if hidden or _IPYTHON_LINE.match(line):  # `%%time` itself is an IPython line too
                indent = line[: len(line) - len(line.lstrip())]
                lines.append(indent + _MAGIC_PASS.format(len(magics)))
                magics.append(line)
            else:
                lines.append(line)
    return Notebook(document, code_cells, magics, "".join(line + "\n" for line in lines))


def _cell_magic(line: str) -> str:
    return line[2:].split(maxsplit=1)[0] if line[2:].strip() else ""


@dataclass(frozen=True)
class CellMap:
    """Where each line of a joined text came from: (cell number, line in the cell) or None for a
    marker line. Built from the text itself, so it maps a text that `--fix` changed as well."""

    places: tuple[Optional[tuple[int, int]], ...]

    @classmethod
    def of(cls, python: str) -> "CellMap":
        places: list[Optional[tuple[int, int]]] = []
        cell, line = 0, 0
        for text in python.split("\n"):
            marker = _MARKER_LINE.match(text)
            if marker:
                cell, line = int(marker.group(1)), 0
                places.append(None)
            elif cell:
                line += 1
                places.append((cell, line))
            else:
                places.append(None)  # above the first cell: only ever blank
        return cls(tuple(places))

    def place(self, line: int) -> Optional[tuple[int, int]]:
        return self.places[line - 1] if 1 <= line <= len(self.places) else None

    def finding(self, finding: Finding) -> Finding:
        """The finding at its cell and line."""
        cell, line = self._nearest(finding.line)
        end = self.place(finding.end_line)
        end_line, end_column = (end[1], finding.end_column) if end and end[0] == cell else (line, finding.column)
        fix = finding.fix
        if fix is not None:
            edits = self._edits(fix.edits, cell)
            fix = replace(fix, edits=edits) if edits is not None else None
        message = _LINE_REFERENCE.sub(self._reference, finding.message)
        return replace(finding, cell=cell, line=line, end_line=end_line, end_column=end_column, fix=fix,
                       message=message)

    def _reference(self, match: "re.Match[str]") -> str:
        """`line 24` in a message (a line of this notebook's joined text) as `cell 6, line 1`."""
        place = self.place(int(match.group(1)))
        return f"cell {place[0]}, line {place[1]}" if place else match.group(0)

    def _nearest(self, line: int) -> tuple[int, int]:
        """The place of `line`, else of the nearest cell line before it (a parse error may point
        at the next cell's marker, or one line past the end), else the first cell's first line (a
        finding about the whole notebook, such as one too large to analyse)."""
        for candidate in range(min(line, len(self.places)), 0, -1):
            place = self.places[candidate - 1]
            if place is not None:
                return place
        return next((place for place in self.places if place is not None), (1, 1))

    def _edits(self, edits: Sequence[Edit], cell: int) -> Optional[tuple[Edit, ...]]:
        """The edits in the finding's cell's own lines; None when one reaches outside that cell
        (the fix is still applied by `--fix`, which edits the joined text; only its report lacks it)."""
        out: list[Edit] = []
        for edit in edits:
            start, end = self.place(edit.line), self.place(edit.end_line)
            if start is None or end is None or start[0] != cell or end[0] != cell:
                return None
            out.append(replace(edit, line=start[1], end_line=end[1]))
        return tuple(out)


def write_back(notebook: Notebook, original_text: str, python: str) -> Union[str, NotebookError]:
    """The notebook's JSON with each code cell's source taken from `python` (the joined text after
    fixes), formatted as the original was (indent, key order, non-ASCII kept, final newline). An
    error when the markers or the IPython lines did not survive the edits intact: then nothing is
    written, rather than a cell lost or merged."""
    sources: dict[int, list[str]] = {}
    current: Optional[int] = None
    seen: list[int] = []
    used: set[int] = set()
    for text in python.split("\n"):
        marker = _MARKER_LINE.match(text)
        if marker:
            current = int(marker.group(1))
            seen.append(current)
            sources[current] = []
            continue
        if current is None:
            if text.strip():
                return NotebookError("a fix wrote above the first cell")
            continue
        magic = _MAGIC_PASS_LINE.match(text)
        if magic:
            number = int(magic.group(2))
            if number >= len(notebook.ipython_lines) or number in used:
                return NotebookError("a fix changed an IPython line")
            used.add(number)
            text = notebook.ipython_lines[number]
        sources[current].append(text)
    if seen != [index + 1 for index in notebook.code_cells] or len(used) != len(notebook.ipython_lines):
        return NotebookError("a fix moved a cell boundary or an IPython line")
    if seen and sources[seen[-1]][-1:] == [""]:
        sources[seen[-1]].pop()  # the joined text's final newline, after the last cell's last line
    cells = notebook.document["cells"]
    changed = False
    for index in notebook.code_cells:
        lines = sources[index + 1]
        if lines == _source_lines(cells[index], index + 1):
            continue  # untouched: its source stays exactly as it was (line endings included)
        old = cells[index].get("source", "")
        old_text = "".join(old) if isinstance(old, list) else old
        new_text = "\n".join(lines) + ("\n" if old_text.endswith("\n") and lines else "")
        changed = True
        cells[index]["source"] = new_text.splitlines(keepends=True) if isinstance(old, list) else new_text
    if not changed:
        return original_text
    return _dumps_like(notebook.document, original_text)


def _dumps_like(document: dict[str, Any], original: str) -> str:
    """JSON as Jupyter writes it (`indent=1`, non-ASCII as is), with the original's indent."""
    match = re.match(r"\{\r?\n([ \t]+)\"", original)
    indent: Union[int, str, None] = None
    if match:
        whitespace = match.group(1)
        indent = len(whitespace) if set(whitespace) == {" "} else whitespace
    text = json.dumps(document, indent=indent, ensure_ascii=_escapes_non_ascii(original))
    return text + "\n" if original.endswith("\n") else text


def _escapes_non_ascii(text: str) -> bool:
    """Whether the original wrote non-ASCII as `\\uXXXX` (Python's json default) rather than as is
    (Jupyter's): it has such escapes and no raw non-ASCII character."""
    return "\\u" in text and all(ord(char) < 128 for char in text)
