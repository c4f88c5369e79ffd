// hyflow-model-merger merge --backend fsdp --local_dir <sharded checkpoint> --target_dir <out>
//
// verl's model_merger for hyflow's sharded checkpoints: reads fsdp_manifest.json and the shard
// files (any world size), rebuilds every parameter and writes a Hugging Face folder:
// config.json (from the manifest's extra.config, else <local_dir>/config.json) and
// model.safetensors in float32.
//
// LoRA (docs/lora.md): when <local_dir> is a PEFT adapter folder (adapter_config.json +
// adapter_model.safetensors) or a checkpoint holding one in lora_adapter/, the adapter is merged
// into its base model (--base_dir, default the adapter's base_model_name_or_path) and the merged
// model is written in Hugging Face format (W + lora_alpha / r * B A; a value model keeps its
// trained score head).
#include <hyflow/core/error.hpp>
#include <hyflow/models/checkpoint.hpp>
#include <hyflow/models/config.hpp>
#include <hyflow/models/lora.hpp>
#include <hyflow/models/safetensors.hpp>
#include <hyflow/parallel/fsdp_checkpoint.hpp>

#include <filesystem>
#include <iostream>
#include <map>
#include <string>

namespace fs = std::filesystem;

namespace {

constexpr const char* kUsage =
    "usage: hyflow-model-merger merge --backend fsdp --local_dir <sharded checkpoint | PEFT adapter folder> "
    "--target_dir <output folder> [--base_dir <base model folder> (LoRA)]\n";

// <dir> itself or <dir>/lora_adapter when it holds a PEFT adapter; empty otherwise.
fs::path adapter_dir(const fs::path& dir) {
  for (const auto& d : {dir, dir / "lora_adapter"})
    if (fs::exists(d / hyflow::models::kAdapterConfigFile)) return d;
  return {};
}

int merge_lora(const fs::path& adapter, std::string base_dir, const fs::path& target_dir) {
  namespace m = hyflow::models;
  const auto file = m::read_adapter_config(adapter);
  if (base_dir.empty()) base_dir = file.base_model_name_or_path;
  if (base_dir.empty() || !fs::exists(fs::path(base_dir) / "config.json"))
    throw hyflow::ValueError("LoRA adapter " + adapter.string() + ": its base model '" + base_dir +
                             "' is not a local Hugging Face folder; pass --base_dir");
  const auto config = m::load_config(base_dir);
  const auto merge = [&](auto model) {
    m::apply_adapter(*model, adapter);
    return m::merged_parameters(*model);
  };
  const m::NamedTensors merged = file.task_type == "TOKEN_CLS"
                                     ? merge(m::load_value_model(base_dir, {.dtype = at::kFloat}))
                                     : merge(m::load_causal_lm(base_dir, {.dtype = at::kFloat}));
  auto out_config = config;
  out_config.torch_dtype = "float32";
  fs::create_directories(target_dir);
  m::write_safetensors(target_dir / "model.safetensors", merged);
  m::save_config(out_config, target_dir / "config.json");
  std::cout << "merged LoRA adapter " << adapter << " (r=" << file.lora.rank << ") into " << base_dir << ": "
            << merged.size() << " tensors in " << target_dir << "\n";
  return 0;
}

int merge(const fs::path& local_dir, const fs::path& target_dir) {
  nlohmann::json extra;
  auto parameters = hyflow::parallel::load_sharded_parameters(local_dir, &extra);
  hyflow::models::ModelConfig config;
  if (extra.is_object() && extra.contains("config")) {
    config = hyflow::models::config_from_json(extra.at("config"), (local_dir / "fsdp_manifest.json").string());
  } else if (fs::exists(local_dir / "config.json")) {
    config = hyflow::models::load_config(local_dir);
  } else {
    throw hyflow::FormatError("'" + local_dir.string() +
                              "' has neither extra.config in fsdp_manifest.json nor a config.json");
  }
  config.torch_dtype = "float32";
  fs::create_directories(target_dir);
  hyflow::models::NamedTensors tensors;
  for (auto& p : parameters) tensors.emplace_back(p.name, p.tensor);
  hyflow::models::write_safetensors(target_dir / "model.safetensors", tensors);
  hyflow::models::save_config(config, target_dir / "config.json");
  std::cout << "merged " << tensors.size() << " tensors from " << local_dir << " into " << target_dir << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) != "merge") {
    std::cerr << kUsage;
    return 2;
  }
  std::map<std::string, std::string> args{{"--backend", "fsdp"}};
  for (int i = 2; i < argc; ++i) {
    const std::string key = argv[i];
    if (!args.count(key) && key != "--local_dir" && key != "--target_dir" && key != "--base_dir") {
      std::cerr << "hyflow-model-merger: unknown argument '" << key << "'\n" << kUsage;
      return 2;
    }
    if (i + 1 >= argc) {
      std::cerr << "hyflow-model-merger: '" << key << "' needs a value\n" << kUsage;
      return 2;
    }
    args[key] = argv[++i];
  }
  if (args.at("--backend") != "fsdp" || !args.count("--local_dir") || !args.count("--target_dir")) {
    std::cerr << "hyflow-model-merger: needs --backend fsdp, --local_dir and --target_dir\n" << kUsage;
    return 2;
  }
  try {
    const auto adapter = adapter_dir(args.at("--local_dir"));
    const std::string base_dir = args.count("--base_dir") ? args.at("--base_dir") : "";
    if (!adapter.empty()) return merge_lora(adapter, base_dir, args.at("--target_dir"));
    if (args.count("--base_dir")) {
      std::cerr << "hyflow-model-merger: --base_dir is for LoRA adapters; " << args.at("--local_dir")
                << " holds none\n";
      return 2;
    }
    return merge(args.at("--local_dir"), args.at("--target_dir"));
  } catch (const std::exception& e) {
    std::cerr << "hyflow-model-merger: " << e.what() << "\n";
    return 1;
  }
}
