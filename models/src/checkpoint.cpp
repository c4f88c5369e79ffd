#include <hyflow/models/checkpoint.hpp>

#include <hyflow/core/error.hpp>

#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>

namespace hyflow::models {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

std::string dtype_to_config_name(at::ScalarType t) {
  if (t == at::kBFloat16) return "bfloat16";
  if (t == at::kHalf) return "float16";
  return "float32";
}

at::ScalarType dominant_float_dtype(const NamedTensors& tensors) {
  for (const auto& [name, t] : tensors) {
    if (at::isFloatingType(t.scalar_type())) return t.scalar_type();
  }
  return at::kFloat;
}

std::string shard_name(int64_t i, int64_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05lld-of-%05lld.safetensors", static_cast<long long>(i),
                static_cast<long long>(n));
  return buf;
}

}  // namespace

NamedTensors load_checkpoint_tensors(const fs::path& dir) {
  if (fs::exists(dir / kSingleFile)) return read_safetensors(dir / kSingleFile);
  const auto index_path = dir / kIndexFile;
  if (!fs::exists(index_path)) {
    throw FormatError(dir.string() + ": neither " + kSingleFile + " nor " + kIndexFile + " found");
  }
  Json index;
  try {
    std::ifstream in(index_path);
    in >> index;
  } catch (const Json::exception& e) {
    throw FormatError(index_path.string() + ": invalid JSON: " + e.what());
  }
  if (!index.is_object() || !index.contains("weight_map") || !index.at("weight_map").is_object()) {
    throw FormatError(index_path.string() + ": missing object 'weight_map'");
  }
  std::map<std::string, std::set<std::string>> names_by_file;
  for (const auto& [name, file] : index.at("weight_map").items()) {
    if (!file.is_string()) throw FormatError(index_path.string() + ": tensor '" + name + "' maps to a non-string");
    auto shard = file.get<std::string>();
    if (shard.find('/') != std::string::npos || shard.find("..") != std::string::npos) {
      throw FormatError(index_path.string() + ": tensor '" + name + "' maps outside the directory: " + shard);
    }
    names_by_file[shard].insert(name);
  }
  NamedTensors all;
  for (const auto& [shard, names] : names_by_file) {
    if (!fs::exists(dir / shard)) {
      throw FormatError(index_path.string() + ": shard '" + shard + "' (tensor '" + *names.begin() + "') is missing");
    }
    auto tensors = read_safetensors(dir / shard);
    std::set<std::string> found;
    for (auto& entry : tensors) {
      if (names.count(entry.first)) {
        found.insert(entry.first);
        all.push_back(std::move(entry));
      }
    }
    for (const auto& name : names) {
      if (!found.count(name)) {
        throw FormatError((dir / shard).string() + ": tensor '" + name + "' listed in the index is not in the shard");
      }
    }
  }
  return all;
}

void save_pretrained(const torch::nn::Module& module, ModelConfig config, const fs::path& dir,
                     const SaveOptions& options) {
  fs::create_directories(dir);
  NamedTensors tensors;
  int64_t total = 0;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    auto t = item.value().detach();
    if (options.dtype && at::isFloatingType(t.scalar_type())) t = t.to(*options.dtype);
    total += t.numel() * t.element_size();
    tensors.emplace_back(item.key(), t);
  }
  config.torch_dtype = dtype_to_config_name(options.dtype ? *options.dtype : dominant_float_dtype(tensors));
  save_config(config, dir / "config.json");
  // Stale files from an earlier save in another layout would shadow or confuse the new one.
  std::error_code ignored;
  fs::remove(dir / kSingleFile, ignored);
  fs::remove(dir / kIndexFile, ignored);

  if (options.max_shard_bytes <= 0 || total <= options.max_shard_bytes) {
    write_safetensors(dir / kSingleFile, tensors);
    return;
  }
  std::vector<NamedTensors> shards(1);
  int64_t current = 0;
  for (auto& entry : tensors) {
    const int64_t bytes = entry.second.numel() * entry.second.element_size();
    if (current > 0 && current + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(entry);
    current += bytes;
  }
  Json weight_map = Json::object();
  const auto n = static_cast<int64_t>(shards.size());
  for (int64_t i = 0; i < n; ++i) {
    const auto name = shard_name(i + 1, n);
    write_safetensors(dir / name, shards[static_cast<size_t>(i)]);
    for (const auto& entry : shards[static_cast<size_t>(i)]) weight_map[entry.first] = name;
  }
  std::ofstream out(dir / kIndexFile);
  out << Json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) << "\n";
  if (!out) throw Error((dir / kIndexFile).string() + ": write failed");
}

void load_parameters(torch::nn::Module& module, const NamedTensors& tensors, const std::string& source,
                     const std::vector<std::string>& may_be_missing) {
  std::map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, t] : tensors) by_name[name] = &t;
  torch::NoGradGuard no_grad;
  for (auto& item : module.named_parameters(/*recurse=*/true)) {
    const auto& name = item.key();
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      bool optional = false;
      for (const auto& prefix : may_be_missing) optional = optional || name.rfind(prefix, 0) == 0;
      if (optional) continue;
      throw FormatError(source + ": tensor '" + name + "' is missing");
    }
    auto& param = item.value();
    const auto& src = *it->second;
    if (src.sizes() != param.sizes()) {
      std::ostringstream msg;
      msg << source << ": tensor '" << name << "' has shape " << src.sizes() << ", the model expects "
          << param.sizes();
      throw FormatError(msg.str());
    }
    param.copy_(src);
  }
}

namespace {

template <class Model>
Model load_model(const fs::path& dir, const LoadOptions& options, const std::vector<std::string>& may_be_missing) {
  auto config = load_config(dir);
  auto tensors = load_checkpoint_tensors(dir);
  const auto dtype = options.dtype ? *options.dtype : dominant_float_dtype(tensors);
  Model model(config);
  model->to(dtype);
  load_parameters(*model, tensors, dir.string(), may_be_missing);
  return model;
}

}  // namespace

CausalLM load_causal_lm(const fs::path& dir, const LoadOptions& options) {
  return load_model<CausalLM>(dir, options, {});
}

ValueModel load_value_model(const fs::path& dir, const LoadOptions& options) {
  return load_model<ValueModel>(dir, options, {"score."});
}

}  // namespace hyflow::models
