"""Worker entry for external launchers (one rank):

    torchrun --nproc-per-node 4 -m ddpdoctor.probe
    horovodrun -np 4 python -m ddpdoctor.probe --framework horovod
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

from ddpdoctor.probe import results as R
from ddpdoctor.probe.registry import FRAMEWORKS, HOROVOD, TORCH
from ddpdoctor.probe.worker import config_from_environment, run_torch_rank


def main(argv: Optional[list[str]] = None) -> None:
    """`python -m ddpdoctor.probe` under an external launcher (torchrun, horovodrun, SLURM srun)."""
    import argparse

    from ddpdoctor.probe.options import OptionError, parse_checks, parse_faults_option
    parser = argparse.ArgumentParser(prog="python -m ddpdoctor.probe", description="ddpdoctor probe worker (one rank)")
    parser.add_argument("--framework", choices=FRAMEWORKS, default=None)
    parser.add_argument("--backend", choices=("auto", "nccl", "gloo"), default=None)
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default=None)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--inject-fault", action="append", default=[])
    parser.add_argument("--checks", default=None)
    parser.add_argument("--format", choices=("text", "json"), default=None)
    args = parser.parse_args(argv)
    framework = args.framework or (HOROVOD if "HOROVOD_RANK" in os.environ else TORCH)
    config = config_from_environment().with_(framework=framework)
    try:
        changes: dict[str, Any] = {}
        for key in ("backend", "device", "timeout"):
            if getattr(args, key) is not None:
                changes[key] = getattr(args, key)
        if args.format is not None:
            changes["output_format"] = args.format
        if args.inject_fault:
            changes["faults"] = parse_faults_option(args.inject_fault)
        changes["checks"] = parse_checks(args.checks, framework)
        config = config.with_(**changes)
    except OptionError as exc:
        print(f"ddpdoctor.probe: {exc}", file=sys.stderr)
        sys.exit(R.EXIT_COULD_NOT_RUN)
    if framework == HOROVOD:
        from ddpdoctor.probe.hvd_worker import external_horovod_rank

        sys.exit(external_horovod_rank(config))
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            print(f"ddpdoctor.probe: {var} is not set; run under a launcher (torchrun --nproc-per-node N -m ddpdoctor.probe) "
                  "or use `ddpdoctor probe --nproc N`", file=sys.stderr)
            sys.exit(R.EXIT_COULD_NOT_RUN)
    sys.exit(run_torch_rank(config))


if __name__ == "__main__":
    main()
