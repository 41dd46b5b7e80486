"""Launch facts read from a project's launch files (shell, SLURM, Makefile, YAML, README): each
line that runs a Python file, with its launcher, node count and process count. Never executed."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pytest

from ddpdoctor.lint.analysis.imports import ProjectSources
from ddpdoctor.lint.analysis.launchfiles import (
    MULTI_NODE,
    SINGLE_NODE,
    UNKNOWN,
    multi_process_launch,
    node_verdict,
    project_launches,
    read_launches,
)


def one(text: str, name: str = "run.sh") -> tuple[str, Optional[int], Optional[int], str]:
    (launch,) = read_launches(Path(name), text)
    return launch.launcher, launch.nodes, launch.processes, launch.script


@pytest.mark.parametrize(
    "line, expected",
    [
        ("torchrun --nnodes 2 --nproc-per-node 8 train.py --epochs 3", ("torchrun", 2, 16, "train.py")),
        ("torchrun --nnodes=1:4 --nproc_per_node=4 scripts/train.py", ("torchrun", 4, 16, "scripts/train.py")),
        ("torchrun --nproc-per-node 4 train.py", ("torchrun", 1, 4, "train.py")),
        ("torchrun train.py", ("torchrun", 1, 1, "train.py")),
        ("python -m torch.distributed.launch --nproc_per_node=8 --use_env train.py", ("torchrun", 1, 8, "train.py")),
        ("python -m torch.distributed.run --nnodes $NNODES --nproc_per_node 8 train.py", ("torchrun", None, None, "train.py")),
        ("horovodrun -np 8 -H node1:4,node2:4 python train.py", ("horovodrun", 2, 8, "train.py")),
        ("horovodrun -np 4 python train.py", ("horovodrun", 1, 4, "train.py")),
        ("horovodrun -np 16 --hostfile hosts python train.py", ("horovodrun", None, 16, "train.py")),
        ("mpirun -np 8 -H a:4,b:4 python train.py", ("mpirun", 2, 8, "train.py")),
        ("mpirun -np 8 python train.py", ("mpirun", None, 8, "train.py")),
        ("srun --nodes=2 --ntasks=16 python train.py", ("srun", 2, 16, "train.py")),
        ("srun -N 2 python -u train.py", ("srun", 2, None, "train.py")),
        ("deepspeed --num_gpus 1 train.py --deepspeed ds.json", ("deepspeed", 1, 1, "train.py")),
        ("deepspeed --num_nodes 2 --num_gpus 8 --hostfile hosts train.py", ("deepspeed", 2, 16, "train.py")),
        ("deepspeed --hostfile hosts train.py", ("deepspeed", None, None, "train.py")),
        ("accelerate launch --num_machines 2 --num_processes 16 train.py", ("accelerate", 2, 16, "train.py")),
        ("accelerate launch train.py", ("accelerate", None, None, "train.py")),
        ("python train.py --lr 0.1", ("python", 1, 1, "train.py")),
        ("python3 -m pkg.train --lr 0.1", ("python", 1, 1, "pkg/train.py")),
        ("CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc_per_node=2 \\\n    train.py \\\n    --lr 0.1", ("torchrun", 1, 2, "train.py")),
        ("    command: 'torchrun --nnodes 2 --nproc-per-node 4 tools/train.py'", ("torchrun", 2, 8, "tools/train.py")),
    ],
)
def test_each_launcher_line_is_read(line: str, expected: tuple[str, Optional[int], Optional[int], str]) -> None:
    assert one(line) == expected


def test_lines_that_launch_nothing_are_skipped() -> None:
    text = "pip install torch\necho python is great\ntorchrun --help\n# Run the tests with pytest.\n"
    assert read_launches(Path("README.md"), text) == []


def test_a_slurm_header_gives_its_counts_to_the_lines_below() -> None:
    text = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n#SBATCH -J job\nsrun python train.py\n"
    (launch,) = read_launches(Path("job.slurm"), text)
    assert (launch.launcher, launch.nodes, launch.processes, launch.line) == ("srun", 2, 8, 5)
    (plain,) = read_launches(Path("job.sbatch"), "#SBATCH -N 1\n#SBATCH --ntasks=1\npython train.py\n")
    assert (plain.nodes, plain.processes) == (1, 1)


def test_verdicts() -> None:
    def launches(*lines: str) -> list:
        return [launch for line in lines for launch in read_launches(Path("run.sh"), line)]

    assert node_verdict(launches("torchrun --nproc_per_node 8 train.py", "torchrun --nnodes 2 train.py"))[0] == MULTI_NODE
    verdict, cited = node_verdict(launches("torchrun --nproc_per_node 8 train.py", "python train.py"))
    assert verdict == SINGLE_NODE and cited is not None and cited.line == 1
    assert node_verdict(launches("torchrun --nproc_per_node 8 train.py", "mpirun -np 8 python train.py"))[0] == UNKNOWN
    assert node_verdict([]) == (UNKNOWN, None)
    assert multi_process_launch(launches("python train.py")) is None
    assert multi_process_launch(launches("python train.py", "torchrun --nproc_per_node 2 train.py")) is not None
    assert multi_process_launch(launches("accelerate launch train.py")) is not None  # the launcher is the claim


def test_the_project_launch_files_for_one_script(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools/train.py").write_text("")
    (tmp_path / "tools/eval.py").write_text("")
    (tmp_path / "scripts/multi.sh").write_text("torchrun --nnodes 2 --nproc-per-node 4 tools/train.py\n")
    (tmp_path / "README.md").write_text("Evaluate with `python tools/eval.py`.\n\n    python other/train.py\n")
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules/x.sh").write_text("torchrun --nnodes 9 tools/eval.py\n")
    project = ProjectSources.for_paths([tmp_path / "tools/train.py"])
    with project.scope():
        train = project_launches(project, tmp_path / "tools/train.py")
        assert project.dependencies()[tmp_path / "scripts/multi.sh"]  # an edit re-analyses train.py
    assert [(l.launcher, l.nodes, l.where().endswith("multi.sh line 1")) for l in train] == [("torchrun", 2, True)]
    evaluation = project_launches(project, tmp_path / "tools/eval.py")
    assert [(l.launcher, l.nodes) for l in evaluation] == [("python", 1)]  # not node_modules' line
    assert project_launches(None, tmp_path / "tools/train.py") == []


FIXTURES = Path(__file__).resolve().parent.parent / "fixtures/projects"


def _model(path: Path):  # type: ignore[no-untyped-def]
    import libcst as cst

    from ddpdoctor.lint.analysis import build_analysis

    return build_analysis(cst.parse_module(path.read_text()), str(path), project=ProjectSources.for_paths([path]))


def test_the_launch_queries_rules_ask(tmp_path: Path) -> None:
    """launch.launch_file_nodes / launch_file_processes: the verdict and the launch relied on (for
    DDP004, DDP008 and rules whose truth depends on how many nodes or processes run a script)."""
    from ddpdoctor.lint.analysis import launch

    (tmp_path / "pyproject.toml").write_text("")
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    assert launch.launch_file_nodes(_model(script)) == (UNKNOWN, None)
    assert launch.launch_file_processes(_model(script)) == (UNKNOWN, None)
    (tmp_path / "README.md").write_text("```\npython train.py\n```\n")
    verdict, cited = launch.launch_file_processes(_model(script))
    assert verdict == launch.ONE_PROCESS and cited is not None and cited.where().endswith("README.md line 2")
    assert launch.launch_file_nodes(_model(script))[0] == SINGLE_NODE
    (tmp_path / "run.sh").write_text("torchrun --nproc_per_node 4 train.py\n")
    assert launch.launch_file_processes(_model(script))[0] == launch.SEVERAL_PROCESSES
    (tmp_path / "multi.slurm").write_text("#SBATCH --nodes=4\nsrun python train.py\n")
    verdict, cited = launch.launch_file_processes(_model(script))
    assert verdict == MULTI_NODE and cited is not None and cited.nodes == 4
    assert launch.launch_file_nodes(_model(script))[1] == cited


def test_rules_name_the_launch_file_they_relied_on() -> None:
    from ddpdoctor.config import Settings
    from ddpdoctor.lint.engine import lint_paths

    def messages(project: str) -> list[str]:
        run, _ = lint_paths([str(FIXTURES / project)], Settings(select=("ALL",)), jobs=1, use_cache=False)
        return [f.message for f in run.findings]

    (ddp008,) = messages("local_rank_save_guard_multi_node_launch")
    assert "job.slurm line 8 launches it on 2 nodes" in ddp008
    assert all("Makefile line 2 launches it on 2 nodes" in m for m in messages("global_rank_device_two_node_launch"))
