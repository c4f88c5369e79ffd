#!/usr/bin/env python3
"""PyTorch peer of fsdp_bench: DistributedDataParallel over gloo, one process per rank, one
intra-op thread each, on the same decoder (bench/models/peer_torch.py's Model in the
bench_50m_config shape) and the same global batch split over the ranks: forward, next-token
cross-entropy, backward (DDP all-reduces the gradients), AdamW. Prints one JSON object with the
mean step time of the timed steps (the slowest rank's, after a warm-up step) and the last loss.

Usage: python3 fsdp_ddp_peer.py --ranks 2 --batch 8 --seq 32 --steps 3 --port 29500"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models"))
from peer_torch import CONFIGS, Model  # noqa: E402


def rank_main(rank, a, queue):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=a.ranks)
    torch.manual_seed(0)
    batch = torch.randint(CONFIGS["50m"]["vocab"], (a.batch, a.seq))
    rows = a.batch // a.ranks
    ids = batch[rank * rows:(rank + 1) * rows]
    torch.manual_seed(1)
    model = DistributedDataParallel(Model(CONFIGS["50m"]))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    positions = torch.arange(a.seq).expand_as(ids)
    mask = torch.ones_like(ids)
    times, loss = [], None
    for step in range(a.steps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        logits = model(ids, mask, positions)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if step > 0:
            times.append(elapsed.item())
    if rank == 0:
        queue.put({"mean_step_s": sum(times) / len(times), "loss": loss.item(), "ranks": a.ranks})
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--port", type=int, default=29500)
    a = ap.parse_args()
    if a.batch % a.ranks:
        sys.exit(f"--batch {a.batch} must be a multiple of --ranks {a.ranks}")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, a, queue)) for r in range(a.ranks)]
    for p in procs:
        p.start()
    result = queue.get()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            sys.exit(f"rank process exited with {p.exitcode}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
