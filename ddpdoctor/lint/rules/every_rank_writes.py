"""DDP017 every-rank-writes: a shared file or folder written by every rank at once."""

from __future__ import annotations

from ddpdoctor.lint.analysis import launch, shared_writes
from ddpdoctor.lint.rules.base import Rule


class EveryRankWrites(Rule):
    """
    Valid:
        dist.init_process_group("nccl")
        if dist.get_rank() == 0:
            model.module.save_pretrained(output_dir)
    Invalid:
        dist.init_process_group("nccl")
        model.module.save_pretrained(output_dir)
    """

    code = "DDP017"
    checks_test_suites = False
    trigger_words = ("save_pretrained", "np.save", "numpy", "open(", "mkdir", "makedirs", "download")
    # A torchrun script may leave the process group to a framework (the HF Trainer) and only read
    # the launcher's variables.
    context_words = (*launch.LAUNCH_WORDS, "LOCAL_RANK", "WORLD_SIZE")

    def check(self) -> None:
        model = self.model
        writes = shared_writes.every_rank_writes(model)
        evidence = shared_writes.launched_as_ranks(model) if writes else None
        if evidence is None:
            return
        where = f"{evidence[1]} at line {self.line(evidence[0])}"
        for write in writes:
            if write.kind == "download":
                message = (
                    f"{write.what} runs on every rank of this distributed script ({where}): every process "
                    f"downloads and extracts the same files into the same folder at once, and a rank can read "
                    f"them half-written. Download on the main process first: `if rank != 0: dist.barrier()` "
                    f"before it and `if rank == 0: dist.barrier()` after it (or download once before launching)."
                )
            elif write.kind == "mkdir":
                tolerant = "path.mkdir(parents=True, exist_ok=True)" if write.what == "Path.mkdir" else "os.makedirs(path, exist_ok=True)"
                message = (
                    f"{write.what} after an exists check runs on every rank of this distributed script "
                    f"({where}): between one rank's check and its mkdir another rank creates the folder, and the "
                    f"mkdir fails with FileExistsError. Use {tolerant}, or make it on the main process only."
                )
            else:
                message = (
                    f"{write.what} runs on every rank of this distributed script ({where}) and writes the same "
                    f"path on each: the writes interleave or truncate each other and can leave the file corrupt. "
                    f"Write only on the main process (`if dist.get_rank() == 0:`, `if trainer.is_world_process_zero():`), "
                    f"or put the rank in the path."
                )
            self.report(write.call.node, message)
