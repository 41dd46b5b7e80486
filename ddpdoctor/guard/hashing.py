"""Hash parameters and buffers where they live: one integer per tensor, one small host copy per check.

Each tensor's bits are reinterpreted as integers and summed with position-dependent weights in
int64 (wrapping, so the result does not depend on the reduction order). Replicas that DDP keeps in
sync are bit-identical, so any difference in a bit shows.
"""

from __future__ import annotations

from typing import Any

import torch

_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_weights: dict[tuple[str, int], torch.Tensor] = {}


def _weights_for(numel: int, device: torch.device) -> torch.Tensor:
    key = (str(device), numel)
    cached = _weights.get(key)
    if cached is None:
        index = torch.arange(numel, dtype=torch.int64, device=device)
        cached = index * 0x9E3779B1 % 2147483647 + 1
        if len(_weights) > 512:
            _weights.clear()
        _weights[key] = cached
    return cached


def tensor_digest(tensor: torch.Tensor) -> torch.Tensor:
    """A 0-d int64 tensor on the tensor's own device."""
    flat = tensor.detach().reshape(-1)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.int8)
    elif flat.is_floating_point():
        flat = flat.view(_INT_OF_SIZE[flat.element_size()])
    ints = flat.to(torch.int64)
    return (ints * _weights_for(ints.numel(), ints.device)).sum()


def digests(tensors: list[Any]) -> list[int]:
    if not tensors:
        return []
    per_device: dict[str, list[torch.Tensor]] = {}
    order: list[tuple[str, int]] = []
    for tensor in tensors:
        key = str(tensor.device)
        bucket = per_device.setdefault(key, [])
        order.append((key, len(bucket)))
        bucket.append(tensor_digest(tensor))
    # One device-to-host transfer per device, of one int64 per tensor.
    host = {key: torch.stack(values).tolist() for key, values in per_device.items()}
    return [int(host[key][i]) for key, i in order]
