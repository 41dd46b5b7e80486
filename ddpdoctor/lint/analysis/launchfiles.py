"""How the project is launched, read from its launch files: shell scripts, SLURM batch files,
Makefiles, YAML/JSON configs and README command lines. Read as text, never executed.

A training script does not say how many nodes or processes run it; its launch lines do:
`torchrun --nnodes 2 --nproc-per-node 8 train.py`, `horovodrun -np 8 -H a:4,b:4 python train.py`,
`#SBATCH --nodes=2` above `srun python train.py`, `deepspeed --num_nodes 2 train.py`. Each line
that runs a Python file becomes a `Launch`: the launcher, the node count and process count it
asks for (None where it does not say, or says it through a variable), and the file and line it is
on, for a message to name. A rule whose truth depends on the launch asks `node_verdict` for the
launches of the file it lints.

Where it stops: a value given through a shell variable (`--nnodes $NNODES`) or a config file the
line names (`accelerate launch --config_file`, `deepspeed --hostfile`) is unknown, not guessed;
only the launch files under the project's top folder are read (a bounded number, a bounded size,
a few folders deep). What was read is recorded for the result cache: each launch file's content and
each folder's listing of launch files, so adding, editing or removing one re-analyses.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from ddpdoctor.lint.analysis.imports import MemoCycle, ProjectSources

MAX_FILES = 300
MAX_FILE_BYTES = 256 * 1024
MAX_DEPTH = 4

# The verdicts of `node_verdict`.
MULTI_NODE = "multi-node"
SINGLE_NODE = "single-node"
UNKNOWN = "unknown"

_TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_LAUNCHER_WORDS = re.compile(
    r"\b(torchrun|torch\.distributed\.(?:run|launch)|horovodrun|mpirun|mpiexec|srun|deepspeed|accelerate|python[0-9.]*)\b"
)


@dataclass(frozen=True)
class Launch:
    """One command line that runs a Python file."""

    path: Path  # the launch file
    line: int
    launcher: str  # "torchrun", "horovodrun", "mpirun", "srun", "deepspeed", "accelerate", "python"
    nodes: Optional[int]  # the node count it asks for (the largest of an elastic range); None: not known
    processes: Optional[int]  # the total process count, when known
    script: str  # the Python file as written on the line (`-m pkg.train` as `pkg/train.py`)

    @property
    def spans_nodes(self) -> bool:
        return self.nodes is not None and self.nodes > 1

    @property
    def one_process(self) -> bool:
        return self.nodes == 1 and self.processes == 1

    def where(self) -> str:
        """`scripts/run.sh line 3` (relative to the working directory, as messages name files)."""
        try:
            shown = os.path.relpath(self.path)
        except ValueError:
            shown = str(self.path)
        return f"{shown} line {self.line}"


def read_launches(path: Path, text: str) -> list[Launch]:
    """The launches on the lines of one launch file's text (pure: no file is read)."""
    header_nodes, header_tasks = _batch_header(text)
    out: list[Launch] = []
    for line_no, line in _logical_lines(text):
        launch = _parse_line(path, line_no, line, header_nodes, header_tasks)
        if launch is not None:
            out.append(launch)
    return out


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, text) with backslash continuations joined; comment lines of a shell file
    are kept (a README's `# torchrun ...` is no comment), `#SBATCH` headers are read separately."""
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        if not pending:
            start = number
        stripped = raw.rstrip()
        if stripped.endswith("\\"):
            pending.append(stripped[:-1])
            continue
        pending.append(stripped)
        yield start, " ".join(pending)
        pending = []
    if pending:
        yield start, " ".join(pending)


_SBATCH = re.compile(r"^\s*#SBATCH\s+(.*)$", re.MULTILINE)


def _batch_header(text: str) -> tuple[Optional[int], Optional[int]]:
    """The node and task counts a SLURM batch file's `#SBATCH` lines ask for (None: not said)."""
    nodes: Optional[int] = None
    tasks: Optional[int] = None
    per_node: Optional[int] = None
    for match in _SBATCH.finditer(text):
        options = _options(_split(match.group(1)))
        nodes = _first_int(options, "--nodes", "-N") or nodes
        tasks = _first_int(options, "--ntasks", "-n") or tasks
        per_node = _first_int(options, "--ntasks-per-node") or per_node
    if tasks is None and per_node is not None:
        tasks = per_node * (nodes or 1)
    return nodes, tasks


def _split(line: str) -> list[str]:
    """Shell words; a quoted word holding spaces (a YAML `command: 'torchrun ...'`, a JSON string)
    is split again, so the command inside it is read too."""
    try:
        tokens = shlex.split(line, comments=False)
    except ValueError:  # an unbalanced quote (a YAML value, a Markdown sentence): words will do
        tokens = line.split()
    # Prose around a README's command (`python train.py`.) is not part of it.
    return [word.lstrip("`'\"([").rstrip("`'\",;:)].") or word for token in tokens for word in token.split()]


def _options(tokens: list[str]) -> dict[str, str]:
    """`--opt=value`, `--opt value`, `-np 4`, `-N2` -> {option: value} (flags map to "")."""
    out: dict[str, str] = {}
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token.startswith("-") and len(token) > 1:
            if "=" in token:
                name, _, value = token.partition("=")
                out.setdefault(name, value)
            elif index + 1 < len(tokens) and not tokens[index + 1].startswith("-"):
                out.setdefault(token, tokens[index + 1])
                index += 1
            elif re.fullmatch(r"-[A-Za-z]\d+", token):
                out.setdefault(token[:2], token[2:])
            else:
                out.setdefault(token, "")
        index += 1
    return out


def _count(value: Optional[str]) -> Optional[int]:
    """A count as written: `2`, `1:4` (an elastic range: its upper bound); None for `$NNODES`."""
    if value is None:
        return None
    value = value.strip().strip("'\"")
    if ":" in value:
        value = value.rpartition(":")[2]
    return int(value) if value.isdigit() else None


def _first_int(options: dict[str, str], *names: str) -> Optional[int]:
    for name in names:
        if name in options:
            return _count(options[name])
    return None


def _script_token(tokens: list[str]) -> Optional[tuple[int, str]]:
    """The Python file a command runs (its index and name): the first `*.py` token, or
    `-m pkg.mod` as `pkg/mod.py` (torch's own launcher modules are not the script)."""
    for index, token in enumerate(tokens):
        if token == "-m" and index + 1 < len(tokens):
            module = tokens[index + 1]
            if module in _TORCHRUN_MODULES:
                continue
            if all(part.isidentifier() for part in module.split(".")):
                return index, module.replace(".", "/") + ".py"
        if token.endswith(".py") and not token.startswith("-"):
            return index, token.split("=")[-1]
    return None


def _parse_line(
    path: Path, line_no: int, line: str, header_nodes: Optional[int], header_tasks: Optional[int]
) -> Optional[Launch]:
    if not _LAUNCHER_WORDS.search(line):
        return None
    tokens = _split(line)
    found = _script_token(tokens)
    if found is None:
        return None
    script_at, script = found
    before = tokens[:script_at]
    names = [os.path.basename(t) for t in before]
    options = _options(before)

    def has(word: str) -> bool:
        return word in names or any(t.startswith(word) for t in names)

    nodes: Optional[int]
    processes: Optional[int]
    if "torchrun" in names or any(m in before for m in _TORCHRUN_MODULES):
        launcher = "torchrun"
        nodes = _first_int(options, "--nnodes") if "--nnodes" in options else 1
        per_node = _first_int(options, "--nproc-per-node", "--nproc_per_node")
        if ("--nproc-per-node" not in options and "--nproc_per_node" not in options):
            per_node = 1
        processes = nodes * per_node if nodes is not None and per_node is not None else None
        nodes = nodes if not ("srun" in names and header_nodes) else header_nodes
    elif "horovodrun" in names:
        launcher = "horovodrun"
        processes = _first_int(options, "-np", "--num-proc")
        hosts = options.get("-H", options.get("--hosts"))
        if hosts is not None:
            nodes = len([h for h in hosts.split(",") if h]) if "$" not in hosts else None
        elif "--hostfile" in options or "-hostfile" in options:
            nodes = None
        else:
            nodes = 1  # localhost only
    elif "mpirun" in names or "mpiexec" in names:
        launcher = "mpirun"
        processes = _first_int(options, "-np", "-n", "--np")
        hosts = options.get("-H", options.get("--host", options.get("-host")))
        nodes = len([h for h in hosts.split(",") if h]) if hosts is not None and "$" not in hosts else None
        if nodes is None and header_nodes is not None:
            nodes = header_nodes
    elif "deepspeed" in names:
        launcher = "deepspeed"
        nodes = _first_int(options, "--num_nodes", "--num-nodes")
        per_node = _first_int(options, "--num_gpus", "--num-gpus")
        if nodes is None and not any(o in options for o in ("--hostfile", "-H", "--include", "-i")):
            nodes = 1 if per_node is not None else None
        processes = nodes * per_node if nodes is not None and per_node is not None else None
    elif "accelerate" in names and "launch" in before:
        launcher = "accelerate"
        nodes = _first_int(options, "--num_machines", "--num-machines")
        processes = _first_int(options, "--num_processes", "--num-processes")
    elif has("srun"):
        launcher = "srun"
        nodes = _first_int(options, "--nodes", "-N") or header_nodes
        processes = _first_int(options, "--ntasks", "-n") or header_tasks
    elif any(re.fullmatch(r"python[0-9.]*", n) for n in names):
        launcher = "python"
        if header_nodes is not None or header_tasks is not None:
            nodes, processes = header_nodes, header_tasks  # run by each task of a batch job
        else:
            nodes, processes = 1, 1
    else:
        return None
    return Launch(path, line_no, launcher, nodes, processes, script)


# ------------------------------------------------------------------------------- the project's files


def launch_files(project: ProjectSources, top: Path) -> list[Path]:
    """The launch files under a project's top folder: a bounded walk, depth first in sorted order,
    no hidden folders, virtual environments or data folders. Each folder's listing is recorded as a
    dependency (`ProjectSources.launch_listing`): a launch file added later re-analyses."""
    found: list[Path] = []

    def walk(folder: Path, depth: int) -> None:
        files, folders = project.launch_listing(folder)
        found.extend(folder / name for name in files)
        if depth < MAX_DEPTH:
            for name in folders:
                if len(found) >= MAX_FILES:
                    return
                walk(folder / name, depth + 1)

    walk(top, 0)
    return found[:MAX_FILES]


def _nearby_launch_files(project: ProjectSources, script: Path, top: Path) -> list[Path]:
    """The launch files in the script's own folder and each folder above it up to the top (read
    first: a large project's walk may reach its bound before the script's folder)."""
    out: list[Path] = []
    folder = script.parent
    for _ in range(MAX_DEPTH + 4):
        out.extend(folder / name for name in project.launch_listing(folder)[0])
        if folder == top or folder.parent == folder:
            break
        folder = folder.parent
    return out


def project_launches(project: Optional[ProjectSources], script: Path) -> list[Launch]:
    """The launches in the project's launch files that run `script`: the file a line names, taken
    from the launch file's folder or from the project's top (where such commands are run), is
    `script`; or the line names it by two or more trailing path components (`tools/train.py` for
    `.../tools/train.py`, whatever folder the command runs in). Empty without a project (a
    snippet, stdin without a name)."""
    if project is None:
        return []
    top = project.top_of(script)
    if top is None:
        return []

    target = Path(os.path.abspath(script))

    def compute() -> list[Launch]:
        out: list[Launch] = []
        for path in dict.fromkeys(_nearby_launch_files(project, target, top) + launch_files(project, top)):
            out.extend(project.memo(("launch-file", path), functools.partial(_read_file, project, path)))
        return out

    try:
        launches: list[Launch] = project.memo(("launch-files", top, target.parent), compute)
    except MemoCycle:
        return []
    return [launch for launch in launches if _names(launch, target, top)]


def _read_file(project: ProjectSources, path: Path) -> list[Launch]:
    data = project.read_launch_file(path, MAX_FILE_BYTES)
    return read_launches(path, data.decode("utf-8", "replace")) if data is not None else []


def _names(launch: Launch, script: Path, top: Path) -> bool:
    written = launch.script.replace("\\", "/")
    if "$" in written or "{" in written:
        return False
    for base in (launch.path.parent, top):
        if Path(os.path.normpath(base / written)) == script:
            return True
    parts = [p for p in Path(written).parts if p not in (".", "..", "/")]
    return len(parts) >= 2 and tuple(parts) == script.parts[-len(parts):]


def node_verdict(launches: list[Launch]) -> tuple[str, Optional[Launch]]:
    """MULTI_NODE with the first launch that spans nodes; SINGLE_NODE (with the first launch) when
    every launch is known to stay on one node; UNKNOWN (None) when there is none, or some launch's
    node count is not known."""
    for launch in launches:
        if launch.spans_nodes:
            return MULTI_NODE, launch
    if launches and all(launch.nodes == 1 for launch in launches):
        return SINGLE_NODE, launches[0]
    return UNKNOWN, None


def multi_process_launch(launches: list[Launch]) -> Optional[Launch]:
    """A launch that starts several processes, or uses a launcher that starts one per GPU or task
    whatever count it is given (a launcher is a claim that the script runs as several processes)."""
    for launch in launches:
        if launch.processes is not None and launch.processes > 1:
            return launch
        if launch.launcher != "python" and launch.processes is None:
            return launch
    return None
