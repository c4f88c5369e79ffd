#!/usr/bin/env python3
"""PyTorch twin of mixed_precision_bench: peer_torch.py's decoder (the same Llama shape, tied
embeddings) on the ~110M shape, one actor update step per request: forward under
torch.autocast("cpu", dtype=torch.bfloat16), float32 log-probs of the response tokens, verl's
vanilla PPO loss (token-mean, clip 0.2, on-policy old log-probs), backward, float32 AdamW.
The masters stay float32 (autocast casts each op's inputs), as PyTorch mixed precision does.

Protocol (one line each way, stdin/stdout): "step" -> {"cpu_s": ..., "wall_s": ...};
"memory" -> {"hwm_mb": ..., "baseline_mb": ...} (VmHWM of this process and its VmRSS before the
model was built); "quit" ends it.

Usage: python3 mixed_precision_peer.py --threads 1 --batch 8 --prompt-len 128 --response-len 128"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models"))
import peer_torch  # noqa: E402

# decode_bench's shape_110m(): must match mixed_precision_bench.cpp's config
CONFIG = dict(vocab=32000, d=768, ffn=2048, layers=12, heads=12, kv_heads=12, theta=10000.0, qkv_bias=False)


def status_mb(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no " + key + " in /proc/self/status")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--response-len", type=int, default=128)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    baseline = status_mb("VmRSS")
    model = peer_torch.Model(CONFIG)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
    T, R = a.prompt_len + a.response_len, a.response_len
    ids = torch.randint(3, CONFIG["vocab"], (a.batch, T))
    mask = torch.ones_like(ids)
    positions = torch.arange(T).expand_as(ids)
    advantages = torch.randn(a.batch, R)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(ids, mask, positions)
        z = logits[:, T - R - 1:T - 1].float()  # position t predicts token t + 1
        log_probs = torch.log_softmax(z, -1).gather(-1, ids[:, T - R:].unsqueeze(-1)).squeeze(-1)
        ratio = torch.exp(log_probs - log_probs.detach())
        loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.2)).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for line in sys.stdin:
        what = line.strip()
        if what == "step":
            c0, w0 = time.process_time(), time.perf_counter()
            step()
            print(json.dumps({"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - w0}), flush=True)
        elif what == "memory":
            print(json.dumps({"hwm_mb": status_mb("VmHWM"), "baseline_mb": baseline}), flush=True)
        elif what == "quit":
            return
        else:
            raise SystemExit("mixed_precision_peer: unknown request " + repr(what))


if __name__ == "__main__":
    main()
