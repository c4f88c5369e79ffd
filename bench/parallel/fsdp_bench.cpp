// FSDP on this machine (issue 12): a ~48M-parameter Llama-shaped decoder LM (models'
// bench_50m_config) trained by N = 2 and 4 ranks over gloo with the sharding engine
// (hyflow/parallel/fsdp.hpp) and the sharded AdamW, for FULL_SHARD, SHARD_GRAD_OP and NO_SHARD:
//   - per-rank bytes of parameters + gradients + optimizer state (the storages the engine, the
//     model and the optimizer hold, each counted once), at rest after a step and the largest
//     sample during a step, against NO_SHARD (goal: <= 1/N of it plus one unit's full
//     parameters, +5%); the peak is the larger of this program's samples at unit boundaries and
//     the engine's own (FsdpModule::peak_held_bytes) plus the optimizer state;
//   - step time (forward + backward + optimizer on a fixed global batch) against NO_SHARD (goal
//     <= 1.3x) and against PyTorch DDP over gloo on the same model and batch
//     (fsdp_ddp_peer.py, one process per rank, launched by this program in the same run);
//   - the rollout handoff (unshard_all: one all-gather per unit, the next in flight) in bytes/s
//     against one all-gather of the same bytes on the same process group (goal >= 80%).
// Ranks are threads of this process, each with its own gloo group over one TCP store; LibTorch
// runs one intra-op thread (torch::set_num_threads(1)), so each rank computes on its own thread.
//
// Usage: fsdp_bench [--ranks 2,4] [--steps 3] [--batch 8] [--seq 32] [--no-peer] [--quick]
#include "bench_json.hpp"

#include <hyflow/core/net.hpp>
#include <hyflow/models/config.hpp>
#include <hyflow/models/llama.hpp>
#include <hyflow/parallel/fsdp.hpp>
#include <hyflow/parallel/process_group.hpp>
#include <hyflow/parallel/sharded_optimizer.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifndef HYFLOW_FSDP_PEER_SCRIPT
#error "HYFLOW_FSDP_PEER_SCRIPT must name fsdp_ddp_peer.py"
#endif

using namespace hyflow;
using parallel::FsdpModule;
using parallel::ProcessGroup;
using parallel::ShardingStrategy;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::vector<int> ranks{2, 4};
  int steps = 3;      // timed steps after one warm-up step
  int64_t batch = 8;  // global batch (sequences), split evenly over the ranks
  int64_t seq = 32;
  bool peer = true;
};

std::string loadavg() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Bytes of parameters + gradients + optimizer state this rank holds now: every storage of the
// model's parameters and their gradients, the engine's master shards and their gradients and
// the optimizer's state, each storage counted once (NO_SHARD's parameters share the shards'
// storage; a freed full parameter has a storage of 0 bytes).
int64_t held_bytes(const models::CausalLM& model, const FsdpModule& fsdp, const parallel::ShardedOptimizer& optimizer) {
  std::set<const void*> seen;
  int64_t bytes = 0;
  auto count = [&](const at::Tensor& t) {
    if (!t.defined() || !t.has_storage()) return;
    const auto* impl = t.storage().unsafeGetStorageImpl();
    if (!seen.insert(impl).second) return;
    bytes += static_cast<int64_t>(impl->nbytes());
  };
  for (const auto& p : model->parameters()) {
    count(p);
    count(p.grad());
  }
  for (const auto& s : fsdp.local_shards()) {
    count(s);
    count(s.grad());
  }
  for (const auto& s : optimizer.state_tensors()) count(s);
  return bytes;
}

struct StrategyResult {
  double step_s = 0;                // mean over the timed steps of the slowest rank's step
  int64_t rest_bytes = 0;           // largest rank, after the optimizer step (gradients still held)
  int64_t peak_bytes = 0;           // largest sample during a step, largest rank
  int64_t largest_unit = 0;         // full parameter bytes of the largest unit
  int64_t gathered_bytes = 0;       // bytes the handoff's all-gathers deliver (S x padded shards)
  double handoff_s = 0;             // best unshard_all
  double raw_gather_s = 0;          // best all-gather of the same bytes in one call
  int64_t unit_gathered_bytes = 0;  // the largest unit's all-gather
  double raw_unit_gather_s = 0;     // best all-gather of the largest unit's bytes
  double loss = 0;
};

// Runs fn(rank, group) on n threads, each with its own gloo group; rethrows a rank's error.
template <class Fn>
void run_ranks(int n, Fn fn) {
  const int port = pick_free_port();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r, std::make_shared<ProcessGroup>(parallel::ProcessGroupOptions{
                  .rank = r, .world_size = n, .master_port = port, .timeout = std::chrono::seconds(600)}));
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// TransformerImpl::forward without a KV cache, each decoder layer one unit (the roles' sharded
// forward, workers/src/fsdp_model.cpp, does the same), sampling the bytes held at every unit
// boundary in forward and, through hooks on the activations, in backward.
at::Tensor sharded_logits(models::CausalLM& model, FsdpModule& fsdp, const at::Tensor& ids,
                          const std::function<void()>& sample) {
  const auto& config = model->config();
  auto& transformer = *model->model;
  const int64_t T = ids.size(1);
  auto positions = torch::arange(T, ids.options()).unsqueeze(0).expand_as(ids);
  auto query_pos = torch::arange(0, T, ids.options()).view({T, 1});
  auto key_pos = torch::arange(0, T, ids.options()).view({1, T});
  auto blocked = (key_pos > query_pos).view({1, 1, T, T});
  fsdp.begin_forward();
  auto h = transformer.embed_tokens(ids);
  const models::RotaryEmbedding rotary(config.resolved_head_dim(), config.rope_theta, config.rope_scaling);
  auto [cos, sin] = rotary.cos_sin(positions, h.scalar_type());
  for (int64_t i = 0; i < static_cast<int64_t>(transformer.layers->size()); ++i) {
    auto* layer = transformer.layers[static_cast<size_t>(i)]->as<models::DecoderLayerImpl>();
    const int unit = fsdp.find_unit("model.layers." + std::to_string(i));
    h = fsdp.enter_unit(unit, h);
    sample();
    h.register_hook([sample](const at::Tensor&) { sample(); });  // backward: unit i's gradients done
    h = layer->forward(h, cos, sin, blocked, nullptr, i);
    h.register_hook([sample](const at::Tensor&) { sample(); });  // backward: unit i gathered again
    h = fsdp.exit_unit(unit, h);
    sample();
  }
  // the head through the engine, as the roles run it (workers/src/fsdp_model.cpp)
  const auto& weight = model->lm_head ? model->lm_head->weight : transformer.embed_tokens->weight;
  return fsdp.head(transformer.norm(h), weight, [&model](const at::Tensor& x) { return model->logits(x); });
}

StrategyResult run_strategy(int n, ShardingStrategy strategy, std::vector<models::CausalLM>& models,
                            const at::Tensor& batch, const Args& args) {
  std::vector<StrategyResult> per_rank(static_cast<size_t>(n));
  run_ranks(n, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    auto& model = models[static_cast<size_t>(rank)];
    auto& out = per_rank[static_cast<size_t>(rank)];
    const auto mesh = parallel::make_device_mesh(group, strategy == ShardingStrategy::no_shard ? 1 : -1, "bench");
    std::vector<parallel::NamedParameter> named;
    for (const auto& item : model->named_parameters()) named.push_back({item.key(), item.value()});
    auto units = parallel::units_by_layer(named, 0);
    int64_t unit_shard_numel = 0;  // the largest unit's shard, padded as the engine pads it
    for (const auto& u : units) {
      int64_t bytes = 0, shard = 0;
      for (const auto& p : u.parameters) {
        bytes += p.tensor.numel() * 4;
        const int64_t rows = p.tensor.dim() > 0 ? p.tensor.size(0) : 1;
        shard += (rows + n - 1) / n * (p.tensor.numel() / rows);
      }
      out.largest_unit = std::max(out.largest_unit, bytes);
      unit_shard_numel = std::max(unit_shard_numel, shard);
    }
    auto fsdp = std::make_shared<FsdpModule>(
        std::move(units), mesh,
        parallel::FsdpOptions{.reshard_after_forward = strategy != ShardingStrategy::shard_grad_op});
    if (fsdp->strategy() != strategy)
      throw Error(std::string("bench: the mesh gave ") + parallel::to_string(fsdp->strategy()) + ", not " +
                  parallel::to_string(strategy));
    parallel::OptimConfig optim;
    optim.lr = 1e-4;
    optim.lr_warmup_steps = 0;
    parallel::ShardedOptimizer optimizer(fsdp, optim, "bench.optim");

    const int64_t rows = batch.size(0) / n;
    const auto ids = batch.narrow(0, rank * rows, rows);
    int64_t peak = 0;
    auto sample = [&] { peak = std::max(peak, held_bytes(model, *fsdp, optimizer)); };
    std::vector<double> times;
    for (int step = 0; step <= args.steps; ++step) {
      group->barrier();
      const auto start = Clock::now();
      optimizer.zero_grad();
      fsdp->reset_peak();
      int64_t optimizer_bytes = 0;  // constant through forward and backward
      for (const auto& s : optimizer.state_tensors()) optimizer_bytes += s.numel() * s.element_size();
      auto logits = sharded_logits(model, *fsdp, ids, sample);
      const int64_t V = logits.size(-1);
      auto loss = torch::nn::functional::cross_entropy(logits.narrow(1, 0, ids.size(1) - 1).reshape({-1, V}),
                                                       ids.narrow(1, 1, ids.size(1) - 1).reshape({-1}));
      loss.backward();
      sample();  // the root unit's full gradients (the tied embedding's arrive last) are not reduced yet
      fsdp->finish_backward();
      sample();
      // the engine's own peak of parameters and gradients (it samples wherever it gathers or
      // forms a full tensor and before it frees one, inside the head's backward too)
      peak = std::max(peak, fsdp->peak_held_bytes() + optimizer_bytes);
      optimizer.step(1.0);
      sample();
      auto elapsed = torch::tensor({seconds_since(start)}, torch::kDouble);
      group->all_reduce(elapsed, parallel::ReduceOp::max);  // a step ends when its slowest rank ends
      if (step > 0) times.push_back(elapsed.item<double>());
      out.loss = loss.item<double>();
    }
    for (double t : times) out.step_s += t / static_cast<double>(times.size());
    out.rest_bytes = held_bytes(model, *fsdp, optimizer);
    out.peak_bytes = peak;

    if (strategy == ShardingStrategy::no_shard) return;
    // The handoff: every unit gathered into the model (what generate_sequences does before
    // generation), against one all-gather of the same bytes in one call on the same group.
    int64_t shard_numel = 0;
    for (const auto& s : fsdp->local_shards()) shard_numel += s.numel();
    out.gathered_bytes = shard_numel * n * 4;
    out.handoff_s = out.raw_gather_s = out.raw_unit_gather_s = 1e30;
    out.unit_gathered_bytes = unit_shard_numel * n * 4;
    auto input = torch::randn({shard_numel});
    auto output = torch::empty({shard_numel * n});
    auto unit_input = torch::randn({unit_shard_numel});
    auto unit_output = torch::empty({unit_shard_numel * n});
    for (int repeat = 0; repeat < 3; ++repeat) {
      group->barrier();
      auto start = Clock::now();
      fsdp->unshard_all();
      auto t = torch::tensor({seconds_since(start)}, torch::kDouble);
      group->all_reduce(t, parallel::ReduceOp::max);
      out.handoff_s = std::min(out.handoff_s, t.item<double>());
      fsdp->reshard_all();
      group->barrier();
      start = Clock::now();
      group->all_gather_into_tensor(output, input);
      t = torch::tensor({seconds_since(start)}, torch::kDouble);
      group->all_reduce(t, parallel::ReduceOp::max);
      out.raw_gather_s = std::min(out.raw_gather_s, t.item<double>());
      group->barrier();
      start = Clock::now();
      group->all_gather_into_tensor(unit_output, unit_input);
      t = torch::tensor({seconds_since(start)}, torch::kDouble);
      group->all_reduce(t, parallel::ReduceOp::max);
      out.raw_unit_gather_s = std::min(out.raw_unit_gather_s, t.item<double>());
    }
  });
  StrategyResult r = per_rank[0];
  for (const auto& p : per_rank) {
    r.rest_bytes = std::max(r.rest_bytes, p.rest_bytes);
    r.peak_bytes = std::max(r.peak_bytes, p.peak_bytes);
  }
  return r;
}

struct PeerResult {
  double step_s = 0;
  double loss = 0;
};

PeerResult run_peer(int n, const Args& args) {
  const char* python = std::getenv("HYFLOW_PYTHON");
  std::ostringstream cmd;
  cmd << (python ? python : "/usr/bin/python3") << " " << HYFLOW_FSDP_PEER_SCRIPT << " --ranks " << n << " --batch "
      << args.batch << " --seq " << args.seq << " --steps " << args.steps << " --port " << pick_free_port() << " 2>&1";
  FILE* pipe = ::popen(cmd.str().c_str(), "r");
  std::string text;
  char buf[4096];
  while (pipe && std::fgets(buf, sizeof buf, pipe)) text += buf;
  if (!pipe || ::pclose(pipe) != 0) throw Error("fsdp_bench: the DDP peer failed: " + cmd.str() + "\n" + text);
  const auto brace = text.rfind('{');
  if (brace == std::string::npos) throw Error("fsdp_bench: the DDP peer printed no result:\n" + text);
  const auto j = nlohmann::json::parse(text.substr(brace));
  return {j.at("mean_step_s").get<double>(), j.at("loss").get<double>()};
}

void emit(nlohmann::json line) {
  line["loadavg"] = loadavg();
  std::cout << line.dump() << std::endl;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw ValueError("fsdp_bench: " + arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--ranks") {
      a.ranks.clear();
      std::stringstream ss(next());
      for (std::string item; std::getline(ss, item, ',');) a.ranks.push_back(std::stoi(item));
    } else if (arg == "--steps") {
      a.steps = std::stoi(next());
    } else if (arg == "--batch") {
      a.batch = std::stoll(next());
    } else if (arg == "--seq") {
      a.seq = std::stoll(next());
    } else if (arg == "--no-peer") {
      a.peer = false;
    } else if (arg == "--quick") {
      a.steps = 1;
    } else {
      throw ValueError(
          "usage: fsdp_bench [--ranks 2,4] [--steps 3] [--batch 8] [--seq 32] [--no-peer] [--quick]"
          " (unknown argument '" +
          arg + "')");
    }
  }
  for (int n : a.ranks)
    if (n < 2 || a.batch % n != 0)
      throw ValueError("fsdp_bench: --ranks " + std::to_string(n) + " must be >= 2 and divide --batch " +
                       std::to_string(a.batch));
  if (a.steps < 1) throw ValueError("fsdp_bench: --steps must be >= 1");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse(argc, argv);
    torch::set_num_threads(1);  // one intra-op thread: each rank thread computes alone
    const auto config = models::bench_50m_config();
    torch::manual_seed(0);
    const auto batch = torch::randint(config.vocab_size, {args.batch, args.seq}, torch::kLong);
    int64_t num_params = 0;
    for (int n : args.ranks) {
      std::map<ShardingStrategy, StrategyResult> results;
      for (auto strategy :
           {ShardingStrategy::no_shard, ShardingStrategy::full_shard, ShardingStrategy::shard_grad_op}) {
        std::vector<models::CausalLM> models;  // every rank starts from the same weights
        for (int r = 0; r < n; ++r) {
          torch::manual_seed(1);
          models.emplace_back(config);
        }
        if (num_params == 0)
          for (const auto& p : models[0]->parameters()) num_params += p.numel();
        results[strategy] = run_strategy(n, strategy, models, batch, args);
      }
      const auto& base = results.at(ShardingStrategy::no_shard);
      const std::string shape = std::to_string(num_params / 1000) + "k params, N=" + std::to_string(n) +
                                " gloo rank threads, global batch " + std::to_string(args.batch) + "x" +
                                std::to_string(args.seq);
      for (auto strategy : {ShardingStrategy::full_shard, ShardingStrategy::shard_grad_op}) {
        const auto& r = results.at(strategy);
        const std::string name = parallel::to_string(strategy);
        const double goal = (static_cast<double>(base.rest_bytes) / n + static_cast<double>(r.largest_unit)) * 1.05;
        emit({{"bench", "fsdp_state_bytes"},
              {"case", name + " at rest after a step, " + shape},
              {"value", r.rest_bytes / 1e6},
              {"unit", "MB per rank"},
              {"peer", "NO_SHARD (same engine, same run)"},
              {"peer_value", base.rest_bytes / 1e6},
              {"ratio", static_cast<double>(base.rest_bytes) / static_cast<double>(r.rest_bytes)},
              {"goal_mb", goal / 1e6},
              {"largest_unit_mb", r.largest_unit / 1e6},
              {"goal_met", static_cast<double>(r.rest_bytes) <= goal}});
        const double peak_goal =
            (static_cast<double>(base.peak_bytes) / n + static_cast<double>(r.largest_unit)) * 1.05;
        emit({{"bench", "fsdp_step_peak_bytes"},
              {"case", name + " largest sample during a step, " + shape},
              {"value", r.peak_bytes / 1e6},
              {"unit", "MB per rank"},
              {"peer", "NO_SHARD (same engine, same run)"},
              {"peer_value", base.peak_bytes / 1e6},
              {"ratio", static_cast<double>(base.peak_bytes) / static_cast<double>(r.peak_bytes)},
              {"goal_mb", peak_goal / 1e6},
              {"goal_met", static_cast<double>(r.peak_bytes) <= peak_goal}});
        emit({{"bench", "fsdp_step_time"},
              {"case", name + " fwd+bwd+AdamW, " + shape},
              {"value", r.step_s},
              {"unit", "s"},
              {"peer", "NO_SHARD (same engine, same run)"},
              {"peer_value", base.step_s},
              {"ratio", base.step_s / r.step_s},
              {"x_of_no_shard", r.step_s / base.step_s},
              {"goal_met", r.step_s <= 1.3 * base.step_s},
              {"rank0_loss", r.loss},  // the same batch slice and weights: equal to NO_SHARD's
              {"no_shard_rank0_loss", base.loss}});
        const double handoff_bw = static_cast<double>(r.gathered_bytes) / r.handoff_s / 1e6;
        // the raw bandwidth: the better of one all-gather of the whole model's bytes and one of
        // the largest unit's bytes (the handoff's largest message), on the same group
        const double whole_bw = static_cast<double>(r.gathered_bytes) / r.raw_gather_s / 1e6;
        const double unit_bw = static_cast<double>(r.unit_gathered_bytes) / r.raw_unit_gather_s / 1e6;
        const double raw_bw = std::max(whole_bw, unit_bw);
        emit({{"bench", "fsdp_handoff_gather"},
              {"case",
               name + " unshard_all (unit by unit) of " + std::to_string(r.gathered_bytes / 1000000) + " MB, " + shape},
              {"value", handoff_bw},
              {"unit", "MB/s"},
              {"peer",
               "raw all_gather_into_tensor on the same group: best of the whole model's bytes in one call and "
               "the largest unit's"},
              {"peer_value", raw_bw},
              {"ratio", handoff_bw / raw_bw},
              {"handoff_s", r.handoff_s},
              {"raw_whole_mbs", whole_bw},
              {"raw_largest_unit_mbs", unit_bw},
              {"goal_met", handoff_bw >= 0.8 * raw_bw}});
      }
      if (args.peer) {
        // hyflow's linears run on oneDNN; the peer's on LibTorch's BLAS: FULL_SHARD once more with
        // the peer's kernels (nn::Linear) isolates the engine from the kernels
        std::vector<models::CausalLM> models;
        for (int r = 0; r < n; ++r) {
          torch::manual_seed(1);
          models.emplace_back(config);
        }
        models::set_onednn_linear(false);
        const auto same_kernels = run_strategy(n, ShardingStrategy::full_shard, models, batch, args);
        models::set_onednn_linear(true);
        const PeerResult peer = run_peer(n, args);
        emit({{"bench", "fsdp_step_time"},
              {"case", "FULL_SHARD fwd+bwd+AdamW, same kernels as the peer (nn::Linear), " + shape},
              {"value", same_kernels.step_s},
              {"unit", "s"},
              {"peer", "pytorch-1.13 DDP over gloo, one process per rank (fsdp_ddp_peer.py)"},
              {"peer_value", peer.step_s},
              {"ratio", peer.step_s / same_kernels.step_s}});
        for (auto strategy : {ShardingStrategy::no_shard, ShardingStrategy::full_shard}) {
          const auto& r = results.at(strategy);
          emit({{"bench", "fsdp_step_time"},
                {"case", std::string(parallel::to_string(strategy)) + " fwd+bwd+AdamW, " + shape},
                {"value", r.step_s},
                {"unit", "s"},
                {"peer", "pytorch-1.13 DDP over gloo, one process per rank (fsdp_ddp_peer.py)"},
                {"peer_value", peer.step_s},
                {"ratio", peer.step_s / r.step_s}});
        }
      }
    }
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
