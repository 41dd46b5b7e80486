"""Checkpoints restored without map_location by another project module's function, asked directly:
which loads of a helper's body count, and which calls of a script reach one (star imports included)."""

from __future__ import annotations

import pathlib
import textwrap

import libcst as cst
import pytest

from ddpdoctor.lint.analysis import ProjectSources, build_analysis, checkpoint_loads


def bare_load_line(body: str) -> int | None:
    source = "import torch\ndef restore(path, model, sched):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    model = build_analysis(cst.parse_module(source))
    helper = next(f for f in model.functions if f.name == "restore")
    load = checkpoint_loads.bare_restoring_load(model, helper)
    return None if load is None else model.line_of(load.node) - 2


@pytest.mark.parametrize(
    "body, expected",
    [
        ("model.load_state_dict(torch.load(path))", 1),
        ("ckpt = torch.load(path)\nmodel.load_state_dict(ckpt['model'])", 1),
        ("ckpt = torch.load(path)\nmodel.load_state_dict(ckpt['model'].float().state_dict())", 1),
        ("ckpt = torch.load(path)\nmodel.module.load_state_dict(ckpt.get('model'))", 1),
        # mapped, or possibly mapped through what is passed along
        ("model.load_state_dict(torch.load(path, map_location='cpu'))", None),
        ("model.load_state_dict(torch.load(path, 'cpu'))", None),
        ("model.load_state_dict(torch.load(path, **kw))", None),
        # data, not restored; a scheduler's plain numbers; returned for the caller to restore
        ("vocab = torch.load(path)\nreturn vocab", None),
        ("sched.load_state_dict(torch.load(path))", None),
        ("return torch.load(path)", None),
        # a rank check inside decides who loads
        ("if torch.distributed.get_rank() == 0:\n    model.load_state_dict(torch.load(path))", None),
    ],
)
def test_bare_restoring_load(body: str, expected: int | None) -> None:
    assert bare_load_line(body) == expected


HELPERS = """\
import torch
def restore(path, model):
    model.load_state_dict(torch.load(path))
def restore_mapped(path, model):
    model.load_state_dict(torch.load(path, map_location="cpu"))
"""


@pytest.mark.parametrize(
    "imports, calls, expected",
    [
        ("from helpers import *", "restore(p, m)", ["restore"]),
        ("from helpers import restore", "restore(p, m)", ["restore"]),
        ("import helpers", "helpers.restore(p, m)", ["restore"]),
        ("from helpers import *", "restore_mapped(p, m)", []),
        # only on rank 0; a local function of the same name shadows the star import
        ("from helpers import *", "if dist.get_rank() == 0:\n    restore(p, m)", []),
        ("from helpers import *\ndef restore(p, m):\n    pass", "restore(p, m)", []),
    ],
)
def test_helper_loads_across_modules(tmp_path: pathlib.Path, imports: str, calls: str, expected: list[str]) -> None:
    (tmp_path / "helpers.py").write_text(HELPERS)
    source = f"import torch.distributed as dist\n{imports}\np, m = 'w.pt', None\n{calls}\n"
    main = tmp_path / "train.py"
    main.write_text(source)
    model = build_analysis(cst.parse_module(source), str(main), project=ProjectSources.for_paths([tmp_path]))
    assert [found.helper.name for found in checkpoint_loads.helper_loads(model)] == expected


def test_a_star_import_links_only_names_it_may_provide(tmp_path: pathlib.Path) -> None:
    (tmp_path / "helpers.py").write_text(HELPERS)
    source = "from helpers import *\nimport os\nrestore('w.pt', None)\nprint(len('x'))\nos.getcwd()\n"
    main = tmp_path / "train.py"
    main.write_text(source)
    model = build_analysis(cst.parse_module(source), str(main), project=ProjectSources.for_paths([tmp_path]))
    linked = {c.dotted: model.linked_function(c) for c in model.calls}
    assert linked["restore"] is not None and linked["restore"][1].name == "restore"
    assert linked["print"] is None and linked["len"] is None and linked["os.getcwd"] is None
    assert not any(model.may_link(c) for c in model.calls if c.dotted in ("print", "len"))


def test_a_relative_star_import_is_not_followed(tmp_path: pathlib.Path) -> None:
    """A library's `from .api import *` re-exports its own API: not followed (as re-exports are not)."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text(HELPERS)
    source = "from .helpers import *\nrestore('w.pt', None)\n"
    main = package / "train.py"
    main.write_text(source)
    model = build_analysis(cst.parse_module(source), str(main), project=ProjectSources.for_paths([tmp_path]))
    assert [model.linked_function(c) for c in model.calls] == [None]
