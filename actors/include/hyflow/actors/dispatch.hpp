#pragma once
// Dispatch and execute registries (verl's Dispatch/Execute DynamicEnums and their functions).
// A dispatch mode turns the controller's arguments into one argument list per rank; its
// collect function turns the per-rank outputs back into one result. An execute mode picks
// the ranks that run. Both registries are open: register_dispatch_mode / register_execute_mode.

#include <hyflow/actors/method_table.hpp>
#include <hyflow/actors/value.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace hyflow::actors {

/// What a dispatch or collect function may ask of the group it runs for.
class DispatchContext {
 public:
  virtual ~DispatchContext() = default;
  virtual int world_size() const = 0;
  /// dp rank of every global rank in `mesh` (queried from the workers once, then cached).
  virtual const std::vector<int64_t>& dispatch_info(const std::string& mesh) = 0;
  /// Whether each global rank's output is kept for `mesh` (queried once, then cached).
  virtual const std::vector<bool>& collect_info(const std::string& mesh) = 0;
};

/// The output of a dispatch function.
struct Dispatched {
  /// One argument list per rank (world_size lists).
  std::vector<std::vector<Value>> per_rank;
  /// Rows added by auto-padding, dropped from the collected DataProto. Shared because a
  /// DataProtoFuture argument is padded only when it resolves.
  std::shared_ptr<std::atomic<int64_t>> padding = std::make_shared<std::atomic<int64_t>>(0);
};

using DispatchFn = std::function<Dispatched(DispatchContext&, std::vector<Value> args)>;
/// Receives the outputs of the executed ranks, in rank order.
using CollectFn = std::function<Value(DispatchContext&, std::vector<Value> outputs)>;

struct DispatchFns {
  DispatchFn dispatch;
  CollectFn collect;
  /// The collect result is a DataProto (a concat): a non-blocking call then returns a
  /// DataProtoFuture rather than a ValueFuture.
  bool collects_dataproto = false;
};

/// Which ranks run a call. With single_result the group returns that rank's output as the
/// result (verl's execute_rank_zero) instead of collecting.
struct ExecuteMode {
  std::function<std::vector<int>(int world_size)> ranks;
  bool single_result = false;
};

/// Registers a new dispatch mode; ValueError if the name exists.
void register_dispatch_mode(const std::string& name, DispatchFn dispatch, CollectFn collect,
                            bool collects_dataproto = false);
/// Replaces the functions of an existing mode; KeyError if the name is unknown.
void update_dispatch_mode(const std::string& name, DispatchFn dispatch, CollectFn collect,
                          bool collects_dataproto = false);
/// The functions of a mode; KeyError naming the mode and the known ones.
std::shared_ptr<const DispatchFns> dispatch_mode(const std::string& name);

void register_execute_mode(const std::string& name, ExecuteMode mode);
std::shared_ptr<const ExecuteMode> execute_mode(const std::string& name);

/// verl's make_nd_compute_dataproto_dispatch_fn: DataProto args are chunked into dp_size
/// pieces (no auto-padding), rank r gets piece dispatch_info[r]; outputs of ranks whose
/// collect_info is true are concatenated in rank order.
std::shared_ptr<const DispatchFns> make_nd_compute_dataproto_dispatch_fn(const std::string& mesh);

/// Auto-padding for DP_COMPUTE_PROTO when a batch's meta_info does not ask for it (verl's
/// DataProtoConfig.auto_padding). Also on when the environment sets VERL_AUTO_PADDING=1.
void set_auto_padding(bool enabled);
bool auto_padding_enabled();

/// The predefined functions, for reuse in user modes.
namespace dispatch_fns {
Dispatched one_to_all(DispatchContext& ctx, std::vector<Value> args);
Dispatched all_to_all(DispatchContext& ctx, std::vector<Value> args);
Dispatched dp_compute(DispatchContext& ctx, std::vector<Value> args);
Dispatched dp_compute_proto(DispatchContext& ctx, std::vector<Value> args);
Dispatched dp_compute_proto_with_func(DispatchContext& ctx, std::vector<Value> args);
Value collect_list(DispatchContext& ctx, std::vector<Value> outputs);
Value collect_rank_zero(DispatchContext& ctx, std::vector<Value> outputs);
Value collect_dp_compute(DispatchContext& ctx, std::vector<Value> outputs);
/// DataProto::concat of the outputs (each must be a DataProto).
Value collect_concat(DispatchContext& ctx, std::vector<Value> outputs);
/// Rows to add so that `rows` splits evenly into `chunks` (0 when it already does).
int64_t padding_for(int64_t rows, int64_t chunks);
}  // namespace dispatch_fns

}  // namespace hyflow::actors

// Short names in hyflow:: for what verl users and embedding applications write.
namespace hyflow {
namespace dispatch_fns = actors::dispatch_fns;
using actors::DispatchContext;
using actors::Dispatched;
using actors::DispatchFns;
using actors::make_nd_compute_dataproto_dispatch_fn;
using actors::register_dispatch_mode;
using actors::register_execute_mode;
using actors::update_dispatch_mode;
}  // namespace hyflow
