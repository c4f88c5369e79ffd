#!/usr/bin/env python3
"""PyTorch peer of models_bench: the same Llama/Qwen2 decoder (RMSNorm, rotary, GQA,
SwiGLU, optional QKV bias, tied embeddings), the same preallocated KV-cache greedy loop and
the same training step (forward, next-token cross-entropy, backward, AdamW), on random
weights. Prints one JSON object per measurement; models_bench runs it in the same run.

Usage: python3 peer_torch.py --case tiny|50m|qwen2_0_5b --threads 2 --gen-batch 8 --prompt-len 16
       --new-tokens 32 --train-batch 8 --train-len 128 --repeats 3 [--device cuda --dtype bf16 --only generate]
decode_bench runs it with --device cuda (the device figures: the same loop on the same GPU)."""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

CONFIGS = {
    # must match hyflow::models::tiny_config(64) and bench_50m_config()
    "tiny": dict(vocab=64, d=128, ffn=384, layers=4, heads=4, kv_heads=2, theta=10000.0, qkv_bias=True),
    "50m": dict(vocab=32000, d=512, ffn=1536, layers=10, heads=8, kv_heads=4, theta=500000.0, qkv_bias=False),
    # decode_bench's shape_qwen2_0_5b() (Qwen2.5-0.5B's config.json)
    "qwen2_0_5b": dict(vocab=151936, d=896, ffn=4864, layers=24, heads=14, kv_heads=2, theta=1000000.0, qkv_bias=True),
}


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.h, self.kv, self.hd = c["heads"], c["kv_heads"], c["d"] // c["heads"]
        d = c["d"]
        self.q = nn.Linear(d, self.h * self.hd, bias=c["qkv_bias"])
        self.k = nn.Linear(d, self.kv * self.hd, bias=c["qkv_bias"])
        self.v = nn.Linear(d, self.kv * self.hd, bias=c["qkv_bias"])
        self.o = nn.Linear(self.h * self.hd, d, bias=False)
        self.gate = nn.Linear(d, c["ffn"], bias=False)
        self.up = nn.Linear(d, c["ffn"], bias=False)
        self.down = nn.Linear(c["ffn"], d, bias=False)
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)

    def attn(self, x, cos, sin, blocked, cache, length):
        B, T, _ = x.shape
        G = self.h // self.kv
        q = rotate(self.q(x).view(B, T, self.h, self.hd).transpose(1, 2), cos, sin)
        k = rotate(self.k(x).view(B, T, self.kv, self.hd).transpose(1, 2), cos, sin)
        v = self.v(x).view(B, T, self.kv, self.hd).transpose(1, 2)
        if cache is not None:
            ck, cv = cache
            ck[:, :, length:length + T].copy_(k)
            cv[:, :, length:length + T].copy_(v)
            k, v = ck[:, :, :length + T], cv[:, :, :length + T]
        S = k.shape[2]
        scores = torch.matmul(q.reshape(B, self.kv, G * T, self.hd), k.transpose(2, 3)) / math.sqrt(self.hd)
        scores = scores.view(B, self.h, T, S).masked_fill(blocked, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, -1, dtype=torch.float32).to(v.dtype)
        out = torch.matmul(probs.view(B, self.kv, G * T, S), v)
        return self.o(out.view(B, self.h, T, self.hd).transpose(1, 2).reshape(B, T, self.h * self.hd))

    def forward(self, x, cos, sin, blocked, cache=None, length=0):
        h = x + self.attn(self.n1(x), cos, sin, blocked, cache, length)
        n = self.n2(h)
        return h + self.down(F.silu(self.gate(n)) * self.up(n))


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c["vocab"], c["d"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["d"])
        hd = c["d"] // c["heads"]
        self.register_buffer("inv_freq", 1.0 / (c["theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd)))
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif not name.endswith("n1.weight") and not name.endswith("n2.weight") and name != "norm.weight":
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, ids, mask, positions, caches=None, length=0, last_only=False):
        B, T = ids.shape
        S = length + T
        qpos = torch.arange(length, S, device=ids.device).view(T, 1)
        kpos = torch.arange(0, S, device=ids.device).view(1, S)
        blocked = (kpos > qpos).view(1, 1, T, S) | (~mask.bool()).view(B, 1, 1, S)
        h = self.embed(ids)
        freqs = positions.float().unsqueeze(-1) * self.inv_freq
        angles = torch.cat((freqs, freqs), -1).unsqueeze(1)
        cos, sin = angles.cos().to(h.dtype), angles.sin().to(h.dtype)
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, blocked, caches[i] if caches else None, length)
        h = self.norm(h)
        return F.linear(h[:, -1:] if last_only else h, self.embed.weight)


@torch.no_grad()
def generate_greedy(model, ids, mask, new_tokens):
    c = model.c
    B, P = ids.shape
    hd = c["d"] // c["heads"]
    like = dict(device=ids.device, dtype=model.embed.weight.dtype)
    caches = [(torch.empty(B, c["kv_heads"], P + new_tokens, hd, **like),
               torch.empty(B, c["kv_heads"], P + new_tokens, hd, **like)) for _ in range(c["layers"])]
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    logits = model(ids, mask, positions, caches, 0, last_only=True)[:, -1]
    full_mask = torch.cat((mask, torch.ones(B, new_tokens, dtype=mask.dtype, device=ids.device)), 1)
    last = positions[:, -1]
    finished = torch.zeros(B, dtype=torch.bool, device=ids.device)
    eos = torch.tensor([-1], device=ids.device)  # never produced: every row runs to new_tokens, as in models_bench
    out = []
    for step in range(new_tokens):
        tok = logits.argmax(-1).masked_fill(finished, 0)
        out.append(tok)
        finished = finished | torch.isin(tok, eos)
        if step + 1 == new_tokens or bool(finished.all()):
            break
        logits = model(tok.unsqueeze(1), full_mask[:, :P + step + 1], (last + step + 1).unsqueeze(1),
                       caches, P + step)[:, 0]
    return torch.stack(out, 1)


def train_step(model, opt, ids):
    logits = model(ids, torch.ones_like(ids), torch.arange(ids.shape[1], device=ids.device).expand_as(ids))
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()


def best_time(fn, repeats, device="cpu"):
    def timed():
        fn()
        if device != "cpu":
            torch.cuda.synchronize()

    timed()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        timed()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=CONFIGS, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gen-batch", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--train-batch", type=int, default=8)
    ap.add_argument("--train-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--only", choices=["generate", "train"], default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    c = CONFIGS[a.case]
    model = Model(c).to(device=a.device, dtype=torch.bfloat16 if a.dtype == "bf16" else torch.float32)
    model.inv_freq = model.inv_freq.float()  # rotary angles stay float32, as in the model
    ids = torch.randint(c["vocab"], (a.gen_batch, a.prompt_len)).to(a.device)
    mask = torch.ones_like(ids)
    mask[1::2, : a.prompt_len // 2] = 0  # every other prompt left-padded to half length
    if a.only in (None, "generate"):
        t = best_time(lambda: generate_greedy(model, ids, mask, a.new_tokens), a.repeats, a.device)
        print(json.dumps({"case": a.case, "what": "generate", "tokens_per_s": a.gen_batch * a.new_tokens / t}),
              flush=True)
    if a.only == "generate":
        return
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    train_ids = torch.randint(c["vocab"], (a.train_batch, a.train_len)).to(a.device)
    t = best_time(lambda: train_step(model, opt, train_ids), a.repeats, a.device)
    print(json.dumps({"case": a.case, "what": "train", "tokens_per_s": a.train_batch * a.train_len / t}), flush=True)


if __name__ == "__main__":
    main()
