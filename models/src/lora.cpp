// LoRA adapters: injection, the adapter branch, merging, PEFT's adapter files.
#include <hyflow/models/lora.hpp>

#include <hyflow/core/error.hpp>
#include <hyflow/cuda/linear.hpp>

#include <nlohmann/json.hpp>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>

namespace hyflow::models {
namespace fs = std::filesystem;
namespace F = torch::nn::functional;
using Json = nlohmann::json;

namespace {
const std::string kPeftPrefix = "base_model.model.";
thread_local bool t_adapters_enabled = true;

bool matches(const std::string& path, const std::string& name) {
  return path == name || (path.size() > name.size() && path.ends_with("." + name));
}

bool matches_any(const std::string& path, const std::vector<std::string>& names) {
  return std::any_of(names.begin(), names.end(), [&](const auto& n) { return matches(path, n); });
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "(none)" : out;
}

/// A linear layer's adapter pair, read from one look at its children (both null: not adapted).
struct AdapterPair {
  const LoraAImpl* a = nullptr;
  const torch::nn::LinearImpl* b = nullptr;
};

AdapterPair adapters_of(const torch::nn::LinearImpl& layer) {
  AdapterPair pair;
  for (const auto& child : layer.named_children()) {
    if (child.key() == "lora_A") pair.a = child.value()->as<LoraAImpl>();
    if (child.key() == "lora_B") pair.b = child.value()->as<torch::nn::LinearImpl>();
  }
  return pair;
}

/// The linear layers below `root` that carry adapters, with their module paths.
std::vector<std::pair<std::string, const torch::nn::LinearImpl*>> adapted_linears(const torch::nn::Module& root) {
  std::vector<std::pair<std::string, const torch::nn::LinearImpl*>> out;
  for (const auto& item : root.named_modules("", false)) {
    auto* linear = item.value()->as<torch::nn::LinearImpl>();
    if (linear != nullptr && adapters_of(*linear).a != nullptr) out.emplace_back(item.key(), linear);
  }
  return out;
}

bool is_adapter_parameter(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

/// Trained under LoRA: an adapter, or a parameter of a module PEFT saves in full (modules_to_save).
bool is_trained_under_lora(const std::string& name, const std::vector<std::string>& modules_to_save) {
  return is_adapter_parameter(name) || std::any_of(modules_to_save.begin(), modules_to_save.end(),
                                                   [&](const auto& m) { return name.rfind(m + ".", 0) == 0; });
}

bool is_output_head(const std::string& path) {
  return path == "lm_head" || path == "score";
}

// The linear layers `config` targets, in module order (none when it targets nothing).
std::vector<std::pair<std::string, torch::nn::LinearImpl*>> resolve_targets(torch::nn::Module& root,
                                                                             const LoraConfig& config) {
  const bool all_linear =
      config.target_modules.size() == 1 && config.target_modules.front() == "all-linear";
  std::vector<std::pair<std::string, torch::nn::LinearImpl*>> out;
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    const auto& path = item.key();
    if (path.ends_with(".lora_A") || path.ends_with(".lora_B")) continue;
    auto* linear = item.value()->as<torch::nn::LinearImpl>();
    const bool targeted = all_linear ? (linear != nullptr && !is_output_head(path))
                                     : matches_any(path, config.target_modules);
    if (!targeted || matches_any(path, config.exclude_modules)) continue;
    if (is_output_head(path))
      throw ValueError("LoRA: target module '" + path + "' is the output head; train it in full (modules_to_save)");
    if (linear == nullptr)
      throw ValueError("LoRA: target module '" + path + "' is a " + item.value()->name() +
                       ", not a linear layer (target_modules: " + join(config.target_modules) + ")");
    out.emplace_back(path, linear);
  }
  return out;
}

at::Tensor lora_branch(const LoraAImpl& a, const torch::nn::LinearImpl& b, const at::Tensor& x) {
  auto h = x;
  if (a.dropout > 0.0 && a.is_training()) h = F::dropout(h, F::DropoutFuncOptions().p(a.dropout).training(true));
  const bool onednn = onednn_linear_enabled() && cuda::onednn_linear_supported(h);
  auto low = onednn ? cuda::onednn_linear(h, a.weight, {}) : F::linear(h, a.weight);
  auto up = onednn ? cuda::onednn_linear(low, b.weight, {}) : F::linear(low, b.weight);
  return up * a.scale;
}

std::vector<std::string> sorted(std::vector<std::string> names) {
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

void LoraConfig::validate(const std::string& path) const {
  if (rank < 0) throw ValueError("config key '" + path + ".lora_rank' must be >= 0, got " + std::to_string(rank));
  if (!enabled()) return;
  if (!(alpha > 0.0) || !std::isfinite(alpha))
    throw ValueError("config key '" + path + ".lora_alpha' must be > 0, got " + std::to_string(alpha));
  if (!(dropout >= 0.0 && dropout < 1.0))
    throw ValueError("config key '" + path + ".lora_dropout' must be in [0, 1), got " + std::to_string(dropout));
  if (target_modules.empty()) throw ValueError("config key '" + path + ".target_modules' is empty");
  for (const auto& t : target_modules)
    if (t == "all-linear" && target_modules.size() > 1)
      throw ValueError("config key '" + path + ".target_modules': 'all-linear' stands alone, got " +
                       join(target_modules));
}

LoraAImpl::LoraAImpl(int64_t in, int64_t rank, double scale_, double dropout_)
    : torch::nn::LinearImpl(torch::nn::LinearOptions(in, rank).bias(false)), scale(scale_), dropout(dropout_) {}

std::vector<std::string> apply_lora(torch::nn::Module& root, const LoraConfig& config,
                                    const std::vector<std::string>& modules_to_save, std::optional<uint64_t> seed) {
  config.validate("model");
  std::optional<at::Generator> generator;
  if (seed) generator = at::make_generator<at::CPUGeneratorImpl>(*seed);
  if (has_lora(root)) throw ValueError("LoRA: the model already has adapters");
  auto targets = resolve_targets(root, config);
  if (targets.empty())
    throw ValueError("LoRA: target_modules " + join(config.target_modules) + " (exclude_modules " +
                     join(config.exclude_modules) + ") match no linear layer of the model");
  for (const auto& name : modules_to_save) {
    bool found = false;
    for (const auto& item : root.named_modules("", false)) found = found || item.key() == name;
    if (!found) throw ValueError("LoRA: modules_to_save names '" + name + "', which the model does not have");
  }
  torch::NoGradGuard no_grad;
  for (auto& p : root.parameters()) p.set_requires_grad(false);
  std::vector<std::string> paths;
  for (auto& [path, linear] : targets) {
    const auto& w = linear->weight;
    auto a = std::make_shared<LoraAImpl>(w.size(1), config.rank, config.scale(), config.dropout);
    auto b = torch::nn::Linear(torch::nn::LinearOptions(config.rank, w.size(0)).bias(false));
    // kaiming_uniform_(a = sqrt(5)): U(-1/sqrt(in), 1/sqrt(in)), drawn on the CPU in float32
    const double bound = 1.0 / std::sqrt(static_cast<double>(w.size(1)));
    auto draw = torch::empty(a->weight.sizes(), torch::kFloat);
    if (generator) {
      draw.uniform_(-bound, bound, *generator);
    } else {
      draw.uniform_(-bound, bound);
    }
    a->weight.copy_(draw);
    b->weight.zero_();
    a->to(w.device(), w.scalar_type());
    b->to(w.device(), w.scalar_type());
    linear->register_module("lora_A", a);
    linear->register_module("lora_B", b);
    paths.push_back(path);
  }
  for (const auto& item : root.named_parameters())
    if (is_trained_under_lora(item.key(), modules_to_save)) item.value().set_requires_grad(true);
  return paths;
}

std::vector<std::string> lora_modules(const torch::nn::Module& root) {
  std::vector<std::string> out;
  for (const auto& [path, linear] : adapted_linears(root)) out.push_back(path);
  return out;
}

bool has_lora(const torch::nn::Module& root) {
  return !adapted_linears(root).empty();
}

std::vector<at::Tensor> trainable_parameters(const torch::nn::Module& root) {
  std::vector<at::Tensor> out;
  for (const auto& p : root.parameters())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

NamedTensors named_trainable_parameters(const torch::nn::Module& root) {
  NamedTensors out;
  for (const auto& item : root.named_parameters())
    if (item.value().requires_grad()) out.emplace_back(item.key(), item.value());
  return out;
}

DisableAdapters::DisableAdapters() : previous_(t_adapters_enabled) {
  t_adapters_enabled = false;
}
DisableAdapters::~DisableAdapters() {
  t_adapters_enabled = previous_;
}
bool adapters_enabled() {
  return t_adapters_enabled;
}

at::Tensor add_lora(const torch::nn::LinearImpl& layer, const at::Tensor& x, at::Tensor base) {
  if (!t_adapters_enabled) return base;
  const auto [a, b] = adapters_of(layer);
  if (a == nullptr || b == nullptr) return base;
  return base + lora_branch(*a, *b, x);
}

at::Tensor merged_weight(const torch::nn::LinearImpl& layer) {
  torch::NoGradGuard no_grad;
  const auto [a, b] = adapters_of(layer);
  if (a == nullptr || b == nullptr) return layer.weight.detach();
  // in float32, rounded once to the weight's dtype
  auto delta = torch::matmul(b->weight.to(at::kFloat), a->weight.to(at::kFloat)) * a->scale;
  return (layer.weight.to(at::kFloat) + delta).to(layer.weight.scalar_type());
}

NamedTensors merged_parameters(const torch::nn::Module& root) {
  std::map<std::string, at::Tensor> merged;
  for (const auto& [path, linear] : adapted_linears(root)) merged[path + ".weight"] = merged_weight(*linear);
  NamedTensors out;
  for (const auto& item : root.named_parameters()) {
    const auto& name = item.key();
    if (is_adapter_parameter(name)) continue;
    auto it = merged.find(name);
    out.emplace_back(name, it != merged.end() ? it->second : item.value().detach());
  }
  return out;
}

MergedCopy::MergedCopy(const CausalLM& policy) : policy_(policy), merged_(policy->config()) {
  torch::NoGradGuard no_grad;
  merged_->to(policy_->model->embed_tokens->weight.device(), policy_->model->embed_tokens->weight.scalar_type());
  std::map<std::string, const torch::nn::LinearImpl*> adapted;
  for (const auto& [path, linear] : adapted_linears(*policy_)) adapted[path + ".weight"] = linear;
  std::map<std::string, at::Tensor> source;
  for (const auto& item : policy_->named_parameters()) source[item.key()] = item.value();
  for (auto& item : merged_->named_parameters()) {
    auto& target = item.value();
    target.set_requires_grad(false);
    auto it = adapted.find(item.key());
    if (it == adapted.end()) {
      target.set_data(source.at(item.key()).detach());  // shares the policy's storage
    } else {
      entries_.push_back({it->second, target});
    }
  }
}

int64_t MergedCopy::refresh(bool force) {
  torch::NoGradGuard no_grad;
  int64_t written = 0;
  for (auto& e : entries_) {
    const auto [a, b] = adapters_of(*e.source);
    const auto va = static_cast<int64_t>(a->weight._version()), vb = static_cast<int64_t>(b->weight._version());
    if (!force && va == e.version_a && vb == e.version_b) continue;
    e.target.copy_(merged_weight(*e.source));
    e.version_a = va;
    e.version_b = vb;
    ++written;
  }
  return written;
}

NamedTensors adapter_state(const torch::nn::Module& root, const std::vector<std::string>& modules_to_save) {
  NamedTensors out;
  for (const auto& item : root.named_parameters())
    if (is_trained_under_lora(item.key(), modules_to_save))
      out.emplace_back(kPeftPrefix + item.key(), item.value().detach());
  return out;
}

void save_adapter(const torch::nn::Module& root, const LoraConfig& config, const std::string& base_model_name_or_path,
                  const fs::path& dir, const std::vector<std::string>& modules_to_save, const std::string& task_type) {
  if (!has_lora(root)) throw ValueError("save_adapter: the model has no LoRA adapters");
  fs::create_directories(dir);
  // PEFT writes the resolved target set: the adapted layers' own names.
  std::set<std::string> leaf_names;
  for (const auto& path : lora_modules(root)) leaf_names.insert(path.substr(path.rfind('.') + 1));
  Json cfg = {{"peft_type", "LORA"},
              {"task_type", task_type},
              {"base_model_name_or_path", base_model_name_or_path},
              {"r", config.rank},
              {"lora_alpha", config.alpha},
              {"lora_dropout", config.dropout},
              {"target_modules", Json(leaf_names)},
              {"exclude_modules", config.exclude_modules.empty() ? Json(nullptr) : Json(config.exclude_modules)},
              {"modules_to_save", modules_to_save.empty() ? Json(nullptr) : Json(modules_to_save)},
              {"bias", "none"},
              {"fan_in_fan_out", false},
              {"inference_mode", true},
              {"init_lora_weights", true},
              {"use_rslora", false},
              {"use_dora", false},
              {"layers_to_transform", nullptr},
              {"layers_pattern", nullptr},
              {"rank_pattern", Json::object()},
              {"alpha_pattern", Json::object()},
              {"revision", nullptr}};
  std::ofstream out(dir / kAdapterConfigFile);
  out << cfg.dump(2) << "\n";
  if (!out) throw Error((dir / kAdapterConfigFile).string() + ": write failed");
  write_safetensors(dir / kAdapterWeightsFile, adapter_state(root, modules_to_save), Json{{"format", "pt"}});
}

AdapterFileConfig read_adapter_config(const fs::path& dir) {
  const auto file = dir / kAdapterConfigFile;
  std::ifstream in(file);
  if (!in) throw FormatError(file.string() + ": cannot open (not a PEFT adapter directory?)");
  Json j;
  try {
    j = Json::parse(in);
  } catch (const Json::exception& e) {
    throw FormatError(file.string() + ": not JSON: " + e.what());
  }
  const auto need = [&](const char* key) -> const Json& {
    if (!j.is_object() || !j.contains(key)) throw FormatError(file.string() + ": key '" + key + "' is missing");
    return j.at(key);
  };
  const auto names = [&](const char* key) {
    std::vector<std::string> out;
    if (!j.contains(key) || j.at(key).is_null()) return out;
    const auto& v = j.at(key);
    if (v.is_string()) return std::vector<std::string>{v.get<std::string>()};
    if (!v.is_array()) throw FormatError(file.string() + ": '" + key + "' must be a string or a list of strings");
    for (const auto& e : v) {
      if (!e.is_string()) throw FormatError(file.string() + ": '" + key + "' must list strings");
      out.push_back(e.get<std::string>());
    }
    return out;
  };
  AdapterFileConfig c;
  try {
    if (need("peft_type").get<std::string>() != "LORA")
      throw FormatError(file.string() + ": peft_type is '" + j.at("peft_type").get<std::string>() +
                        "', only LORA is supported");
    c.lora.rank = need("r").get<int64_t>();
    c.lora.alpha = need("lora_alpha").get<double>();
    c.lora.dropout = j.value("lora_dropout", 0.0);
    if (j.value("bias", std::string("none")) != "none")
      throw FormatError(file.string() + ": bias '" + j.at("bias").get<std::string>() + "' is not supported (none)");
    if (j.value("fan_in_fan_out", false)) throw FormatError(file.string() + ": fan_in_fan_out true is not supported");
    if (j.value("use_dora", false) || j.value("use_rslora", false))
      throw FormatError(file.string() + ": use_dora / use_rslora are not supported");
    c.base_model_name_or_path = j.value("base_model_name_or_path", std::string());
    c.task_type = j.value("task_type", std::string("CAUSAL_LM"));
  } catch (const Json::type_error& e) {
    throw FormatError(file.string() + ": a field has the wrong type: " + e.what());
  }
  c.lora.target_modules = names("target_modules");
  c.lora.exclude_modules = names("exclude_modules");
  c.modules_to_save = names("modules_to_save");
  if (c.lora.rank <= 0) throw FormatError(file.string() + ": r must be > 0");
  return c;
}

namespace {

void check_base(const AdapterFileConfig& file, const std::string& expected, const fs::path& dir) {
  if (expected.empty() || file.base_model_name_or_path.empty()) return;
  if (file.base_model_name_or_path == expected) return;
  std::error_code e1, e2;
  const auto a = fs::weakly_canonical(file.base_model_name_or_path, e1);
  const auto b = fs::weakly_canonical(expected, e2);
  if (!e1 && !e2 && a == b) return;
  throw ValueError("adapter " + dir.string() + ": base_model_name_or_path is '" + file.base_model_name_or_path +
                   "', the model is '" + expected + "'");
}

// The adapter file's tensors under the model's names, each checked against the model's parameter.
NamedTensors adapter_tensors(const torch::nn::Module& root, const AdapterFileConfig& file, const fs::path& dir) {
  const auto source = (dir / kAdapterWeightsFile).string();
  auto tensors = read_safetensors(dir / kAdapterWeightsFile);
  std::map<std::string, at::Tensor> by_name;
  for (auto& [name, t] : tensors) {
    if (name.rfind(kPeftPrefix, 0) != 0)
      throw FormatError(source + ": tensor '" + name + "' lacks PEFT's prefix '" + kPeftPrefix + "'");
    by_name[name.substr(kPeftPrefix.size())] = t;
  }
  NamedTensors out;
  for (const auto& [peft_name, target] : adapter_state(root, file.modules_to_save)) {
    const auto name = peft_name.substr(kPeftPrefix.size());
    auto it = by_name.find(name);
    if (it == by_name.end()) throw FormatError(source + ": tensor '" + peft_name + "' is missing");
    if (it->second.sizes() != target.sizes()) {
      std::ostringstream msg;
      msg << source << ": tensor '" << peft_name << "' has shape " << it->second.sizes() << ", the model expects "
          << target.sizes();
      throw FormatError(msg.str());
    }
    out.emplace_back(name, it->second);
  }
  return out;
}

void copy_into(torch::nn::Module& root, const NamedTensors& tensors) {
  torch::NoGradGuard no_grad;
  auto params = root.named_parameters();
  for (const auto& [name, t] : tensors) params[name].copy_(t);
}

}  // namespace

NamedTensors read_adapter(const torch::nn::Module& root, const fs::path& dir,
                          const std::string& base_model_name_or_path) {
  auto file = read_adapter_config(dir);
  check_base(file, base_model_name_or_path, dir);
  const auto have = lora_modules(root);
  if (have.empty()) throw ValueError("load_adapter: the model has no LoRA adapters to load " + dir.string() + " into");
  std::vector<std::string> want;
  // resolve_targets only reads the module tree
  for (const auto& [path, linear] : resolve_targets(const_cast<torch::nn::Module&>(root), file.lora))
    want.push_back(path);
  if (sorted(want) != sorted(have)) {
    std::vector<std::string> only_file, only_model;
    const auto w = sorted(want), h = sorted(have);
    std::set_difference(w.begin(), w.end(), h.begin(), h.end(), std::back_inserter(only_file));
    std::set_difference(h.begin(), h.end(), w.begin(), w.end(), std::back_inserter(only_model));
    throw ValueError("adapter " + dir.string() + ": target_modules " + join(file.lora.target_modules) +
                     " do not match the model's adapted modules (only in the adapter: " + join(only_file) +
                     "; only in the model: " + join(only_model) + ")");
  }
  const auto* first = root.named_modules("", false)[have.front()]->as<torch::nn::LinearImpl>();
  const auto* a = adapters_of(*first).a;
  if (a->weight.size(0) != file.lora.rank)
    throw ValueError("adapter " + dir.string() + ": r is " + std::to_string(file.lora.rank) + ", the model's is " +
                     std::to_string(a->weight.size(0)));
  if (std::abs(a->scale - file.lora.scale()) > 1e-12 * std::abs(a->scale))
    throw ValueError("adapter " + dir.string() + ": lora_alpha / r is " + std::to_string(file.lora.scale()) +
                     ", the model's is " + std::to_string(a->scale));
  return adapter_tensors(root, file, dir);
}

void load_adapter(torch::nn::Module& root, const fs::path& dir, const std::string& base_model_name_or_path) {
  copy_into(root, read_adapter(root, dir, base_model_name_or_path));
}

AdapterFileConfig apply_adapter(torch::nn::Module& root, const fs::path& dir,
                                const std::string& base_model_name_or_path) {
  auto file = read_adapter_config(dir);
  check_base(file, base_model_name_or_path, dir);
  apply_lora(root, file.lora, file.modules_to_save);
  copy_into(root, adapter_tensors(root, file, dir));
  return file;
}

}  // namespace hyflow::models
