"""GRD007 in the rank: is this rank's model and current CUDA device its local rank's GPU?

`query` is the only place that asks CUDA anything; tests without a GPU replace it with a fake,
and everything above it runs for real.
"""

from __future__ import annotations

from typing import Any, Optional


class CudaQuery:
    def available(self) -> bool:
        import torch

        return bool(torch.cuda.is_available())

    def device_count(self) -> int:
        import torch

        return int(torch.cuda.device_count())

    def current_device(self) -> int:
        import torch

        return int(torch.cuda.current_device())

    def index_of(self, tensor: Any) -> Optional[int]:
        """The CUDA index a tensor lives on, None when it is not on a GPU."""
        device = tensor.device
        return int(device.index if device.index is not None else 0) if device.type == "cuda" else None


query = CudaQuery()


def wrong_device(module: Any, local_rank: Optional[int], local_world_size: Optional[int]) -> Optional[str]:
    """A sentence saying what is wrong, or None.

    Silent when it cannot be sure: no CUDA, no local rank, a model not on a GPU, or each process
    seeing fewer GPUs than there are local ranks (CUDA_VISIBLE_DEVICES narrowed per rank, where
    cuda:0 is right for everyone).
    """
    if local_rank is None or not query.available():
        return None
    count = query.device_count()
    if count <= 1 or count < (local_world_size or 1) or local_rank >= count:
        return None
    model_index: Optional[int] = None
    for parameter in module.parameters():
        model_index = query.index_of(parameter)
        break
    if model_index is None:
        return None
    current = query.current_device()
    problems = []
    if model_index != local_rank:
        problems.append(f"its model is on cuda:{model_index}")
    if current != local_rank:
        problems.append(f"its current device is cuda:{current}")
    if not problems:
        return None
    return (
        f"local rank {local_rank} should use cuda:{local_rank}, but {' and '.join(problems)}: two ranks share "
        f"a GPU (or one idles); call torch.cuda.set_device(local_rank) and move the model to that device"
    )
