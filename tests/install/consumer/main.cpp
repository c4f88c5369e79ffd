// Uses one symbol of every installed hyflow library, so that each one links and loads.
#include <hyflow/actors/resource_pool.hpp>
#include <hyflow/algos/torch_functional.hpp>
#include <hyflow/cluster/node_info.hpp>
#include <hyflow/core/suggest.hpp>
#include <hyflow/cuda/log_probs.hpp>
#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/inference/decode_engine.hpp>
#include <hyflow/models/config.hpp>
#include <hyflow/models/llama.hpp>
#include <hyflow/parallel/seqlen_balancing.hpp>
#include <hyflow/rollout/rollout_registry.hpp>
#include <hyflow/tokenizers/char_tokenizer.hpp>
#include <hyflow/tracking/tracker_registry.hpp>
#include <hyflow/trainer/config.hpp>
#include <hyflow/workers/register.hpp>

#include <ATen/ATen.h>

#include <iostream>

int main() {
  int failures = 0;
  auto check = [&](bool ok, const char* what) {
    if (!ok) {
      std::cerr << "consumer: " << what << " failed\n";
      ++failures;
    }
  };
  check(hyflow::closest_name("tset", {"test", "other"}) == "test", "core closest_name");
  hyflow::DataProto batch(hyflow::TensorDict{{"x", at::ones({4, 3})}});
  check(hyflow::DataProto::concat(batch.chunk(2)).size() == 4, "dataproto chunk/concat");
  check(hyflow::ResourcePool({2, 2}).world_size() == 4, "actors ResourcePool");
  check(hyflow::cluster::parse_node_list("127.0.0.1:7000, 127.0.0.1:7001").size() == 2, "cluster parse_node_list");
  check(hyflow::algos::core_algos::masked_mean(at::ones({2, 3}), at::ones({2, 3})).item<double>() == 1.0,
        "algos masked_mean");
  check(hyflow::parallel::seqlen_balancing::calculate_workload(std::vector<int64_t>{1, 2}).size() == 2,
        "parallel calculate_workload");
  check(hyflow::cuda::entropy_from_logits(at::zeros({1, 2, 4})).numel() == 2, "cuda entropy_from_logits");
  hyflow::tokenizers::CharTokenizer tokenizer;
  check(tokenizer.decode(tokenizer.encode("1+2=3")) == "1+2=3", "tokenizers CharTokenizer");
  hyflow::models::CausalLM model(hyflow::models::tiny_config(tokenizer.vocab_size()));
  check(model->config().vocab_size == tokenizer.vocab_size(), "models CausalLM");
  check(hyflow::inference::DecodeEngine::kernels_support(model), "inference DecodeEngine::kernels_support");
  check(hyflow::rollout::has_rollout_backend("hf"), "rollout has_rollout_backend");
  check(hyflow::tracking::has_tracker("jsonl"), "tracking has_tracker");
  hyflow::workers::register_workers();
  hyflow::trainer::Config config;
  check(config.get_int("data.train_batch_size") > 0, "trainer Config");
  if (failures) return 1;
  std::cout << "consumer: ok\n";
  return 0;
}
