"""Injected by `ddpdoctor guard` (its directory heads PYTHONPATH) into every Python process of the job.

It only registers import hooks; neither torch nor Horovod is imported here. When the process imports
torch.distributed, the guard wraps its collectives, and a rank starts reporting once it calls
init_process_group; when it imports horovod.torch, likewise Horovod's, from hvd.init() on. Whatever goes wrong, the user's job runs as it would unguarded. A
`sitecustomize` further down the path (a virtualenv's, a cluster's) still runs afterwards.
"""

import os
import sys


def _ddpdoctor_guard_bootstrap() -> None:
    if not os.environ.get("DDPDOCTOR_GUARD"):
        return
    try:
        from ddpdoctor.guard.hooks import watch_torch_distributed
        from ddpdoctor.guard.horovod import watch as watch_horovod
    except Exception:  # another interpreter, without ddpdoctor: stay out of the way
        return
    for watch in (watch_torch_distributed, watch_horovod):
        try:
            watch()
        except Exception:
            pass


def _ddpdoctor_chain_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    saved_path = sys.path[:]
    ours = sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        import sitecustomize  # type: ignore[import-not-found]  # noqa: F401  - the next one on the path, if any
    except ImportError as error:
        if error.name != "sitecustomize":
            raise
        if ours is not None:
            sys.modules["sitecustomize"] = ours
    finally:
        sys.path[:] = saved_path


_ddpdoctor_guard_bootstrap()
_ddpdoctor_chain_sitecustomize()
