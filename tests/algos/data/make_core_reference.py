#!/usr/bin/env python3
"""Reference outputs for hyflow's ports of verl functions that had none.

Reproduces, with torch and numpy, the semantics of verl (at the commit hyflow tracks) for:
core_algos.compute_policy_loss (legacy 4-tuple), compute_policy_loss_reinforce, agg_loss;
torch_functional.logprobs_from_logits_naive; metric_utils.compute_data_metrics,
compute_timing_metrics, compute_throughout_metrics; utils.metric.reduce_metrics;
seqlen_balancing.roundup_divisible and rearrange_micro_batches (Karmarkar-Karp partitions,
with and without use_dynamic_bsz_balance). Writes core_reference.json next to this file.

Run: /usr/bin/python3 tests/algos/data/make_core_reference.py  (Debian's python3-torch)
"""
import heapq
import json
import math
import os
import random

import numpy as np
import torch


def tl(t):
    return t.tolist()


# --- torch_functional / core_algos -------------------------------------------------------

def masked_mean(values, mask):
    s = torch.where(mask.bool(), values, torch.zeros_like(values)).sum()
    return s / (mask.sum() + 1e-8)


def agg_loss(mat, mask, mode, dp_size=1, batch_num_tokens=None, global_batch_size=None, loss_scale_factor=None):
    if mode == "token-mean":
        if batch_num_tokens is None:
            batch_num_tokens = mask.sum()
        return torch.where(mask.bool(), mat, torch.zeros_like(mat)).sum() / batch_num_tokens * dp_size
    if mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        per_seq = torch.sum(mat * mask, dim=-1)
        if mode == "seq-mean-token-mean":
            counts = torch.sum(mask, dim=-1)
            per_seq = per_seq / (counts + 1e-8)
            seq_mask = (counts > 0).float()
        else:
            seq_mask = (torch.sum(mask, dim=-1) > 0).float()
        if global_batch_size is None:
            global_batch_size = seq_mask.sum()
        return torch.where(seq_mask.bool(), per_seq, torch.zeros_like(per_seq)).sum() / global_batch_size * dp_size
    if mode == "seq-mean-token-sum-norm":
        total = torch.sum(torch.sum(mat * mask, dim=-1))
        return total / (loss_scale_factor if loss_scale_factor is not None else mask.shape[-1])
    raise ValueError(mode)


def legacy_policy_loss(old, lp, adv, mask, cliprange, low, high, c, mode):
    low = cliprange if low is None else low
    high = cliprange if high is None else high
    nkl = torch.clamp(lp - old, min=-20.0, max=20.0)
    ratio = torch.exp(nkl)
    ppo_kl = masked_mean(-nkl, mask)
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1 - low, 1 + high)
    c1 = torch.maximum(l1, l2)
    clipfrac = masked_mean(torch.gt(l2, l1).float(), mask)
    l3 = -adv * c
    c2 = torch.min(l3, c1)
    clipfrac_lower = masked_mean(torch.gt(c1, l3) * (adv < 0).float(), mask)
    losses = torch.where(adv < 0, c2, c1)
    return agg_loss(losses, mask, mode), clipfrac, ppo_kl, clipfrac_lower


def reinforce_loss(rollout_lp, lp, adv, mask, mode, info, weights):
    losses = -adv * lp
    if weights is not None:
        losses = losses * weights
    loss = agg_loss(losses, mask, mode, **info)
    return loss, masked_mean(-(lp - rollout_lp), mask)


def policy_cases(gen):
    out = []
    B, T = 4, 6
    old = torch.randn(B, T, generator=gen) * 0.5 - 2
    lp = old + torch.randn(B, T, generator=gen) * 0.4
    adv = torch.randn(B, T, generator=gen)
    mask = torch.ones(B, T)
    mask[0, 4:] = 0
    mask[2, 1:] = 0
    mask[3, :] = 0  # an empty row
    weights = torch.rand(B, T, generator=gen) * 2
    base = {"old_log_prob": tl(old), "log_prob": tl(lp), "advantages": tl(adv), "response_mask": tl(mask),
            "rollout_is_weights": tl(weights)}
    for cliprange, low, high, c, mode in [(0.2, None, None, 3.0, "token-mean"), (0.2, 0.1, 0.28, 3.0, "token-mean"),
                                          (None, 0.2, 0.3, 1.5, "seq-mean-token-sum"),
                                          (0.1, None, 0.05, 2.0, "seq-mean-token-mean"),
                                          (0.3, None, None, 10.0, "seq-mean-token-sum-norm")]:
        loss, cf, kl, cfl = legacy_policy_loss(old, lp, adv, mask, cliprange, low, high, c, mode)
        out.append({"fn": "compute_policy_loss", "cliprange": cliprange, "cliprange_low": low,
                    "cliprange_high": high, "clip_ratio_c": c, "loss_agg_mode": mode,
                    "pg_loss": loss.item(), "pg_clipfrac": cf.item(), "ppo_kl": kl.item(),
                    "pg_clipfrac_lower": cfl.item()})
    for mode, info, use_w in [("seq-mean-token-sum", {}, False), ("seq-mean-token-sum", {}, True),
                              ("token-mean", {}, True),
                              ("token-mean", {"dp_size": 2, "batch_num_tokens": 20.0}, True),
                              ("seq-mean-token-mean", {"dp_size": 4, "global_batch_size": 8.0}, False),
                              ("seq-mean-token-sum-norm", {"loss_scale_factor": 3.0}, True)]:
        loss, kl = reinforce_loss(old, lp, adv, mask, mode, info, weights if use_w else None)
        out.append({"fn": "compute_policy_loss_reinforce", "loss_agg_mode": mode, "global_batch_info": info,
                    "use_weights": use_w, "pg_loss": loss.item(), "ppo_kl": kl.item()})
    return base, out


def logprob_cases(gen):
    out = []
    logits = torch.randn(2, 3, 7, generator=gen) * 3
    labels = torch.randint(0, 7, (2, 3), generator=gen)
    for dtype in ("float32", "float64", "bfloat16"):
        x = logits.to(getattr(torch, dtype))
        lp = torch.gather(torch.nn.functional.log_softmax(x, dim=-1), -1, labels.unsqueeze(-1)).squeeze(-1)
        out.append({"dtype": dtype, "logits": tl(x.double()), "labels": tl(labels), "expected": tl(lp.double())})
    return out


# --- metric_utils -------------------------------------------------------------------------

def data_metrics(b, use_critic):
    score = b["token_level_scores"].sum(-1)
    reward = b["token_level_rewards"].sum(-1)
    T = b["responses"].shape[-1]
    prompt_mask = b["attention_mask"][:, :-T].bool()
    rmask = b["response_mask"].bool()
    prompt_len = b["attention_mask"][:, :-T].sum(-1).float()
    resp_len = b["attention_mask"][:, -T:].sum(-1).float()
    aborted = (resp_len == 0).bool()
    keep = ~aborted
    m = {}
    for name, v in (("critic/score", score[keep]), ("critic/rewards", reward[keep]),
                    ("critic/advantages", torch.masked_select(b["advantages"], rmask)),
                    ("critic/returns", torch.masked_select(b["returns"], rmask))):
        m[name + "/mean"], m[name + "/max"], m[name + "/min"] = v.mean().item(), v.max().item(), v.min().item()
    if use_critic:
        vals = torch.masked_select(b["values"], rmask)
        rets = torch.masked_select(b["returns"], rmask)
        m["critic/values/mean"], m["critic/values/max"], m["critic/values/min"] = (
            vals.mean().item(), vals.max().item(), vals.min().item())
        m["critic/vf_explained_var"] = (1.0 - torch.var(rets - vals) / (torch.var(rets) + 1e-5)).item()
    for name, v, cap in (("response_length", resp_len, T), ("response_length_non_aborted", resp_len[keep], T),
                         ("prompt_length", prompt_len, prompt_mask.size(-1))):
        m[name + "/mean"], m[name + "/max"], m[name + "/min"] = v.mean().item(), v.max().item(), v.min().item()
        m[name + "/clip_ratio"] = torch.mean(torch.eq(v, cap).float()).item()
    m["response/aborted_ratio"] = torch.mean(aborted.float()).item()
    return m, prompt_len, resp_len


def metric_cases(gen):
    B, P, T = 6, 5, 4
    prompt_lens = [5, 3, 1, 4, 5, 2]
    resp_lens = [4, 2, 0, 3, 4, 1]  # row 2 aborted; rows 0 and 4 hit the response limit
    attn = torch.zeros(B, P + T, dtype=torch.long)
    for i in range(B):
        attn[i, P - prompt_lens[i]:P] = 1
        attn[i, P:P + resp_lens[i]] = 1
    resp_mask = attn[:, P:].clone()
    resp_mask[3, 1] = 0  # a tool token inside a response
    scores = torch.zeros(B, T)
    for i in range(B):
        if resp_lens[i] > 0:
            scores[i, resp_lens[i] - 1] = float(torch.randn(1, generator=gen))
    scores[2, 0] = 5.0  # an aborted row's score must not count
    rewards = scores - 0.01 * torch.rand(B, T, generator=gen) * resp_mask
    adv = torch.randn(B, T, generator=gen)
    rets = torch.randn(B, T, generator=gen)
    vals = rets + 0.3 * torch.randn(B, T, generator=gen)
    b = {"responses": torch.randint(0, 100, (B, T), generator=gen), "attention_mask": attn,
         "response_mask": resp_mask, "token_level_scores": scores, "token_level_rewards": rewards,
         "advantages": adv, "returns": rets, "values": vals}
    num_turns = [2, 4, 2, 3, 6, 2]
    tool_calls = [0, 1, 0, 2, 3, 0]
    m, prompt_len, resp_len = data_metrics(b, True)
    m["num_turns/min"] = int(np.array(num_turns).min())
    m["num_turns/max"] = int(np.array(num_turns).max())
    m["num_turns/mean"] = float(np.array(num_turns).mean())
    m["tool_call_counts/min"] = int(np.array(tool_calls).min())
    m["tool_call_counts/max"] = int(np.array(tool_calls).max())
    m["tool_call_counts/mean"] = float(np.array(tool_calls).mean())
    no_critic, _, _ = data_metrics(b, False)

    timing_raw = {"gen": 1.25, "ref": 0.5, "values": 0.25, "adv": 0.125, "update_critic": 0.75,
                  "update_actor": 1.5, "reward": 0.1, "step": 5.0}
    n_prompt = torch.sum(prompt_len).item()
    n_resp = torch.sum(resp_len).item()
    sections = {"gen": n_resp, **{k: n_prompt + n_resp for k in ("ref", "values", "adv", "update_critic",
                                                                  "update_actor")}}
    timing = {**{f"timing_s/{k}": v for k, v in timing_raw.items()},
              **{f"timing_per_token_ms/{k}": timing_raw[k] * 1000 / sections[k]
                 for k in sorted(set(sections) & set(timing_raw))}}
    global_token_num = torch.sum(attn, dim=-1).tolist()
    total = sum(global_token_num)
    throughput = {"perf/total_num_tokens": total, "perf/time_per_step": timing_raw["step"],
                  "perf/throughput": total / (timing_raw["step"] * 4)}
    batch = {k: tl(v) for k, v in b.items()}
    return {"batch": batch, "num_turns": num_turns, "tool_call_counts": tool_calls,
            "global_token_num": global_token_num, "data_metrics": m, "data_metrics_no_critic": no_critic,
            "timing_raw": timing_raw, "timing_metrics": timing, "n_gpus": 4, "throughout_metrics": throughput}


def reduce_cases(rng):
    long = [rng.uniform(-1, 1) * 10 ** rng.randint(-3, 3) for _ in range(300)]
    metrics = {"actor/pg_loss": long, "actor/grad_norm": [[0.5, 1.5], [2.0, 3.25]],
               "critic/vpred_max": [1.0, 7.5, -2.0], "timing/min_wait": [3.0, 1.0, 2.0],
               "perf/max_memory_allocated_gb": [4.0, 2.0], "flag": [True, False, True, True],
               "admin_ratio": [0.25, 0.5], "empty_mean": [], "scalar": 2.5, "mixed_min_max": [3.0, -1.0]}
    out = {}
    for k, v in metrics.items():
        if "max" in k:
            r = np.max(v)
        elif "min" in k:
            r = np.min(v)
        else:
            with np.errstate(all="ignore"):
                r = np.mean(v) if len(np.atleast_1d(v)) else float("nan")
        out[k] = None if math.isnan(float(r)) else float(r)
    return {"metrics": metrics, "reduced": out}


# --- seqlen_balancing ---------------------------------------------------------------------

def kk(values, k, equal_size):
    """Largest differencing with verl's tie-breaks: states with the larger spread pop first,
    then the one whose largest set is larger (sets compare by sum, item count, items)."""
    def set_key(s):
        return (s[0], len(s[1]), s[1])

    class St:
        def __init__(self, sets):
            self.sets = sorted(sets, key=set_key, reverse=True)

        def spread(self):
            return self.sets[0][0] - self.sets[-1][0]

        def __lt__(self, other):
            if self.spread() != other.spread():
                return self.spread() > other.spread()
            return set_key(self.sets[0]) > set_key(other.sets[0])

    order = sorted((v, i) for i, v in enumerate(values))
    heap = []
    step = k if equal_size else 1
    for off in range(0, len(order), step):
        sets = [[0, []] for _ in range(k)]
        for j, (v, i) in enumerate(order[off:off + step]):
            sets[j] = [v, [(i, v)]]
        heapq.heappush(heap, St(sets))
    while len(heap) > 1:
        a, b = heapq.heappop(heap), heapq.heappop(heap)
        merged = [[a.sets[i][0] + b.sets[k - 1 - i][0], a.sets[i][1] + b.sets[k - 1 - i][1]] for i in range(k)]
        heapq.heappush(heap, St(merged))
    return [sorted(i for i, _ in s[1]) for s in heap[0].sets]


def rearrange(seqlens, max_token_len, divided_by=None, min_num=None, balance=True, group=1, sync=None):
    workload = [24576 * s + s * s for s in seqlens]
    groups = len(seqlens) // group
    n = min(groups, -(sum(seqlens) // -max_token_len))
    if min_num is not None:
        n = max(min_num, n)
    if sync is not None:
        n = max(n, sync)  # an all-reduce MAX with another rank's count
    if divided_by is not None:
        n = ((n + divided_by - 1) // divided_by) * divided_by
    gw = [sum(workload[g * group:(g + 1) * group]) for g in range(groups)]
    parts = [[r for g in p for r in range(g * group, (g + 1) * group)] for p in kk(gw, n, False)]
    if balance:
        parts.sort(key=lambda p: (sum(gw[r // group] for r in p[::group]), p[0]), reverse=True)
        parts = parts[::2][::-1] + parts[1::2]
    return parts


def seqlen_cases(rng):
    out = []
    for trial in range(40):
        group = rng.choice([1, 1, 1, 2, 3])
        rows = group * rng.randint(1, 12)
        seqlens = [rng.randint(0, 300) for _ in range(rows)]
        width = max(seqlens + [1])
        max_token_len = width + rng.randint(0, 400)
        opts = {"divided_by": rng.choice([None, None, 2, 3]), "min_num": rng.choice([None, None, 2]),
                "balance": trial % 2 == 0, "group": group, "sync": rng.choice([None, None, 3])}
        try:
            parts = rearrange(seqlens, max_token_len, **opts)
        except (AssertionError, IndexError, ZeroDivisionError):
            continue
        if len(parts) > rows // group or any(len(p) == 0 for p in parts):
            continue  # verl asserts here
        out.append({"seqlens": seqlens, "max_token_len": max_token_len, "padded_seq_len": width, **opts,
                    "partitions": parts})
    roundup = [[a, b, ((a + b - 1) // b) * b] for a, b in [(7, 4), (8, 4), (0, 3), (1, 1), (-5, 4), (-8, 4),
                                                              (13, 5), (-1, 2)]]
    return {"rearrange": out, "roundup_divisible": roundup}


def main():
    gen = torch.Generator().manual_seed(20261124)
    rng = random.Random(20261124)
    inputs, losses = policy_cases(gen)
    ref = {"torch": torch.__version__, "numpy": np.__version__,
           "policy_loss_inputs": inputs, "policy_losses": losses, "logprobs_from_logits_naive": logprob_cases(gen),
           "metrics": metric_cases(gen), "reduce_metrics": reduce_cases(rng), "seqlen": seqlen_cases(rng)}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "core_reference.json")
    with open(path, "w") as f:
        json.dump(ref, f, indent=1, allow_nan=False)
        f.write("\n")


if __name__ == "__main__":
    main()
