"""The analysis layer: what the rules know about the code, layered bottom-up.

    syntax     dotted names, walks, literals, canonical torch names (imports nothing of ddpdoctor)
    imports    the project's own modules: import resolution, lazy parsing (ProjectSources)
    model      one module: bindings, values per path, loops, calls, functions, guards, and the
               link from a call to a function of another project module (`linked_function`)
    collectives which calls every rank of a group must enter
    conditions whether two branch conditions are one test, opposite tests or unrelated, also across
               a call (the callee's test of a parameter read as the caller's test of the argument)
    callorder  in which order statements run across a class's methods and the module's helpers
    lazy       nn.Lazy* layers a module value holds, and whether a forward materialised them
    stepping   which call steps an optimizer, under which accumulation condition, what clears its gradients
    reads      where the value a call builds is read, through the one name it is bound to
    launchfiles how the project is launched: torchrun/horovodrun/srun/sbatch/deepspeed/accelerate
               lines in its shell, SLURM, Makefile, YAML/JSON and README files (read, never run)
    harness    test-suite detection
    launch     launch evidence: is this one of several processes; what the launcher's environment says
    ranks      who runs this: all ranks / rank 0 / the others / a subset / single-process only
    launcher_env what a launcher sets in each process's environment, against literals the script writes
    devices    which GPU a value names; what pins a process's device
    divergence where ranks part ways: exits taken on some ranks while the others go on into a collective
    summaries  what a function does for its callers, linked across the project's modules: the one
               place a rule asks a cross-module question (what a call of another module's function,
               a project class's method or a holder object does)
    sharding   data split across ranks: datasets that take their own rank's share, loop items
    evaluation evaluations over split data, and whether their score is combined across ranks
    rank_arguments  the rank a process group or sampler is given; jobs single-node by construction
    shared_writes   files and folders every rank writes at once

Nothing below imports anything above (tests/test_analysis_layering.py enforces it). Rules import
only from this package.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ddpdoctor.lint.analysis import callorder, collectives, conditions, devices, divergence, harness, launch, launcher_env, launchfiles, lazy, ranks, reads, sharding, stepping, summaries, syntax
from ddpdoctor.lint.analysis import checkpoint_loads, evaluation, rank_arguments, shared_writes
from ddpdoctor.lint.analysis.imports import ProjectSources
from ddpdoctor.lint.analysis.model import (
    MAX_DEPTH,
    Assignment,
    Call,
    Context,
    Function,
    Guard,
    Loop,
    ModuleModel,
    Route,
    SubscriptStore,
)
from ddpdoctor.lint.analysis.ranks import Runs, WhoRuns, decided_by_guards, reaches_several_processes, route_runs, who_runs
from ddpdoctor.lint.analysis.syntax import UNKNOWN, Expr, contains, dotted_name, names_in, walk

__all__ = [
    "MAX_DEPTH", "UNKNOWN", "Assignment", "Call", "Context", "Expr", "Function", "Guard", "Loop",
    "ModuleModel", "ProjectSources", "Route", "Runs", "SubscriptStore", "WhoRuns", "build_analysis",
    "callorder", "checkpoint_loads", "collectives", "conditions", "contains", "decided_by_guards", "devices", "divergence", "dotted_name", "evaluation", "harness", "launch", "launcher_env", "launchfiles", "lazy", "names_in", "rank_arguments", "ranks",
    "reaches_several_processes", "reads", "route_runs", "sharding", "shared_writes", "stepping", "summaries", "syntax", "walk", "who_runs",
]


def build_analysis(
    module: cst.Module,
    path: str = "<string>",
    *,
    world_size: Optional[int] = None,
    project: Optional[ProjectSources] = None,
) -> ModuleModel:
    """The analysis of one parsed module, as the rules query it. With `project`, the modules it
    imports from the project are read (lazily, once per run) when a question crosses into them."""
    return ModuleModel.build(module, path, world_size, project)
