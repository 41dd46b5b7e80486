"""Worker entry for external launchers: `torchrun --nproc-per-node 4 -m ddpdoctor.probe`."""

from ddpdoctor.probe.worker import main

if __name__ == "__main__":
    main()
