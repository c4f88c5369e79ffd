#include "../../inference/src/decode/kernels.hpp"
#include "decode_test_util.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/inference/decode_engine.hpp>
#include <hyflow/inference/generation.hpp>
#include <hyflow/models/checkpoint.hpp>
#include <hyflow/models/response_scores.hpp>

#include <catch2/catch.hpp>

#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>

using namespace hyflow;
using namespace hyflow::models;
using namespace hyflow::inference;
using namespace hyflow::testing;

namespace {

// Caps the kernel build for a scope (the CPU's best build when it has no better one).
struct KernelMode {
  explicit KernelMode(decode::Isa max) { decode::limit_kernel_isa(max); }
  KernelMode(const KernelMode&) = delete;
  KernelMode& operator=(const KernelMode&) = delete;
  ~KernelMode() { decode::limit_kernel_isa(decode::Isa::kAvx512); }
};

// The builds this CPU can run, best first.
std::vector<decode::Isa> builds() {
  std::vector<decode::Isa> out;
  for (auto isa : {decode::Isa::kAvx512, decode::Isa::kAvx2, decode::Isa::kPortable}) {
    if (isa <= decode::best_kernel_isa()) out.push_back(isa);
  }
  return out;
}

// LibTorch's intra-op thread count for a scope.
struct IntraOpThreads {
  explicit IntraOpThreads(int n) : before_(at::get_num_threads()) { at::set_num_threads(n); }
  IntraOpThreads(const IntraOpThreads&) = delete;
  IntraOpThreads& operator=(const IntraOpThreads&) = delete;
  ~IntraOpThreads() { at::set_num_threads(before_); }

 private:
  int before_;
};

// y (+)= x W^T + b through the packed GEMM.
void packed_linear(const at::Tensor& x, const at::Tensor& w, const float* bias, at::Tensor& y, bool accumulate) {
  const int64_t out = w.size(0), in = w.size(1);
  std::vector<float> packed(static_cast<size_t>(decode::packed_size(in, out)));
  decode::pack_weight(w.data_ptr<float>(), in, out, packed.data());
  decode::linear(x.data_ptr<float>(), x.size(1), x.size(0), packed.data(), bias, in, out, y.data_ptr<float>(), out,
                 accumulate);
}

}  // namespace

TEST_CASE("the decode GEMM equals x W^T + b on odd shapes, every kernel build") {
  torch::manual_seed(1);
  for (auto isa : builds()) {
    KernelMode mode(isa);
    for (auto [rows, in, out] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {1, 512, 33}, {3, 17, 9}, {8, 40, 76}, {50, 64, 5}, {2, 7, 1}, {13, 24, 100}, {9, 3, 49}}) {
      INFO(decode::isa_name(isa) << " rows " << rows << " in " << in << " out " << out);
      auto x = torch::randn({rows, in});
      auto w = torch::randn({out, in});
      auto b = torch::randn({out});
      auto y = torch::randn({rows, out});
      auto expected = y + (torch::matmul(x, w.t()) + b);
      packed_linear(x, w, b.data_ptr<float>(), y, /*accumulate=*/true);
      CHECK(torch::allclose(y, expected, 1e-4, 1e-4));
      packed_linear(x, w, nullptr, y, false);
      CHECK(torch::allclose(y, torch::matmul(x, w.t()), 1e-4, 1e-4));
    }
  }
}

TEST_CASE("the decode GEMM's sums do not depend on the other rows, and the vector builds agree bit for bit") {
  torch::manual_seed(2);
  const int64_t in = 37, out = 71;  // a tail panel; every row count from 1 to 20 (full and partial tiles)
  auto x = torch::randn({20, in});
  auto w = torch::randn({out, in});
  for (auto isa : builds()) {
    KernelMode mode(isa);
    INFO(decode::isa_name(isa));
    auto all = torch::empty({20, out});
    packed_linear(x, w, nullptr, all, false);
    for (int64_t rows = 1; rows <= 20; ++rows) {
      auto part = torch::empty({rows, out});
      packed_linear(x.narrow(0, 20 - rows, rows).contiguous(), w, nullptr, part, false);
      CHECK(torch::equal(part, all.narrow(0, 20 - rows, rows)));
    }
    // The sum is the chain fma(x[k], w[k], acc) over k in order: check one output against it.
    if (isa != decode::Isa::kPortable) {
      auto xa = x.accessor<float, 2>();
      auto wa = w.accessor<float, 2>();
      for (auto [r, o] : std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {7, 70}, {19, 33}}) {
        float acc = 0.0F;
        for (int64_t k = 0; k < in; ++k) acc = std::fma(xa[r][k], wa[o][k], acc);
        CHECK(all[r][o].item<float>() == acc);
      }
    }
  }
}

TEST_CASE("the batch-1 GEMV (groups of 8 panels fetched ahead) equals its row of a multi-row call bit for bit") {
  // in around the 64 k steps fetched ahead (the fetch moves on to the next group's panels); out with
  // whole groups of 8 panels, a short group and a partial panel; 1 to 3 threads (runs end mid-group).
  torch::manual_seed(11);
  for (auto isa : builds()) {
    KernelMode mode(isa);
    for (auto [in, out] : std::vector<std::pair<int64_t, int64_t>>{
             {3, 16 * 8 * 2 + 16 * 3 + 5}, {63, 128}, {64, 17}, {65, 300}, {200, 16 * 8 * 3 + 1}, {129, 1}}) {
      auto x = torch::randn({5, in});
      auto w = torch::randn({out, in});
      auto b = torch::randn({out});
      auto all = torch::empty({5, out});
      packed_linear(x, w, b.data_ptr<float>(), all, false);
      CHECK(torch::allclose(all, torch::addmm(b, x, w.t()), 1e-4, 1e-4));
      for (int threads : {1, 2, 3}) {
        INFO(decode::isa_name(isa) << " in " << in << " out " << out << ", " << threads << " threads");
        IntraOpThreads intra(threads);
        for (int64_t r : {0, 4}) {
          auto one = torch::full({1, out}, std::numeric_limits<float>::quiet_NaN());
          packed_linear(x.narrow(0, r, 1).contiguous(), w, b.data_ptr<float>(), one, false);
          CHECK(torch::equal(one, all.narrow(0, r, 1)));
          // accumulate: the residual add on top of what y holds
          auto acc = torch::ones({1, out});
          packed_linear(x.narrow(0, r, 1).contiguous(), w, b.data_ptr<float>(), acc, true);
          CHECK(torch::equal(acc, all.narrow(0, r, 1) + 1));
        }
      }
    }
  }
}

TEST_CASE("the decode GEMM's results do not depend on the thread count (runs of panels end mid-group)") {
  // 41 panels (the last partial) of 256 inputs: 2 and 3 threads take runs of 21 / 20 and 14 / 14 / 13
  // panels, so groups of 3 panels are cut short at the runs' ends.
  torch::manual_seed(5);
  auto x = torch::randn({20, 256});
  auto w = torch::randn({16 * 40 + 7, 256});
  auto b = torch::randn({16 * 40 + 7});
  for (auto isa : builds()) {
    KernelMode mode(isa);
    auto one = torch::empty({20, w.size(0)});
    {
      IntraOpThreads intra(1);
      packed_linear(x, w, b.data_ptr<float>(), one, false);
    }
    CHECK(torch::allclose(one, torch::addmm(b, x, w.t()), 1e-4, 1e-4));
    for (int threads : {2, 3}) {
      INFO(decode::isa_name(isa) << ", " << threads << " threads");
      IntraOpThreads intra(threads);
      auto many = torch::full_like(one, std::numeric_limits<float>::quiet_NaN());
      packed_linear(x, w, b.data_ptr<float>(), many, false);
      CHECK(torch::equal(one, many));
    }
  }
}

TEST_CASE(
    "a pass's attention (attend_rows) equals attend() per row and head bit for bit, every build and thread count") {
  // Paged caches of random keys and values: rows of odd lengths over blocks taken in a shuffled
  // order, some shared between rows (as prefix sharing does); GQA and MHA, head dims with and
  // without a scalar tail (and with an 8-float vector past the 16-float ones), odd block sizes and
  // blocks of 16 or more positions (the AVX-512 scores' 16-position path).
  struct Shape {
    int64_t heads, kv_heads, dim, block_size;
  };
  torch::manual_seed(3);
  for (auto shape : std::vector<Shape>{{4, 4, 10, 3},
                                       {4, 2, 64, 16},
                                       {6, 3, 72, 5},
                                       {14, 2, 64, 16},
                                       {2, 1, 3, 1},
                                       {3, 3, 136, 7},
                                       {8, 8, 64, 16},
                                       {4, 1, 40, 6},
                                       {2, 2, 8, 2},
                                       {4, 2, 100, 4},
                                       {4, 2, 72, 16},
                                       {2, 2, 136, 32}}) {
    const auto [H, KV, D, bs] = shape;
    const std::vector<int64_t> lengths{1, 37, bs, 2 * bs + 1, 50, 3, bs + 1};
    const auto rows = static_cast<int64_t>(lengths.size());
    int64_t blocks = 0;
    for (auto len : lengths) blocks += (len + bs - 1) / bs;
    const auto order = torch::randperm(blocks, torch::kInt);
    std::vector<std::vector<int32_t>> tables;
    for (int64_t r = 0, next = 0; r < rows; ++r) {
      const int64_t n = (lengths[static_cast<size_t>(r)] + bs - 1) / bs;
      std::vector<int32_t> table;
      for (int64_t b = 0; b < n; ++b) table.push_back(order[next++].item<int32_t>());
      if (r == 4) table[0] = tables[1][0];  // a block shared with row 1
      tables.push_back(table);
    }
    std::vector<const int32_t*> table_ptrs;
    for (const auto& t : tables) table_ptrs.push_back(t.data());
    const auto k = torch::randn({blocks, KV, bs, D}), v = torch::randn({blocks, KV, bs, D});
    const auto q = torch::randn({rows, H * D}) * 2.0;
    for (auto isa : builds()) {
      KernelMode mode(isa);
      auto expected = torch::empty({rows, H * D});
      std::vector<float> scores(64);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t h = 0; h < H; ++h) {
          const int64_t kvh = h / (H / KV);
          decode::attend(q.data_ptr<float>() + r * H * D + h * D, k.data_ptr<float>() + kvh * bs * D,
                         v.data_ptr<float>() + kvh * bs * D, tables[static_cast<size_t>(r)].data(), bs, KV * bs * D, D,
                         lengths[static_cast<size_t>(r)], D, scores.data(),
                         expected.data_ptr<float>() + r * H * D + h * D);
        }
      }
      for (int threads : {1, 2, 3}) {
        INFO(decode::isa_name(isa) << " heads " << H << "/" << KV << " dim " << D << " block " << bs << ", " << threads
                                   << " threads");
        IntraOpThreads intra(threads);
        auto out = torch::full({rows, H * D}, std::numeric_limits<float>::quiet_NaN());
        decode::attend_rows(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), table_ptrs.data(),
                            lengths.data(), rows, H, KV, D, bs, out.data_ptr<float>());
        CHECK(std::memcmp(out.data_ptr<float>(), expected.data_ptr<float>(), out.nbytes()) == 0);
      }
      // attend() itself: softmax(q k^T / sqrt(dim)) v, here for the last row.
      const int64_t r = rows - 1, len = lengths.back();
      for (int64_t h = 0; h < H; ++h) {
        std::vector<at::Tensor> ks, vs;
        for (int64_t s = 0; s < len; ++s) {
          const int32_t block = tables.back()[static_cast<size_t>(s / bs)];
          ks.push_back(k[block][h / (H / KV)][s % bs]);
          vs.push_back(v[block][h / (H / KV)][s % bs]);
        }
        const auto qh = q[r].narrow(0, h * D, D);
        const auto p = torch::softmax(torch::stack(ks).matmul(qh) / std::sqrt(static_cast<double>(D)), 0);
        CHECK(torch::allclose(expected[r].narrow(0, h * D, D), p.matmul(torch::stack(vs)), 1e-5, 1e-5));
      }
    }
  }
}

TEST_CASE("the per-row kernels (RMSNorm, SiLU*up, argmax) keep the plain loops' results bit for bit") {
  torch::manual_seed(5);
  for (auto isa : builds()) {
    KernelMode mode(isa);
    for (int threads : {1, 2}) {
      INFO(decode::isa_name(isa) << ", " << threads << " threads");
      IntraOpThreads intra(threads);
      // RMSNorm: rows taken through an index, d not a multiple of 8, more rows than one side-by-side group.
      for (int64_t d : {5, 40, 512}) {
        const int64_t rows = 19;
        const auto x = torch::randn({rows + 3, d}), w = torch::randn({d});
        std::vector<int64_t> index;
        for (int64_t j = 0; j < rows; ++j) index.push_back((j * 7) % (rows + 3));
        auto out = torch::empty({rows, d});
        decode::rms_norm_rows(x.data_ptr<float>(), index.data(), rows, w.data_ptr<float>(), d, 1e-5F,
                              out.data_ptr<float>());
        auto expected = torch::empty({rows, d});
        for (int64_t j = 0; j < rows; ++j) {
          const float* xr = x.data_ptr<float>() + index[static_cast<size_t>(j)] * d;
          const auto mean = static_cast<float>(decode::sum_squares(xr, d) / static_cast<double>(d));
          const float r = 1.0F / std::sqrt(mean + 1e-5F);
          for (int64_t i = 0; i < d; ++i) expected[j][i] = w[i].item<float>() * (xr[i] * r);
        }
        CHECK(torch::equal(out, expected));
      }
      // SiLU*up over lengths around the vector widths: the same values as one AVX2 (or portable) call.
      for (int64_t n : {1, 7, 8, 15, 16, 17, 33, 5000, 40003}) {
        const auto gate = torch::randn({n}) * 4.0, up = torch::randn({n});
        auto ours = gate.clone();
        decode::silu_mul(ours.data_ptr<float>(), up.data_ptr<float>(), n);
        auto plain = gate.clone();
        {
          IntraOpThreads one(1);
          decode::limit_kernel_isa(std::min(isa, decode::Isa::kAvx2));
          decode::silu_mul(plain.data_ptr<float>(), up.data_ptr<float>(), n);
          decode::limit_kernel_isa(isa);  // back to this scope's build (KernelMode restores the best on exit)
        }
        CHECK(torch::equal(ours, plain));
        CHECK(torch::allclose(ours, gate * torch::sigmoid(gate) * up, 1e-5, 1e-6));
      }
    }
    // argmax: std::max_element's first maximum, with ties, signed zeros, -inf and NaN anywhere.
    for (int64_t n : {1, 15, 16, 17, 100, 32000}) {
      auto z = torch::randn({n});
      auto check = [&](const char* what) {
        INFO(decode::isa_name(isa) << " n " << n << ": " << what);
        const float* p = z.data_ptr<float>();
        CHECK(decode::argmax(p, n) == std::max_element(p, p + n) - p);
      };
      check("random");
      z.index_put_({torch::indexing::Slice(n / 3, torch::indexing::None, 5)}, z.max().item<float>());
      check("ties");
      z.fill_(-std::numeric_limits<float>::infinity());
      check("all -inf");
      z.zero_();
      z.index_put_({torch::indexing::Slice(0, torch::indexing::None, 2)}, -0.0F);
      check("signed zeros");
      z = torch::randn({n});
      z[n / 2] = std::numeric_limits<float>::quiet_NaN();
      check("a NaN in the middle");
      z[0] = std::numeric_limits<float>::quiet_NaN();
      check("a NaN first");
      if (n > 19) {
        z = torch::randn({n});
        z[3] = std::numeric_limits<float>::quiet_NaN();
        z[19] = 100.0F;  // in the NaN's vector lane
        check("a NaN in the first vector, the maximum in its lane");
      }
    }
  }
}

TEST_CASE("decode engine greedy tokens equal the reference generate on Llama and Qwen2 shapes") {
  for (const auto& config : {llama_config(), qwen2_config()}) {
    for (auto isa : builds()) {
      INFO(config.architecture << " kernels " << decode::isa_name(isa));
      KernelMode mode(isa);
      auto model = make_model(config, 21);
      GenerationOptions opts{.max_new_tokens = 24, .n = 2, .do_sample = false, .return_log_probs = true};
      auto reference = generate(model, prompt_batch(kPrompts), opts);
      CHECK(reference.batch["response_mask"].sum().item<int64_t>() >= 8 * 12);  // long responses, not an early EOS
      opts.engine = GenerationEngine::kDecode;
      opts.decode.block_size = 4;  // many blocks, partial prompt blocks copied for the second sample
      auto fast = generate(model, prompt_batch(kPrompts), opts);
      CHECK(torch::equal(fast.batch["responses"], reference.batch["responses"]));
      CHECK(torch::equal(fast.batch["response_mask"], reference.batch["response_mask"]));
      CHECK(torch::equal(fast.batch["input_ids"], reference.batch["input_ids"]));
      CHECK(torch::equal(fast.batch["position_ids"], reference.batch["position_ids"]));
      CHECK(torch::equal(fast.batch["attention_mask"], reference.batch["attention_mask"]));
      CHECK(torch::allclose(fast.batch["rollout_log_probs"], reference.batch["rollout_log_probs"], 1e-4, 1e-4));
    }
  }
}

TEST_CASE("continuous batching with few slots gives the tokens of one batch with all rows") {
  auto model = make_model(qwen2_config(), 22);
  GenerationOptions opts{.max_new_tokens = 20, .n = 3, .do_sample = false, .engine = GenerationEngine::kDecode};
  auto all = generate(model, prompt_batch(kPrompts), opts);
  opts.decode = DecodeEngineOptions{.max_batch = 4, .block_size = 3, .max_prefill_tokens = 1};
  auto few = generate(model, prompt_batch(kPrompts), opts);
  CHECK(torch::equal(all.batch["responses"], few.batch["responses"]));
  opts.decode = DecodeEngineOptions{.max_batch = 5, .share_prefix = false};
  CHECK(torch::equal(all.batch["responses"], generate(model, prompt_batch(kPrompts), opts).batch["responses"]));
}

TEST_CASE("decode engine sampling is reproducible for a seed and does not depend on the batch") {
  auto model = make_model(llama_config(), 23);
  auto prompts = prompt_batch(kPrompts);
  prompts.non_tensor_batch["uid"] = dataproto::Column{"a", "b", "c", "d"};
  GenerationOptions opts{.max_new_tokens = 12,
                         .n = 4,
                         .sampling = {.temperature = 1.0, .top_p = 0.95},
                         .seed = 9,
                         .return_log_probs = true,
                         .engine = GenerationEngine::kDecode};
  auto first = generate(model, prompts, opts);
  CHECK(torch::equal(first.batch["responses"], generate(model, prompts, opts).batch["responses"]));
  CHECK(first.non_tensor_batch.at("uid")[5] == std::string("b"));
  opts.decode = DecodeEngineOptions{.max_batch = 4, .block_size = 2, .share_prefix = false};
  auto small = generate(model, prompts, opts);
  CHECK(torch::equal(first.batch["responses"], small.batch["responses"]));
  CHECK(torch::allclose(first.batch["rollout_log_probs"], small.batch["rollout_log_probs"], 1e-5, 1e-6));
  CHECK_FALSE(torch::equal(first.batch["responses"][0], first.batch["responses"][1]));  // samples differ
  opts.seed = 10;
  CHECK_FALSE(torch::equal(first.batch["responses"], generate(model, prompts, opts).batch["responses"]));
}

TEST_CASE("the engine's kernels run on the intra-op threads and their results do not depend on how many") {
  // A file compiled without OpenMP turns LibTorch's at::parallel_for into a plain loop on the
  // calling thread: decode::parallel_for must reach the other threads.
  {
    IntraOpThreads threads(2);
    std::mutex m;
    std::set<int> seen;
    decode::parallel_for(0, 64, 1, [&](int64_t, int64_t) {
      std::lock_guard<std::mutex> lock(m);
      seen.insert(at::get_thread_num());
    });
    CHECK(seen == std::set<int>{0, 1});
  }
  auto model = make_model(llama_config(), 26);
  GenerationOptions opts{.max_new_tokens = 12,
                         .n = 3,
                         .sampling = {.temperature = 1.0},
                         .seed = 4,
                         .return_log_probs = true,
                         .engine = GenerationEngine::kDecode};
  DataProto one;
  {
    IntraOpThreads threads(1);
    one = generate(model, prompt_batch(kPrompts), opts);
  }
  for (int n : {2, 3}) {
    INFO(n << " threads");
    IntraOpThreads threads(n);
    auto many = generate(model, prompt_batch(kPrompts), opts);
    CHECK(torch::equal(one.batch["responses"], many.batch["responses"]));
    CHECK(torch::equal(one.batch["rollout_log_probs"], many.batch["rollout_log_probs"]));
  }
}

TEST_CASE("decode engine rollout log-probs equal the actor's recomputation") {
  auto model = make_model(qwen2_config(), 24);
  const double temperature = 0.8;
  auto out = generate(model, prompt_batch(kPrompts),
                      GenerationOptions{.max_new_tokens = 10,
                                        .n = 2,
                                        .sampling = {.temperature = temperature, .top_k = 20},
                                        .seed = 5,
                                        .return_log_probs = true,
                                        .engine = GenerationEngine::kDecode});
  torch::NoGradGuard g;
  auto scores = compute_response_scores(model, out, ScoreOptions{.temperature = temperature});
  auto mask = out.batch["response_mask"].to(torch::kBool);
  CHECK(torch::allclose(scores.log_probs.masked_fill(~mask, 0), out.batch["rollout_log_probs"], 1e-4, 1e-5));
  // and the batch trains: no inference-mode tensor leaks out
  auto grad_scores = compute_response_scores(model, out);
  (void)grad_scores;
}

TEST_CASE("the n samples of a prompt share its prefill and its full KV blocks") {
  auto model = make_model(qwen2_config(), 25);
  std::vector<int64_t> prompt(37);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int64_t>(3 + i % 30);
  DecodeSampling sampling{.sampling = {.greedy = true}};
  auto run = [&](int64_t n, bool share) {
    DecodeEngine engine(model, DecodeEngineOptions{.block_size = 8, .share_prefix = share});
    auto out = engine.run({DecodeRequest{.prompt = prompt, .n = n, .max_new_tokens = 6}}, sampling);
    CHECK(static_cast<int64_t>(out.size()) == n);
    for (const auto& o : out) CHECK(o.tokens == out[0].tokens);  // greedy samples agree
    return engine.stats();
  };
  const auto one = run(1, true), shared = run(8, true), copied = run(8, false);
  CHECK(shared.prefill_tokens == one.prefill_tokens);
  CHECK(copied.prefill_tokens == 8 * one.prefill_tokens);
  // 37 + 5 cached positions in blocks of 8: 6 blocks alone; shared: 4 full prompt blocks once,
  // then per sample its copy of the partial block and one more for the response.
  CHECK(one.peak_kv_blocks == 6);
  CHECK(shared.peak_kv_blocks == 4 + 8 * 2);
  CHECK(copied.peak_kv_blocks == 8 * 6);
}

TEST_CASE("a decode engine reused after an in-place weight update decodes with the new weights") {
  auto model = make_model(llama_config(), 26);
  DecodeEngine engine(model);
  DecodeSampling sampling{.sampling = {.greedy = true}, .eos_token_ids = {2}};
  const std::vector<DecodeRequest> requests{DecodeRequest{.prompt = {4, 5, 6}, .max_new_tokens = 12}};
  auto before = engine.run(requests, sampling);
  {
    torch::NoGradGuard g;
    for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.1);
  }
  auto after = engine.run(requests, sampling);
  auto reference = generate(model, prompt_batch({{4, 5, 6}}),
                            GenerationOptions{.max_new_tokens = 12, .do_sample = false, .eos_token_ids = {2}});
  std::vector<int64_t> expected;
  for (int64_t t = 0; t < 12; ++t) {
    if (reference.batch["response_mask"][0][t].item<int64_t>() == 0) break;
    expected.push_back(reference.batch["responses"][0][t].item<int64_t>());
  }
  CHECK(after[0].tokens == expected);
  CHECK(after[0].tokens != before[0].tokens);
}

namespace {

at::Tensor parameter(CausalLM& model, const std::string& name) {
  for (auto& item : model->named_parameters()) {
    if (item.key() == name) return item.value();
  }
  FAIL("no parameter " << name);
  return {};
}

// The engine's outputs equal those of a new engine (which packs everything) on the model as it is now.
void check_fresh(CausalLM& model, DecodeEngine& engine, const std::vector<DecodeOutput>& got) {
  DecodeEngine fresh(model);
  const DecodeSampling sampling{.sampling = {.temperature = 1.0}, .seed = 3, .return_log_probs = true};
  const auto expected = fresh.run({DecodeRequest{.prompt = {4, 5, 6}, .n = 2, .max_new_tokens = 10}}, sampling);
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].tokens == expected[i].tokens);
    CHECK(got[i].log_probs == expected[i].log_probs);  // the same kernels on the same weights: bit for bit
  }
  CHECK(engine.packed_bytes() == fresh.packed_bytes());
}

}  // namespace

TEST_CASE("the engine's packed weights follow every change of the parameters and are reused otherwise") {
  for (const auto& config : {llama_config(), qwen2_config()}) {
    INFO(config.architecture << (config.tie_word_embeddings ? " tied" : " untied"));
    auto model = make_model(config, 28);
    const int64_t matrices = 7 * config.num_hidden_layers + 1;  // q k v o gate up down per layer, and the head
    DecodeEngine engine(model);
    const DecodeSampling sampling{.sampling = {.temperature = 1.0}, .seed = 3, .return_log_probs = true};
    const std::vector<DecodeRequest> requests{DecodeRequest{.prompt = {4, 5, 6}, .n = 2, .max_new_tokens = 10}};
    auto run = [&] { return engine.run(requests, sampling); };

    auto outputs = run();
    CHECK(engine.stats().packed_weights == matrices);
    CHECK(engine.packed_bytes() >= 4 * config.vocab_size * config.hidden_size);
    check_fresh(model, engine, outputs);
    outputs = run();
    CHECK(engine.stats().packed_weights == 0);  // nothing changed: nothing repacked
    check_fresh(model, engine, outputs);

    const std::string layer = "model.layers.1.";
    DYNAMIC_SECTION(config.architecture << ": an optimizer-style in-place update without grad") {
      {
        torch::NoGradGuard g;
        parameter(model, layer + "self_attn.q_proj.weight").add_(0.3);
      }
      outputs = run();
      CHECK(engine.stats().packed_weights == 1);
      check_fresh(model, engine, outputs);
    }
    DYNAMIC_SECTION(
        config.architecture << ": load_parameters (copy_) inside inference mode, as the rollout's weight sync does") {
      const auto name = layer + "mlp.down_proj.weight";
      auto replacement = parameter(model, name).detach().clone().normal_(0.0, 0.3);
      {
        c10::InferenceMode inference;
        load_parameters(*model, {{name, replacement}}, "test", {"model", "lm_head"});
      }
      CHECK(torch::equal(parameter(model, name), replacement));
      outputs = run();
      CHECK(engine.stats().packed_weights == 1);
      check_fresh(model, engine, outputs);
    }
    DYNAMIC_SECTION(config.architecture << ": a parameter given new storage (set_data), then updated in place") {
      auto w = parameter(model, layer + "self_attn.v_proj.weight");
      w.set_data(w.detach().clone() * 2.0);
      outputs = run();
      CHECK(engine.stats().packed_weights == 1);
      check_fresh(model, engine, outputs);
      {
        torch::NoGradGuard g;
        w.mul_(0.5);
      }
      outputs = run();
      CHECK(engine.stats().packed_weights == 1);
      check_fresh(model, engine, outputs);
    }
    DYNAMIC_SECTION(config.architecture << ": the embedding (the head too when tied)") {
      {
        torch::NoGradGuard g;
        parameter(model, "model.embed_tokens.weight").mul_(1.5);
      }
      outputs = run();
      CHECK(engine.stats().packed_weights == (config.tie_word_embeddings ? 1 : 0));
      check_fresh(model, engine, outputs);
    }
    DYNAMIC_SECTION(config.architecture << ": drop_packed_weights repacks everything (for writes that bypass ATen)") {
      auto w = parameter(model, layer + "mlp.up_proj.weight");
      std::vector<float> values(static_cast<size_t>(w.numel()), 0.01F);
      std::memcpy(w.data_ptr<float>(), values.data(), values.size() * sizeof(float));  // no version bump
      engine.drop_packed_weights();
      outputs = run();
      CHECK(engine.stats().packed_weights == matrices);
      check_fresh(model, engine, outputs);
    }
  }
}

TEST_CASE("decode engine rejects bad requests and generate falls back for prompts it cannot run") {
  auto model = make_model(llama_config(), 27);
  DecodeEngine engine(model);
  DecodeSampling greedy{.sampling = {.greedy = true}};
  CHECK_THROWS_AS(engine.run({DecodeRequest{}}, greedy), ValueError);
  CHECK_THROWS_WITH(engine.run({DecodeRequest{.prompt = {1, 99}}}, greedy), Catch::Contains("token id 99"));
  CHECK_THROWS_WITH(engine.run({DecodeRequest{.prompt = {1}, .positions = {0, 1}}}, greedy),
                    Catch::Contains("2 positions for 1 prompt tokens"));
  CHECK_THROWS_WITH(engine.run({DecodeRequest{.prompt = {1}, .n = 0}}, greedy), Catch::Contains("n must be > 0"));
  CHECK_THROWS_AS(DecodeEngine(model, DecodeEngineOptions{.block_size = 0}), ValueError);

  // right-padded prompts (the last column is padding in one row) run the reference path
  auto prompts = prompt_batch(kPrompts);
  prompts.batch.at("attention_mask")[3][prompts.batch.at("attention_mask").size(1) - 1] = 0;
  GenerationOptions opts{.max_new_tokens = 4, .do_sample = false};
  auto reference = generate(model, prompts, opts);
  opts.engine = GenerationEngine::kDecode;
  CHECK(torch::equal(reference.batch["responses"], generate(model, prompts, opts).batch["responses"]));
}

// ---- the KV pool's size (issue 27.3) ----

namespace {

std::vector<DecodeRequest> pool_requests() {
  std::vector<DecodeRequest> out;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    out.push_back(DecodeRequest{
        .prompt = kPrompts[i], .n = 2, .max_new_tokens = 24, .first_row_id = static_cast<int64_t>(2 * i)});
  }
  return out;
}

// KV blocks request r of pool_requests() can reach with block size 4 and prefix sharing.
int64_t pool_need(const DecodeRequest& r, int64_t bs) {
  const auto len = static_cast<int64_t>(r.prompt.size());
  const int64_t shared = len / bs, reach = (len + r.max_new_tokens + bs - 1) / bs;
  return shared + r.n * (reach - shared);
}

bool same_tokens(const std::vector<DecodeOutput>& a, const std::vector<DecodeOutput>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].tokens != b[i].tokens) return false;
  return true;
}

}  // namespace

TEST_CASE("the KV pool fits a byte budget: requests wait for blocks, greedy tokens do not change (both backends)") {
  auto model = make_model(qwen2_config(), 41);
  const DecodeSampling greedy{.sampling = {.greedy = true}, .eos_token_ids = {}};
  const auto requests = pool_requests();
  for (auto backend : {DecodeBackend::kKernels, DecodeBackend::kAten}) {
    INFO((backend == DecodeBackend::kAten ? "aten" : "kernels"));
    // verl's max_num_seqs default: a cap of 1024 sequences must not size the pool for 1024.
    DecodeEngine unbounded(model, {.max_batch = 1024, .block_size = 4, .backend = backend});
    const auto expected = unbounded.run(requests, greedy);
    const int64_t block_bytes = unbounded.stats().kv_block_bytes;
    int64_t all = 0, largest = 0;
    for (const auto& r : requests) {
      all += pool_need(r, 4);
      largest = std::max(largest, pool_need(r, 4));
    }
    CHECK(unbounded.stats().kv_pool_blocks == all);  // every request at once, not 1024 x the longest
    CHECK(unbounded.kv_pool_bytes() == all * block_bytes);
    CHECK(unbounded.stats().kv_pool_budget == 0);

    // A budget of the largest request plus a little: one request at a time, mostly.
    const int64_t budget = largest * block_bytes + block_bytes / 2;
    DecodeEngine bounded(model, {.block_size = 4, .backend = backend, .kv_cache_bytes = budget});
    const auto got = bounded.run(requests, greedy);
    CHECK(same_tokens(got, expected));
    CHECK(bounded.stats().kv_pool_budget == budget);
    CHECK(bounded.stats().kv_pool_blocks == largest);
    CHECK(bounded.kv_pool_bytes() <= budget);
    CHECK(bounded.stats().peak_kv_blocks <= largest);
    CHECK(bounded.stats().steps > unbounded.stats().steps);  // the requests took turns

    // A bigger run on the same engine stays within the budget too (the pool is not grown past it).
    auto twice = requests;
    for (auto r : requests) twice.push_back(r);
    bounded.run(twice, greedy);
    CHECK(bounded.kv_pool_bytes() <= budget);

    // A request that can never fit is an error naming the sizes, before anything runs.
    DecodeEngine small(model, {.block_size = 4, .backend = backend, .kv_cache_bytes = (largest - 1) * block_bytes});
    CHECK_THROWS_WITH(small.run(requests, greedy),
                      Catch::Contains("request 0") && Catch::Contains(std::to_string(largest) + " KV blocks") &&
                          Catch::Contains("holds " + std::to_string(largest - 1) + " blocks"));
  }
}

TEST_CASE("gpu_memory_utilization sizes the pool from the injected device memory report (vLLM's rule)") {
  CHECK(kv_budget_bytes(0.5, {.free = 600, .total = 1000}) == 100);       // 500 allowed - 400 in use
  CHECK(kv_budget_bytes(0.5, {.free = 600, .total = 1000}, 150) == 250);  // the pool held counts as free
  CHECK(kv_budget_bytes(1.0, {.free = 1000, .total = 1000}) == 1000);
  CHECK_THROWS_WITH(kv_budget_bytes(0.3, {.free = 600, .total = 1000}),
                    Catch::Contains("400 bytes are already in use"));
  CHECK_THROWS_AS(kv_budget_bytes(0.0, {.free = 600, .total = 1000}), ValueError);
  CHECK_THROWS_AS(kv_budget_bytes(1.5, {.free = 600, .total = 1000}), ValueError);
  CHECK_THROWS_AS(kv_budget_bytes(0.5, {.free = 1200, .total = 1000}), ValueError);

  auto model = make_model(llama_config(), 42);
  const DecodeSampling greedy{.sampling = {.greedy = true}};
  const auto requests = pool_requests();
  DecodeEngine sizing(model, {.block_size = 4});
  const auto expected = sizing.run(requests, greedy);
  const int64_t block_bytes = sizing.stats().kv_block_bytes;
  int64_t largest = 0;
  for (const auto& r : requests) largest = std::max(largest, pool_need(r, 4));

  const int64_t total = int64_t{1} << 30;
  const int64_t room = (largest + 1) * block_bytes;  // what utilization x total leaves beyond the memory in use
  std::vector<c10::Device> asked;
  const DecodeEngine* self = nullptr;  // the device also holds this engine's own pool
  DecodeEngineOptions options{.block_size = 4, .gpu_memory_utilization = 0.5};
  options.memory_info = [&](const c10::Device& device) {
    asked.push_back(device);
    const int64_t others = total / 2 - room;
    return DeviceMemory{.free = total - others - (self ? self->kv_pool_bytes() : 0), .total = total};
  };
  DecodeEngine engine(model, options);
  self = &engine;
  CHECK(same_tokens(engine.run(requests, greedy), expected));
  REQUIRE(asked.size() == 1);
  CHECK(asked[0] == c10::Device(c10::kCPU));
  CHECK(engine.stats().kv_pool_budget == room);
  CHECK(engine.stats().kv_pool_blocks == largest + 1);
  CHECK(engine.kv_pool_bytes() <= room);
  // the second run counts the pool it holds as free: the same budget, the same pool
  CHECK(same_tokens(engine.run(requests, greedy), expected));
  CHECK(engine.stats().kv_pool_budget == room);
  CHECK(asked.size() == 2);
  self = nullptr;
  // the smaller of the two budgets wins
  options.kv_cache_bytes = largest * block_bytes;
  DecodeEngine both(model, options);
  both.run(requests, greedy);
  CHECK(both.stats().kv_pool_budget == largest * block_bytes);
  // a CPU model without a memory report ignores gpu_memory_utilization
  DecodeEngine cpu(model, {.block_size = 4, .gpu_memory_utilization = 0.5});
  cpu.run(requests, greedy);
  CHECK(cpu.stats().kv_pool_budget == 0);
  CHECK_THROWS_AS(DecodeEngine(model, {.gpu_memory_utilization = 1.5}), ValueError);
  CHECK_THROWS_AS(DecodeEngine(model, {.kv_cache_bytes = -1}), ValueError);
}

TEST_CASE("free_cache releases the KV pool and the scratch; the next run remakes them and gives the same tokens") {
  auto model = make_model(qwen2_config(), 43);
  const DecodeSampling greedy{.sampling = {.greedy = true}};
  for (auto backend : {DecodeBackend::kKernels, DecodeBackend::kAten}) {
    INFO((backend == DecodeBackend::kAten ? "aten" : "kernels"));
    DecodeEngine engine(model, {.block_size = 4, .backend = backend});
    const auto first = engine.run(pool_requests(), greedy);
    const int64_t pool = engine.kv_pool_bytes();
    const int64_t packed = engine.packed_bytes();
    CHECK(pool > 0);
    engine.free_cache();
    CHECK(engine.kv_pool_bytes() == 0);
    CHECK(engine.packed_bytes() == packed);  // the packed weights stay
    CHECK(same_tokens(engine.run(pool_requests(), greedy), first));
    CHECK(engine.kv_pool_bytes() == pool);
    CHECK(engine.stats().packed_weights == 0);
  }
}
