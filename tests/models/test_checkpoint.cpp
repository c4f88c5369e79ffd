#include "common/tiny_model.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/models/checkpoint.hpp>

#include <catch2/catch.hpp>

#include <fstream>
#include <set>

using namespace hyflow;
using namespace hyflow::models;
using hyflow::testing::TempDir;
using hyflow::testing::tiny_model_config;
namespace fs = std::filesystem;

namespace {

bool same_parameters_bitwise(torch::nn::Module& a, torch::nn::Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  if (pa.size() != pb.size()) return false;
  for (const auto& item : pa) {
    const auto& other = pb[item.key()];
    if (item.value().scalar_type() != other.scalar_type() || !torch::equal(item.value(), other)) return false;
  }
  return true;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file from a header JSON string and a data payload.
std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

}  // namespace

TEST_CASE("config.json round trips for Llama and Qwen2 configs") {
  TempDir dir("models");
  for (auto config : {tiny_model_config(), bench_50m_config()}) {
    config.rope_scaling = {.type = "linear", .factor = 2.0};
    save_config(config, dir.path / "config.json");
    auto back = load_config(dir.path);
    CHECK(config_to_json(back) == config_to_json(config));
    CHECK(back.qkv_bias == config.qkv_bias);
  }
}

TEST_CASE("Hugging Face config keys are read: eos lists, attention_bias, head_dim") {
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 100}, {"hidden_size", 64},
                      {"intermediate_size", 128}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                      {"num_key_value_heads", 2}, {"head_dim", 32}, {"attention_bias", true},
                      {"eos_token_id", {128001, 128009}}, {"rope_theta", 500000.0}};
  auto c = config_from_json(j);
  CHECK(c.qkv_bias);
  CHECK(c.o_bias);
  CHECK(c.resolved_head_dim() == 32);
  CHECK(c.eos_token_ids == std::vector<int64_t>{128001, 128009});
  CHECK(c.resolved_pad_token_id() == 128001);
  j.erase("vocab_size");
  CHECK_THROWS_WITH(config_from_json(j, "x/config.json"),
                    Catch::Contains("x/config.json") && Catch::Contains("vocab_size"));
  j["vocab_size"] = 100;
  j["architectures"] = {"GPT2LMHeadModel"};
  CHECK_THROWS_AS(config_from_json(j), FormatError);
}

TEST_CASE("a saved model reloads bit-identically in float32, bf16 and fp16") {
  torch::manual_seed(21);
  TempDir dir("models");
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    CausalLM model(tiny_model_config({.tie_word_embeddings = false}));
    model->to(dtype);
    save_pretrained(*model, model->config(), dir.path);
    auto back = load_causal_lm(dir.path);
    CHECK(same_parameters_bitwise(*model, *back));
    CHECK(load_config(dir.path).torch_dtype == (dtype == torch::kFloat      ? "float32"
                                                : dtype == torch::kBFloat16 ? "bfloat16"
                                                                            : "float16"));
    if (dtype != torch::kHalf) {  // LibTorch 1.13 has no fp16 matmul on CPU
      auto ids = torch::tensor({{1, 2, 3}});
      CHECK(torch::equal(model(ids), back(ids)));
    }
  }
}

TEST_CASE("saving converts dtype on request; loading can convert too") {
  torch::manual_seed(22);
  TempDir dir("models");
  CausalLM model(tiny_model_config());
  save_pretrained(*model, model->config(), dir.path, SaveOptions{.dtype = torch::kBFloat16});
  auto back = load_causal_lm(dir.path);
  CHECK(back->parameters().front().scalar_type() == torch::kBFloat16);
  auto as_float = load_causal_lm(dir.path, LoadOptions{.dtype = torch::kFloat});
  CHECK(as_float->parameters().front().scalar_type() == torch::kFloat);
  CHECK(torch::equal(as_float->model->norm->weight, back->model->norm->weight.to(torch::kFloat)));
}

TEST_CASE("sharded checkpoints with an index load bit-identically") {
  torch::manual_seed(23);
  TempDir dir("models");
  CausalLM model(tiny_model_config({.tie_word_embeddings = false}));
  save_pretrained(*model, model->config(), dir.path, SaveOptions{.max_shard_bytes = 8000});
  CHECK_FALSE(fs::exists(dir.path / "model.safetensors"));
  REQUIRE(fs::exists(dir.path / "model.safetensors.index.json"));
  std::ifstream index_file(dir.path / "model.safetensors.index.json");
  auto index = nlohmann::json::parse(index_file);
  std::set<std::string> shards;
  for (const auto& [name, shard] : index["weight_map"].items()) shards.insert(shard.get<std::string>());
  REQUIRE(shards.size() > 2);
  char first[64];
  std::snprintf(first, sizeof first, "model-00001-of-%05zu.safetensors", shards.size());
  CHECK(*shards.begin() == first);
  CHECK(same_parameters_bitwise(*model, *load_causal_lm(dir.path)));

  SECTION("a missing shard is named") {
    const auto second = *std::next(shards.begin());
    fs::remove(dir.path / second);
    CHECK_THROWS_WITH(load_causal_lm(dir.path), Catch::Contains(second));
  }
}

TEST_CASE("safetensors round trip keeps names, order, dtypes and integer tensors") {
  TempDir dir("models");
  NamedTensors tensors = {{"z.ints", torch::arange(6, torch::kLong).view({2, 3})},
                          {"a.bytes", torch::tensor({1, 255}, torch::kByte)},
                          {"m.flags", torch::tensor({true, false})},
                          {"b.empty", torch::zeros({0, 4})},
                          {"c.f64", torch::randn({3}, torch::kDouble)}};
  write_safetensors(dir.path / "t.safetensors", tensors, {{"note", "x"}});
  nlohmann::json meta;
  auto back = read_safetensors(dir.path / "t.safetensors", &meta);
  REQUIRE(back.size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    CHECK(back[i].first == tensors[i].first);
    CHECK(torch::equal(back[i].second, tensors[i].second));
  }
  CHECK(meta["note"] == "x");
  CHECK(meta["format"] == "pt");
  const auto bytes = read_bytes(dir.path / "t.safetensors");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i)
    header_len = (header_len << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  CHECK((8 + header_len) % 8 == 0);  // tensor data starts 8-byte aligned
}

TEST_CASE("corrupt safetensors are rejected with a FormatError naming file and tensor") {
  TempDir dir("models");
  const auto file = dir.path / "bad.safetensors";
  const std::string good_header = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";

  SECTION("truncated data") {
    write_bytes(file, safetensors_bytes(good_header, std::string(10, '\0')));
    CHECK_THROWS_WITH(read_safetensors(file), Catch::Contains("bad.safetensors") && Catch::Contains("'w'"));
  }
  SECTION("header length beyond the file") {
    auto bytes = safetensors_bytes(good_header, std::string(16, '\0'));
    bytes[0] = '\xff';
    bytes[1] = '\xff';
    write_bytes(file, bytes);
    CHECK_THROWS_WITH(read_safetensors(file), Catch::Contains("header length"));
  }
  SECTION("fewer than 8 bytes") {
    write_bytes(file, "abc");
    CHECK_THROWS_AS(read_safetensors(file), FormatError);
  }
  SECTION("header is not JSON") {
    write_bytes(file, safetensors_bytes("{not json", ""));
    CHECK_THROWS_WITH(read_safetensors(file), Catch::Contains("JSON"));
  }
  SECTION("size disagrees with shape") {
    write_bytes(
        file, safetensors_bytes(R"({"w":{"dtype":"F32","shape":[3,2],"data_offsets":[0,16]}})", std::string(16, '\0')));
    CHECK_THROWS_WITH(read_safetensors(file), Catch::Contains("'w'") && Catch::Contains("expected 24"));
  }
  SECTION("unknown dtype") {
    write_bytes(file,
                safetensors_bytes(R"({"w":{"dtype":"F8_E9","shape":[2],"data_offsets":[0,2]}})", std::string(2, '\0')));
    CHECK_THROWS_WITH(read_safetensors(file), Catch::Contains("F8_E9") && Catch::Contains("'w'"));
  }
  SECTION("offsets reversed") {
    write_bytes(file,
                safetensors_bytes(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[4,2]}})", std::string(4, '\0')));
    CHECK_THROWS_AS(read_safetensors(file), FormatError);
  }
  SECTION("two tensors reading the same bytes (overlapping offsets)") {
    write_bytes(file, safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                        std::string(12, '\0')));
    CHECK_THROWS_WITH(read_safetensors(file),
                      Catch::Contains("bad.safetensors") && Catch::Contains("'b'") && Catch::Contains("overlap"));
  }
  SECTION("data bytes that belong to no tensor") {
    write_bytes(file,
                safetensors_bytes(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", std::string(4, '\0')));
    CHECK_THROWS_WITH(read_safetensors(file), Catch::Contains("belong to no tensor") && Catch::Contains("'w'"));
  }
  SECTION("shape x element size overflows 64 bits") {
    write_bytes(file, safetensors_bytes(R"({"w":{"dtype":"F64","shape":[4611686018427387904,4],"data_offsets":[0,0]}})",
                                        ""));
    CHECK_THROWS_WITH(read_safetensors(file), Catch::Contains("'w'") && Catch::Contains("overflows"));
    write_bytes(file, safetensors_bytes(R"({"w":{"dtype":"F64","shape":[1152921504606846976],"data_offsets":[0,0]}})",
                                        ""));
    CHECK_THROWS_WITH(read_safetensors(file), Catch::Contains("'w'") && Catch::Contains("overflows"));
    write_bytes(file,
                safetensors_bytes(R"({"w":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,0]}})", ""));
    CHECK_THROWS_WITH(read_safetensors(file), Catch::Contains("'w'") && Catch::Contains("overflows"));
  }
  SECTION("a checkpoint file cut in half") {
    torch::manual_seed(24);
    CausalLM model(tiny_model_config());
    save_pretrained(*model, model->config(), dir.path);
    auto bytes = read_bytes(dir.path / "model.safetensors");
    write_bytes(dir.path / "model.safetensors", bytes.substr(0, bytes.size() / 2));
    CHECK_THROWS_WITH(load_causal_lm(dir.path), Catch::Contains("model.safetensors") && Catch::Contains("tensor '"));
  }
}

TEST_CASE("loading names a missing or mis-shaped tensor") {
  torch::manual_seed(25);
  TempDir dir("models");
  CausalLM model(tiny_model_config());
  save_pretrained(*model, model->config(), dir.path);
  auto tensors = read_safetensors(dir.path / "model.safetensors");
  SECTION("missing") {
    tensors.erase(std::find_if(tensors.begin(), tensors.end(), [](auto& e) { return e.first == "model.norm.weight"; }));
    write_safetensors(dir.path / "model.safetensors", tensors);
    CHECK_THROWS_WITH(load_causal_lm(dir.path), Catch::Contains("'model.norm.weight' is missing"));
  }
  SECTION("wrong shape") {
    for (auto& e : tensors) {
      if (e.first == "model.norm.weight") e.second = torch::ones({5});
    }
    write_safetensors(dir.path / "model.safetensors", tensors);
    CHECK_THROWS_WITH(load_causal_lm(dir.path), Catch::Contains("'model.norm.weight'") && Catch::Contains("[5]"));
  }
}

TEST_CASE("a value model starts from an LM checkpoint and keeps its own score head") {
  torch::manual_seed(26);
  TempDir lm_dir("models"), critic_dir("models");
  CausalLM lm(tiny_model_config({.tie_word_embeddings = false}));
  save_pretrained(*lm, lm->config(), lm_dir.path);
  auto critic = load_value_model(lm_dir.path);
  CHECK(torch::equal(critic->model->embed_tokens->weight, lm->model->embed_tokens->weight));
  CHECK(torch::equal(critic->model->layers[1]->as<DecoderLayerImpl>()->mlp->up_proj->weight,
                     lm->model->layers[1]->as<DecoderLayerImpl>()->mlp->up_proj->weight));
  save_pretrained(*critic, critic->config(), critic_dir.path);
  auto back = load_value_model(critic_dir.path);
  CHECK(same_parameters_bitwise(*critic, *back));
}
