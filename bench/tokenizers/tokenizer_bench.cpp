// Byte-level BPE encoding speed (Qwen2.5's tokenizer.json) against Hugging Face tokenizers, the
// Rust library through its Node binding (peer_tokenizers.mjs), timed the same way in the same run:
// one 50,000-letter word, a single BPE word, so the merge loop dominates and the peer's per-call
// overhead (N-API, building its Encoding) is small against it. The peer needs `node` and the npm package
// `tokenizers` under NODE_PATH (default /tmp/hf-tok/node_modules); without them this benchmark
// says so on stderr and prints no figure.
#include <hyflow/tokenizers/bpe_tokenizer.hpp>

#include "bench_json.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

namespace {

constexpr size_t kWordLength = 50000;

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main() {
  const std::filesystem::path data = HYFLOW_TOKENIZER_BENCH_DATA;
  const auto tokenizer_json = data / "qwen2_5" / "tokenizer.json";
  const char* node_path_env = std::getenv("NODE_PATH");
  const std::string node_path = node_path_env ? node_path_env : "/tmp/hf-tok/node_modules";
  if (!std::filesystem::exists(std::filesystem::path(node_path) / "tokenizers")) {
    std::cerr << "tokenizer_bench: skipped, no npm package 'tokenizers' under NODE_PATH=" << node_path
              << " (npm install --prefix /tmp/hf-tok tokenizers@0.23.2)\n";
    return 0;
  }
  const std::string cmd = "NODE_PATH='" + node_path + "' node '" HYFLOW_TOKENIZER_BENCH_PEER "' '" +
                          tokenizer_json.string() + "' " + std::to_string(kWordLength);
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (pipe && std::fgets(buf, sizeof buf, pipe)) out += buf;
  if (!pipe || pclose(pipe) != 0) {
    std::cerr << "tokenizer_bench: peer failed: " << cmd << "\n";
    return 1;
  }
  const auto peer = nlohmann::json::parse(out);

  const auto tok = hyflow::tokenizers::BpeTokenizer::from_file(tokenizer_json);
  const std::string word(kWordLength, 'a');
  std::vector<double> word_ms;
  for (int r = 0; r < 7; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = tok.encode(word);
    word_ms.push_back(ms_since(t0));
    if (tok.decode(ids) != word) {
      std::cerr << "tokenizer_bench: the word does not decode back to itself\n";
      return 1;
    }
  }
  const std::string peer_name = "HF tokenizers 0.23.2 (Rust, Node binding)";
  const double ours_word = median(word_ms), peer_word = peer["word_ms"].get<double>();
  hyflow_bench::emit("tokenizer_encode", "Qwen2.5, one 50,000-letter word", ours_word, "ms", peer_name, peer_word,
                     peer_word / ours_word);
  return 0;
}
