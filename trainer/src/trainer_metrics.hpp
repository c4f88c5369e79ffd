#pragma once
// Trainer-internal helpers: sequence balancing and the progress line.

#include <hyflow/dataproto/data_proto.hpp>

#include <nlohmann/json.hpp>

#include <string>

namespace hyflow::trainer {

/// Reorders rows so each of `world` equal-size contiguous chunks carries about the same
/// attention workload (24576·s + s², s = valid tokens); logs global_seqlen/*.
void balance_batch(DataProto& batch, int64_t world, nlohmann::json& metrics);
/// "step 3/40 [====      ] score 0.41 acc 0.38 | 2.1 s/step".
std::string format_progress(const nlohmann::json& metrics, int64_t step, int64_t total);

}  // namespace hyflow::trainer
