#pragma once
// The bodies of the token kernels, one block per row, written once against an execution policy
// (common.cuh explains the rules). kernels_device.cu runs them as CUDA kernels; kernels_host.cpp
// runs them through the sequential host driver.

#include "common.cuh"

#include <hyflow/cuda/kernels.hpp>

namespace hyflow::cuda::kernels::detail {

/// Most candidates of a top-k row the sampling kernel keeps in shared memory (top-p and the
/// draw then read them there instead of the vocabulary); rows with more use the full passes.
constexpr int kSampleCandidates = 1024;

/// Bytes of shared memory a row block of `threads` threads needs, for every kernel here.
HYFLOW_HD int64_t shared_bytes(int threads) {
  // sampling: 256 masses + 256 counts + per-thread ArgMax/stats + a few block-uniform values
  // + the top-k candidates (value and index)
  const int64_t per_thread = sizeof(ArgMax) > sizeof(SoftmaxStats) ? sizeof(ArgMax) : sizeof(SoftmaxStats);
  return 256 * 8 + 256 * 4 + threads * per_thread + 16 * 8 + 64 + kSampleCandidates * 8 + 32;
}

HYFLOW_HD Elem elem(DType d) {
  return static_cast<Elem>(static_cast<int>(d));
}

HYFLOW_HD int elem_bytes(DType d) {
  return d == DType::f32 ? 4 : 2;
}

// --- log-probs and entropy, forward -------------------------------------------------------

template <class Exec>
HYFLOW_HD void scores_forward_row(Exec& ex, const ScoresForward& a, int64_t row) {
  const void* base = static_cast<const char*>(a.logits) + row * a.row_stride * elem_bytes(a.dtype);
  const Elem type = elem(a.dtype);
  const float inv_t = 1.0f / a.temperature;
  SoftmaxStats* part = ex.template shared<SoftmaxStats>(ex.threads());
  ex.for_threads([&](int t) {
    SoftmaxStats s = empty_stats();
    for_row(t, ex.threads(), base, type, a.vocab, [&](int64_t, float x) { push(s, x * inv_t); });
    part[t] = s;
  });
  ex.sync();
  tree_reduce(ex, part, [](SoftmaxStats x, SoftmaxStats y) { return merge(x, y); });
  ex.single([&] {
    const SoftmaxStats s = part[0];
    const float log_s = logf(s.s);
    const float lse = s.m + log_s;
    const float mean = s.m + s.t / s.s;
    if (a.lse) a.lse[row] = lse;
    if (a.mean_z) a.mean_z[row] = mean;
    if (a.entropy) a.entropy[row] = log_s - s.t / s.s;
    if (a.log_probs && a.labels) {
      const int64_t label = a.labels[row];
      a.log_probs[row] = (label >= 0 && label < a.vocab) ? load(base, type, label) * inv_t - lse : nanf("");
    }
  });
  ex.sync();
}

// --- log-probs and entropy, backward ------------------------------------------------------

/// The elements [begin, end) of a row that segment `segment` of `segments` writes: whole
/// 16-byte vectors split evenly, the elements past the last vector in the last segment.
HYFLOW_HD void segment_range(int64_t vocab, Elem type, int segment, int segments, int64_t& begin, int64_t& end) {
  const int w = vec_elems(type);
  const int64_t vectors = vocab / w;
  begin = vectors * segment / segments * w;
  end = segment + 1 == segments ? vocab : vectors * (segment + 1) / segments * w;
}

/// One segment of a row: the gradient is elementwise given the forward's lse and mean_z, so a
/// row may be split over several blocks (`segments`) without changing a bit of the result.
template <class Exec>
HYFLOW_HD void scores_backward_row(Exec& ex, const ScoresBackward& a, int64_t row, int segment = 0,
                                   int segments = 1) {
  const int width = elem_bytes(a.dtype);
  const Elem type = elem(a.dtype);
  int64_t begin = 0, end = 0;
  segment_range(a.vocab, type, segment, segments, begin, end);
  const void* base = static_cast<const char*>(a.logits) + (row * a.row_stride + begin) * width;
  void* out = static_cast<char*>(a.grad_logits) + (row * a.vocab + begin) * width;
  const float inv_t = 1.0f / a.temperature;
  const float g_lp = a.grad_log_probs ? a.grad_log_probs[row] : 0.0f;
  const float g_ent = a.grad_entropy ? a.grad_entropy[row] : 0.0f;
  const int64_t label = a.grad_log_probs && a.labels ? a.labels[row] - begin : -1;
  const float lse = a.lse[row];
  const float mean = a.grad_entropy ? a.mean_z[row] : 0.0f;
  ex.for_threads([&](int t) {
    for_row(t, ex.threads(), base, type, end - begin, [&](int64_t j, float x) {
      const float z = x * inv_t;
      const float p = expf(z - lse);
      float g = -g_lp * p;
      if (j == label) g += g_lp;
      if (g_ent != 0.0f && p != 0.0f) g += g_ent * p * (mean - z);
      store(out, type, j, g * inv_t);
    });
  });
  ex.sync();
}

// --- sampling -----------------------------------------------------------------------------

/// Block-uniform values of one sampling row, in shared memory.
struct SampleRowState {
  float m;              // max z over the row (NaN when a logit is NaN)
  uint32_t invalid;     // a NaN, or no finite logit
  uint32_t key_k;       // keep key(z) >= key_k (top-k)
  uint32_t key_p;       // keep key(z) >= key_p (top-p)
  uint32_t prefix;      // radix search: the high bits found so far
  uint32_t candidates;  // top-k tokens collected in shared memory (> kSampleCandidates: too many)
  uint64_t above;       // radix search: count / mass above the current range
  uint64_t threshold;   // top-p: keep while the mass before a token is below this
};

/// Fixed-point probability mass of a kept token: exp(z - m) scaled by 2^40 (the max has 2^40).
/// Integer sums are exact and order-free, so the top-p edge is the same on host and device,
/// whatever order the atomics land in.
HYFLOW_HD uint64_t fixed_mass(float z, float m) {
  return static_cast<uint64_t>(expf(z - m) * 1099511627776.0f);
}

/// Picks the digit of a top-k radix step from the counts of the current range (thread 0).
HYFLOW_HD void top_k_digit(SampleRowState* st, const uint32_t* count, int shift, int64_t top_k) {
  uint64_t above = st->above;  // tokens with a larger key than the current range
  for (int b = 255; b >= 0; --b) {
    if (above + count[b] >= static_cast<uint64_t>(top_k)) {
      st->prefix |= static_cast<uint32_t>(b) << shift;
      break;
    }
    above += count[b];
  }
  st->above = above;
}

/// Picks the digit of a top-p radix step from the counts and masses of the current range; the
/// first step (shift 24, the whole kept set) also fixes the edge p * total (thread 0).
HYFLOW_HD void top_p_digit(SampleRowState* st, const uint32_t* count, const uint64_t* mass, int shift, float top_p) {
  if (shift == 24) {
    uint64_t total = 0;
    for (int b = 0; b < 256; ++b) total += mass[b];
    const double edge = static_cast<double>(top_p) * static_cast<double>(total);
    uint64_t threshold = static_cast<uint64_t>(edge);
    if (static_cast<double>(threshold) < edge) ++threshold;  // ceil
    st->threshold = threshold > 0 ? threshold : 1;
  }
  uint64_t before = st->above;
  int chosen = -1;
  uint64_t before_chosen = before;
  for (int b = 255; b >= 0; --b) {
    if (count[b] == 0) continue;
    if (before >= st->threshold) break;
    chosen = b;
    before_chosen = before;
    before += mass[b];
  }
  st->prefix |= static_cast<uint32_t>(chosen < 0 ? 255 : chosen) << shift;
  st->above = before_chosen;
}

/// Passes over a row's logits (the vocabulary in global memory), by the filters a row uses:
/// one for the max (which also counts the first top-k digit), three more per top-k digit, one to
/// collect the top-k candidates; with them, top-p and the draw read the candidates only;
/// otherwise four per top-p digit and one for the draw. Top-k and top-p: 5 passes (10 before the
/// candidates and the fused first digit); top-p alone: 6; greedy: 1.
template <class Exec>
HYFLOW_HD void sample_row(Exec& ex, const SampleArgs& a, int64_t row) {
  const void* base = static_cast<const char*>(a.logits) + row * a.row_stride * elem_bytes(a.dtype);
  const Elem type = elem(a.dtype);
  const int64_t vocab = a.vocab;
  const float temperature = a.temperature ? a.temperature[row] : a.temperature_all;
  const bool greedy = !(temperature > 0.0f);
  const float inv_t = greedy ? 1.0f : 1.0f / temperature;
  int64_t top_k = a.top_k ? a.top_k[row] : a.top_k_all;
  if (top_k <= 0 || top_k >= vocab) top_k = 0;
  const float top_p = a.top_p ? a.top_p[row] : a.top_p_all;
  const float min_p = a.min_p ? a.min_p[row] : a.min_p_all;
  const bool count_first_digit = !greedy && top_k > 0;

  SampleRowState* st = ex.template shared<SampleRowState>(1);
  uint64_t* mass = ex.template shared<uint64_t>(256);
  uint32_t* count = ex.template shared<uint32_t>(256);
  ArgMax* best = ex.template shared<ArgMax>(ex.threads());
  float* cand_z = ex.template shared<float>(kSampleCandidates);
  int32_t* cand_j = ex.template shared<int32_t>(kSampleCandidates);

  if (count_first_digit) {
    ex.for_threads([&](int t) {
      for (int i = t; i < 256; i += ex.threads()) count[i] = 0;
    });
    ex.sync();
  }
  // Phase 1: max (and argmax for greedy rows), NaN detection; with top-k, the histogram of the
  // keys' top 8 bits (the radix select's first step) in the same read.
  ex.for_threads([&](int t) {
    ArgMax b{minus_inf(), -1};
    bool nan = false;
    for_row(t, ex.threads(), base, type, vocab, [&](int64_t j, float z) {
      if (is_nan(z)) nan = true;
      b = better(b, ArgMax{z, j});
      if (count_first_digit) ex.atomic_add(&count[order_key(z * inv_t) >> 24], 1u);
    });
    best[t] = nan ? ArgMax{nanf(""), -2} : b;
  });
  ex.sync();
  tree_reduce(ex, best, [](ArgMax x, ArgMax y) {
    if (x.index == -2 || y.index == -2) return ArgMax{nanf(""), -2};
    return better(x, y);
  });
  ex.single([&] {
    const ArgMax b = best[0];
    st->invalid = (b.index < 0 || !(b.value > minus_inf()) || b.value == plus_inf()) ? 1u : 0u;
    st->m = b.value * inv_t;
    st->key_k = 0;
    st->key_p = 0;
    st->candidates = kSampleCandidates + 1u;
    if (st->invalid)
      a.tokens[row] = -1;
    else if (greedy)
      a.tokens[row] = b.index;
  });
  ex.sync();
  if (st->invalid || greedy) return;
  const float m = st->m;

  // Phase 2: top-k: the k-th largest key, 8 bits at a time from the top (radix select); the
  // first digit's counts came with phase 1.
  if (top_k > 0) {
    ex.single([&] {
      st->prefix = 0;
      st->above = 0;
      top_k_digit(st, count, 24, top_k);
    });
    ex.sync();
    for (int shift = 16; shift >= 0; shift -= 8) {
      ex.for_threads([&](int t) {
        for (int i = t; i < 256; i += ex.threads()) count[i] = 0;
      });
      ex.sync();
      const uint32_t high_mask = ~((1u << (shift + 8)) - 1u);
      const uint32_t prefix = st->prefix;
      ex.for_threads([&](int t) {
        for_row(t, ex.threads(), base, type, vocab, [&](int64_t, float x) {
          const uint32_t key = order_key(x * inv_t);
          if ((key & high_mask) == prefix) ex.atomic_add(&count[(key >> shift) & 255u], 1u);
        });
      });
      ex.sync();
      ex.single([&] { top_k_digit(st, count, shift, top_k); });
      ex.sync();
    }
    // The top-k set (keys >= the k-th, ties included) into shared memory when it fits. Slots
    // come in any order: only the order-free counts, masses and argmax below read them.
    ex.single([&] {
      st->key_k = st->prefix;
      st->candidates = 0;
    });
    ex.sync();
    const uint32_t key_k = st->key_k;
    ex.for_threads([&](int t) {
      for_row(t, ex.threads(), base, type, vocab, [&](int64_t j, float x) {
        const float z = x * inv_t;
        if (order_key(z) < key_k) return;
        const uint32_t slot = ex.fetch_add(&st->candidates, 1u);
        if (slot < static_cast<uint32_t>(kSampleCandidates)) {
          cand_z[slot] = z;
          cand_j[slot] = static_cast<int32_t>(j);
        }
      });
    });
    ex.sync();
  }
  const uint32_t key_k = st->key_k;
  const bool in_shared = st->candidates <= static_cast<uint32_t>(kSampleCandidates);
  const int n_cand = in_shared ? static_cast<int>(st->candidates) : 0;

  // Phase 3: top-p over the top-k set: the smallest key whose strictly-larger mass is below
  // p * total, by the same radix descent on fixed-point masses.
  if (top_p < 1.0f) {
    ex.single([&] {
      st->prefix = 0;
      st->above = 0;
    });
    ex.sync();
    for (int shift = 24; shift >= 0; shift -= 8) {
      ex.for_threads([&](int t) {
        for (int i = t; i < 256; i += ex.threads()) {
          count[i] = 0;
          mass[i] = 0;
        }
      });
      ex.sync();
      const uint32_t high_mask = shift == 24 ? 0u : ~((1u << (shift + 8)) - 1u);
      const uint32_t prefix = st->prefix;
      auto add = [&](float z) {
        const uint32_t key = order_key(z);
        if (key >= key_k && (key & high_mask) == prefix) {
          ex.atomic_add(&count[(key >> shift) & 255u], 1u);
          ex.atomic_add(&mass[(key >> shift) & 255u], fixed_mass(z, m));
        }
      };
      ex.for_threads([&](int t) {
        if (in_shared) {
          for (int i = t; i < n_cand; i += ex.threads()) add(cand_z[i]);
        } else {
          for_row(t, ex.threads(), base, type, vocab, [&](int64_t, float x) { add(x * inv_t); });
        }
      });
      ex.sync();
      ex.single([&] { top_p_digit(st, count, mass, shift, top_p); });
      ex.sync();
    }
    ex.single([&] { st->key_p = st->prefix; });
    ex.sync();
  }
  const uint32_t key_min = key_k > st->key_p ? key_k : st->key_p;

  // Phase 4: min-p, then the exponential race over the kept tokens; token j's noise is word
  // j % 4 of the Philox block of its group j / 4, whichever thread or slot holds it.
  const uint64_t row_id = a.row_ids ? static_cast<uint64_t>(a.row_ids[row]) : static_cast<uint64_t>(row);
  const uint64_t step = a.steps ? static_cast<uint64_t>(a.steps[row]) : a.step;
  ex.for_threads([&](int t) {
    ArgMax b{minus_inf(), -1};
    int64_t group = -1;
    Philox4 r{{0, 0, 0, 0}};
    auto race = [&](int64_t j, float z) {
      if (z == minus_inf() || order_key(z) < key_min) return;
      if (min_p > 0.0f && expf(z - m) < min_p) return;
      if (j / 4 != group) {
        group = j / 4;
        r = token_randoms(a.seed, row_id, step, static_cast<uint64_t>(group));
      }
      b = better(b, ArgMax{race_key(z, r.v[j % 4]), j});
    };
    if (in_shared) {
      for (int i = t; i < n_cand; i += ex.threads()) race(cand_j[i], cand_z[i]);
    } else {
      for_row(t, ex.threads(), base, type, vocab, [&](int64_t j, float x) { race(j, x * inv_t); });
    }
    best[t] = b;
  });
  ex.sync();
  tree_reduce(ex, best, [](ArgMax x, ArgMax y) { return better(x, y); });
  ex.single([&] { a.tokens[row] = best[0].index; });
  ex.sync();
}

// --- the shared arithmetic, element i (PrimitiveArgs) ------------------------------------------

HYFLOW_HD void primitives_at(const PrimitiveArgs& a, int64_t i) {
  if (a.philox_in) {
    const uint32_t* in = a.philox_in + 6 * i;
    const Philox4 out = philox4x32_10(Philox4{{in[0], in[1], in[2], in[3]}}, in[4], in[5]);
    for (int w = 0; w < 4; ++w) a.philox_out[4 * i + w] = out.v[w];
  }
  if (a.values) {
    a.bf16[i] = float_to_bf16(a.values[i]);
    a.f16[i] = float_to_f16(a.values[i]);
    a.bf16_back[i] = bf16_to_float(a.bf16[i]);
    a.f16_back[i] = f16_to_float(a.f16[i]);
  }
}

}  // namespace hyflow::cuda::kernels::detail
