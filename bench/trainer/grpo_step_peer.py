#!/usr/bin/env python3
"""PyTorch peer of one hyflow GRPO step on the same tiny Qwen2-layout model (bench/trainer).

Same work as the C++ step: left-padded prompts repeated n times, sampled generation with a KV
cache, arithmetic rewards, old log-probs, GRPO advantages, one PPO-clip update (token-mean,
grad clip 1.0, AdamW). Prints one JSON object: {"step_s": .., "tokens": .., "timing": {...}}.
Usage: grpo_step_peer.py MODEL_DIR PROMPTS_JSON N RESPONSE_LEN STEPS LR
"""
import json, math, os, re, struct, sys, time
import torch
import torch.nn.functional as F

def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    dt = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = torch.frombuffer(bytearray(data[a:b]), dtype=dt[v["dtype"]]).reshape(v["shape"]).float()
    return out

class Model(torch.nn.Module):
    def __init__(self, cfg, w):
        super().__init__()
        self.cfg = cfg
        self.p = torch.nn.ParameterDict({k.replace(".", "__"): torch.nn.Parameter(t) for k, t in w.items()})
        self.H = cfg["num_attention_heads"]; self.KV = cfg.get("num_key_value_heads", self.H)
        self.D = cfg["hidden_size"] // self.H
        self.eps = cfg.get("rms_norm_eps", 1e-6); self.theta = cfg.get("rope_theta", 10000.0)
    def w(self, k):
        return self.p[k.replace(".", "__")]
    def rms(self, x, k):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w(k)
    def rope(self, pos):
        inv = 1.0 / (self.theta ** (torch.arange(0, self.D, 2).float() / self.D))
        f = pos.float()[..., None] * inv
        e = torch.cat([f, f], -1)
        return e.cos()[:, None], e.sin()[:, None]
    @staticmethod
    def rot(x):
        a, b = x.chunk(2, -1)
        return torch.cat([-b, a], -1)
    def forward(self, ids, mask, pos, cache=None):
        B, T = ids.shape
        x = F.embedding(ids, self.w("model.embed_tokens.weight"))
        cos, sin = self.rope(pos)
        if cache is None:
            past = 0
        else:
            past = cache[0][0].shape[2] if cache[0] is not None else 0
        full_mask = mask  # (B, past+T) keys
        causal = torch.ones(T, past + T, dtype=torch.bool).tril(past)
        allow = causal[None, None] & full_mask[:, None, None, :].bool()
        for i in range(self.cfg["num_hidden_layers"]):
            pre = f"model.layers.{i}."
            h = self.rms(x, pre + "input_layernorm.weight")
            q = F.linear(h, self.w(pre + "self_attn.q_proj.weight"), self.w(pre + "self_attn.q_proj.bias")).view(B, T, self.H, self.D).transpose(1, 2)
            k = F.linear(h, self.w(pre + "self_attn.k_proj.weight"), self.w(pre + "self_attn.k_proj.bias")).view(B, T, self.KV, self.D).transpose(1, 2)
            v = F.linear(h, self.w(pre + "self_attn.v_proj.weight"), self.w(pre + "self_attn.v_proj.bias")).view(B, T, self.KV, self.D).transpose(1, 2)
            q = q * cos + self.rot(q) * sin
            k = k * cos + self.rot(k) * sin
            if cache is not None:
                if cache[i] is not None:
                    k = torch.cat([cache[i][0], k], 2); v = torch.cat([cache[i][1], v], 2)
                cache[i] = (k, v)
            rep = self.H // self.KV
            kk = k.repeat_interleave(rep, 1); vv = v.repeat_interleave(rep, 1)
            att = (q @ kk.transpose(-1, -2)) / math.sqrt(self.D)
            att = att.masked_fill(~allow, float("-inf")).softmax(-1).nan_to_num(0.0)
            o = (att @ vv).transpose(1, 2).reshape(B, T, -1)
            x = x + F.linear(o, self.w(pre + "self_attn.o_proj.weight"))
            h = self.rms(x, pre + "post_attention_layernorm.weight")
            x = x + F.linear(F.silu(F.linear(h, self.w(pre + "mlp.gate_proj.weight"))) * F.linear(h, self.w(pre + "mlp.up_proj.weight")),
                             self.w(pre + "mlp.down_proj.weight"))
        x = self.rms(x, "model.norm.weight")
        head = self.w("lm_head.weight") if "lm_head__weight" in self.p else self.w("model.embed_tokens.weight")
        return F.linear(x, head)

def main():
    model_dir, prompts_json, n, R, steps, lr = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
    torch.manual_seed(0)
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    model = Model(cfg, load_safetensors(os.path.join(model_dir, "model.safetensors")))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=0.01)
    batch = json.load(open(prompts_json))  # {"input_ids": [[..]], "attention_mask": [[..]], "truths": [..], "itos": [...]}
    itos = batch["itos"]; eos = cfg["eos_token_id"] if isinstance(cfg["eos_token_id"], int) else cfg["eos_token_id"][0]
    pad = cfg.get("pad_token_id", 0)
    timings = {}
    results = []
    for _ in range(steps):
        t_step = time.perf_counter()
        ids = torch.tensor(batch["input_ids"]).repeat_interleave(n, 0)
        pmask = torch.tensor(batch["attention_mask"]).repeat_interleave(n, 0)
        truths = [t for t in batch["truths"] for _ in range(n)]
        B, P = ids.shape
        t0 = time.perf_counter()
        with torch.no_grad():
            cache = [None] * cfg["num_hidden_layers"]
            pos = (pmask.cumsum(-1) - 1).clamp(min=0)
            mask = pmask.clone()
            logits = model(ids, mask, pos, cache)[:, -1]
            resp = torch.full((B, R), pad, dtype=torch.long); rmask = torch.zeros(B, R, dtype=torch.long)
            done = torch.zeros(B, dtype=torch.bool); last = pos[:, -1]
            for t in range(R):
                tok = torch.multinomial(logits.softmax(-1), 1)[:, 0]
                tok = torch.where(done, torch.full_like(tok, pad), tok)
                resp[:, t] = tok; rmask[:, t] = (~done).long()
                done = done | (tok == eos)
                if t == R - 1 or bool(done.all()):
                    break
                mask = torch.cat([mask, rmask[:, t:t + 1]], 1); last = last + 1
                logits = model(tok[:, None], mask, last[:, None], cache)[:, -1]
        timings["gen"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        scores = torch.zeros(B)
        for i in range(B):
            L = int(rmask[i].sum())
            text = "".join(itos[j] for j in resp[i, :L].tolist() if j != eos and j != pad)
            m = re.findall(r"-?[0-9]+(?:\.[0-9]+)?", text)
            scores[i] = 1.0 if m and float(m[-1]) == float(truths[i]) else 0.0
        timings["reward"] = time.perf_counter() - t0
        full = torch.cat([ids, resp], 1); amask = torch.cat([pmask, rmask], 1)
        fpos = (amask.cumsum(-1) - 1).clamp(min=0)
        def logp():
            lg = model(full, amask, fpos)[:, P - 1:-1]
            return torch.gather(lg.log_softmax(-1), -1, resp[..., None])[..., 0]
        t0 = time.perf_counter()
        with torch.no_grad():
            old = logp()
        timings["old_log_prob"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        g = scores.view(-1, n)
        adv = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-6)).view(-1, 1) * rmask
        timings["adv"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        opt.zero_grad()
        lp = logp()
        ratio = torch.exp((lp - old).clamp(-20, 20))
        pg = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
        loss = (pg * rmask).sum() / (rmask.sum() + 1e-8)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if torch.isfinite(gn):
            opt.step()
        timings["update_actor"] = time.perf_counter() - t0
        step_s = time.perf_counter() - t_step
        results.append({"step_s": step_s, "tokens": int(amask.sum()), "timing": dict(timings), "score": float(scores.mean())})
    print(json.dumps(results[-1] | {"mean_step_s": sum(r["step_s"] for r in results[1:]) / max(1, len(results) - 1)}))

if __name__ == "__main__":
    main()
