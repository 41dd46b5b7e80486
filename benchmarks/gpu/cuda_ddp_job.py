"""A small CUDA DDP training job for scripts/gpu-check, started by torchrun (under `ddpdoctor guard` or not).

Each rank prints one line `GPUCHECK-RESULT {json}`: its step times, the AMP facts (autocast dtype,
GradScaler scale, skipped steps) and whether its parameters equal rank 0's at the end.

Options plant what the guard must see:
  --all-on-gpu0      no torch.cuda.set_device(LOCAL_RANK): every rank's model on cuda:0 (GRD007)
  --claim-gpus N     the guard's CUDA query reports N GPUs. GRD007 is silent by design when a process
                     sees fewer GPUs than there are local ranks (CUDA_VISIBLE_DEVICES narrowed per
                     rank), so on a one-GPU machine it can only be exercised with the device count
                     claimed; everything else it reads (the model's device, the current device) is real
  --nudge-rank R     rank R changes one weight after --nudge-step: its replica diverges (GRD003)
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--all-on-gpu0", action="store_true")
    parser.add_argument("--claim-gpus", type=int, default=0)
    parser.add_argument("--nudge-rank", type=int, default=-1)
    parser.add_argument("--nudge-step", type=int, default=8)
    return parser.parse_args()


def claim_gpus(count):
    from ddpdoctor.guard import devices

    class Claimed(devices.CudaQuery):
        def device_count(self):
            return count

    devices.query = Claimed()


def main():
    args = parse()
    if args.claim_gpus:
        claim_gpus(args.claim_gpus)
    local_rank = int(os.environ["LOCAL_RANK"])
    if args.all_on_gpu0:
        device = torch.device("cuda", 0)
    else:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512)).to(device)
    if args.all_on_gpu0:
        model = DDP(net)  # the GRD007 line: the model on cuda:0 whatever the local rank
    else:
        model = DDP(net, device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cuda", enabled=args.amp)
    generator = torch.Generator(device=device).manual_seed(100 + rank)
    times, losses, skipped, autocast_dtype = [], [], 0, None
    for step in range(args.steps):
        x = torch.randn(64, 512, device=device, generator=generator)
        y = torch.randn(64, 512, device=device, generator=generator)
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=args.amp):
            out = model(x)
            autocast_dtype = str(out.dtype).replace("torch.", "")
            loss = nn.functional.mse_loss(out.float(), y)
        scale_before = scaler.get_scale() if args.amp else 1.0
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if args.amp and scaler.get_scale() < scale_before:
            skipped += 1  # inf/nan gradients: GradScaler skipped optimizer.step and lowered the scale
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
        if rank == args.nudge_rank and step == args.nudge_step:
            with torch.no_grad():
                net[0].weight[0, 0] += 1e-2
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    reference = flat.clone()
    dist.broadcast(reference, 0)
    result = {"rank": rank, "local_rank": local_rank, "device": str(device), "world_size": dist.get_world_size(),
              "backend": args.backend, "steps": args.steps, "step_ms_median": statistics.median(times[2:]) * 1e3,
              "first_step_ms": times[0] * 1e3, "loss_first": losses[0], "loss_last": losses[-1],
              "amp": args.amp, "autocast_dtype": autocast_dtype, "scale": scaler.get_scale() if args.amp else None,
              "skipped_steps": skipped, "matches_rank0": bool(torch.equal(flat, reference))}
    print("GPUCHECK-RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
