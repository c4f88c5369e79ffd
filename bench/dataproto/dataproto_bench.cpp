// DataProto figures (issue "Foundation"): wire-format throughput and chunk+concat cost for a
// 256x4096 int64 + float32 batch, each against memcpy of the same bytes in the same run.
// Prints one JSON object per line (design brief §5). Usage: dataproto_bench [repetitions]
#include "bench_json.hpp"

#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/dataproto/serialization.hpp>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

/// Median wall time of `reps` runs of f, in seconds (after one warm-up run).
template <class F>
double median_seconds(int reps, F&& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto start = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[static_cast<size_t>(reps / 2)];
}

using hyflow_bench::emit;

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(3, std::atoi(argv[1])) : 30;
  at::set_num_threads(1);  // the peer (memcpy) is single-threaded too
  const int64_t rows = 256, cols = 4096;
  hyflow::DataProto batch(hyflow::TensorDict{
      {"input_ids", at::randint(0, 150000, {rows, cols}, at::TensorOptions().dtype(at::kLong))},
      {"log_probs", at::randn({rows, cols})}});
  const size_t bytes = static_cast<size_t>(rows * cols * (8 + 4));
  const double mb = static_cast<double>(bytes) / 1e6;
  const std::string case_name = "256x4096 int64+f32";

  // Peer: one memcpy of the same bytes into a warm destination.
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const double t_memcpy = median_seconds(reps, [&] {
    std::memcpy(dst.data(), src.data(), bytes);
    asm volatile("" : : "r"(dst.data()) : "memory");
  });
  const double memcpy_mbs = mb / t_memcpy;

  std::vector<char> wire;
  const double t_ser = median_seconds(reps, [&] { hyflow::dataproto::serialize_into(batch, wire); });
  hyflow::DataProto decoded;
  const double t_de = median_seconds(reps, [&] { decoded = hyflow::dataproto::deserialize(wire); });
  const double t_roundtrip = median_seconds(reps, [&] {
    hyflow::dataproto::serialize_into(batch, wire);
    decoded = hyflow::dataproto::deserialize(wire);
  });
  if (!at::equal(decoded.batch.at("input_ids"), batch.batch.at("input_ids"))) {
    std::cerr << "dataproto_bench: round trip changed the data\n";
    return 1;
  }
  emit("dataproto_serialize", case_name, mb / t_ser, "MB/s", "memcpy", memcpy_mbs, t_memcpy / t_ser);
  emit("dataproto_deserialize", case_name, mb / t_de, "MB/s", "memcpy", memcpy_mbs, t_memcpy / t_de);
  emit("dataproto_serialize_roundtrip", case_name, mb / t_roundtrip, "MB/s", "memcpy", memcpy_mbs,
       t_memcpy / t_roundtrip);
  // As a receiver does it: encode into a fresh message buffer, decode aliasing that buffer.
  const double t_owned = median_seconds(
      reps, [&] { decoded = hyflow::dataproto::deserialize_owned(hyflow::dataproto::serialize(batch)); });
  emit("dataproto_serialize_roundtrip_owned", case_name, mb / t_owned, "MB/s", "memcpy", memcpy_mbs,
       t_memcpy / t_owned);

  hyflow::DataProto joined;
  const double t_chunk_concat = median_seconds(reps, [&] { joined = hyflow::DataProto::concat(batch.chunk(8)); });
  if (!at::equal(joined.batch.at("log_probs"), batch.batch.at("log_probs"))) {
    std::cerr << "dataproto_bench: chunk+concat changed the data\n";
    return 1;
  }
  // Latency figures: ratio = peer / value, so >= 1 means no slower than one memcpy.
  emit("dataproto_chunk8_concat", case_name, t_chunk_concat * 1e3, "ms", "memcpy", t_memcpy * 1e3,
       t_memcpy / t_chunk_concat);
  // Worker outputs are separate allocations: concat then has to copy every byte once.
  std::vector<hyflow::DataProto> pieces;
  for (const auto& c : batch.chunk(8)) pieces.push_back(c.select(std::nullopt, std::nullopt, std::nullopt, true));
  const double t_concat_copy = median_seconds(reps, [&] { joined = hyflow::DataProto::concat(pieces); });
  emit("dataproto_concat8_separate", case_name, t_concat_copy * 1e3, "ms", "memcpy", t_memcpy * 1e3,
       t_memcpy / t_concat_copy);
  return 0;
}
