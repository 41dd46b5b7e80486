"""What this machine's torch, CUDA, NCCL and NVML say, as one JSON line (scripts/gpu-check's first step).

Runs without a GPU too: then it says so, and gpu-check skips the steps that need one.
"""

import json
import platform


def torch_facts():
    try:
        import torch
    except ImportError as error:
        return {"torch_error": str(error)}
    facts = {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
             "cuda_available": bool(torch.cuda.is_available()), "device_count": 0, "devices": []}
    import torch.distributed as dist

    facts["nccl_available"] = bool(dist.is_available() and dist.is_nccl_available())
    if facts["cuda_available"]:
        facts["device_count"] = torch.cuda.device_count()
        facts["cudnn"] = torch.backends.cudnn.version()
        try:
            facts["nccl"] = ".".join(str(part) for part in torch.cuda.nccl.version())
        except Exception as error:  # noqa: BLE001 - a figure, not a verdict
            facts["nccl"] = f"unknown ({error})"
        for index in range(facts["device_count"]):
            props = torch.cuda.get_device_properties(index)
            facts["devices"].append({"index": index, "name": props.name, "capability": f"{props.major}.{props.minor}",
                                     "memory_GiB": round(props.total_memory / 2**30, 1)})
    return facts


def nvml_facts():
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as error:  # noqa: BLE001 - no driver is an answer, not a failure
        return {"nvml_error": str(error) or type(error).__name__}
    try:
        def text(value):
            return value.decode() if isinstance(value, bytes) else str(value)

        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        facts = {"driver": text(pynvml.nvmlSystemGetDriverVersion()), "nvml": text(pynvml.nvmlSystemGetNVMLVersion()),
                 "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}", "nvml_gpus": []}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            facts["nvml_gpus"].append({"index": index, "name": text(pynvml.nvmlDeviceGetName(handle)),
                                       "bus_id": text(pynvml.nvmlDeviceGetPciInfo(handle).busId)})
        return facts
    finally:
        pynvml.nvmlShutdown()


if __name__ == "__main__":
    print(json.dumps({"python": platform.python_version(), **torch_facts(), **nvml_facts()}))
