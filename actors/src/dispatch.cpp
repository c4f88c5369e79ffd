#include <hyflow/actors/dispatch.hpp>
#include <hyflow/core/named_registry.hpp>

#include <cstdlib>
#include <map>
#include <numeric>

namespace hyflow::actors {

namespace dispatch_fns {

namespace {
std::string arg_label(size_t i) { return "argument " + std::to_string(i); }

/// Pads (when enabled) and chunks one DataProto into `chunks` pieces.
std::vector<Value> chunk_dataproto(const DataProto& d, int64_t chunks, bool allow_padding, int64_t& padding) {
  DataProto data = d;
  if (allow_padding && (d.is_padding_enabled() || auto_padding_enabled())) {
    padding = padding_for(d.size(), chunks);
    if (padding > 0) data.padding(padding);
  }
  auto pieces = data.chunk(chunks);
  if (static_cast<int64_t>(pieces.size()) != chunks)
    throw ShapeError("cannot split a batch of " + std::to_string(d.size()) + " rows into " + std::to_string(chunks) +
                     " chunks (enable auto-padding, meta_info[\"" + kAutoPaddingKey + "\"] = true)");
  return {pieces.begin(), pieces.end()};
}

/// A future argument is padded and chunked when it resolves; the padding is published
/// through `padding` before any chunk is handed out.
std::vector<Value> chunk_future(const DataProtoFuture& f, int64_t chunks, bool allow_padding,
                                const std::shared_ptr<std::atomic<int64_t>>& padding) {
  auto padded = f.map([chunks, allow_padding, padding](DataProto d) {
    if (allow_padding && (d.is_padding_enabled() || auto_padding_enabled())) {
      int64_t pad = padding_for(d.size(), chunks);
      if (pad > 0) d.padding(pad);
      padding->store(pad);
    }
    return d;
  });
  auto pieces = padded.chunk(chunks);
  return {pieces.begin(), pieces.end()};
}

/// Splits every DataProto (or future) argument into `chunks`; other arguments are replicated
/// when `replicate_first` holds for them, otherwise rejected. All batches must have one size.
Dispatched split_proto_args(std::vector<Value> args, int64_t chunks, bool allow_padding, size_t first_split) {
  Dispatched out;
  out.per_rank.assign(static_cast<size_t>(chunks), std::vector<Value>(args.size()));
  int64_t rows = -1;
  size_t rows_arg = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    Value& a = args[i];
    std::vector<Value> pieces;
    if (i < first_split) {
      pieces.assign(static_cast<size_t>(chunks), a);
    } else if (a.is_dataproto()) {
      const int64_t n = a.dataproto().size();
      if (rows >= 0 && n != rows)
        throw ShapeError("DP dispatch: " + arg_label(i) + " has " + std::to_string(n) + " rows but " +
                         arg_label(rows_arg) + " has " + std::to_string(rows));
      rows = n;
      rows_arg = i;
      int64_t pad = 0;
      pieces = chunk_dataproto(a.dataproto(), chunks, allow_padding, pad);
      out.padding->store(pad);
    } else if (a.is_dataproto_future()) {
      pieces = chunk_future(a.dataproto_future(), chunks, allow_padding, out.padding);
    } else {
      throw BindError("DP dispatch: " + arg_label(i) + " must be a DataProto or DataProtoFuture, got " + a.kind());
    }
    for (int64_t r = 0; r < chunks; ++r)
      out.per_rank[static_cast<size_t>(r)][i] = std::move(pieces[static_cast<size_t>(r)]);
  }
  return out;
}
}  // namespace

int64_t padding_for(int64_t rows, int64_t chunks) {
  if (chunks <= 0) throw ValueError("padding_for: chunks must be positive, got " + std::to_string(chunks));
  const int64_t rem = rows % chunks;
  return rem == 0 ? 0 : chunks - rem;
}

Dispatched one_to_all(DispatchContext& ctx, std::vector<Value> args) {
  Dispatched out;
  out.per_rank.assign(static_cast<size_t>(ctx.world_size()), args);
  return out;
}

Dispatched all_to_all(DispatchContext& ctx, std::vector<Value> args) {
  // verl's execute_all: when every argument is a list of world_size, element i goes to
  // rank i; otherwise every rank gets the arguments unchanged.
  const size_t ws = static_cast<size_t>(ctx.world_size());
  bool split = !args.empty();
  for (const auto& a : args) split = split && a.is_list() && a.list().size() == ws;
  if (!split) return one_to_all(ctx, std::move(args));
  Dispatched out;
  out.per_rank.assign(ws, std::vector<Value>(args.size()));
  for (size_t i = 0; i < args.size(); ++i)
    for (size_t r = 0; r < ws; ++r) out.per_rank[r][i] = std::move(args[i].list()[r]);
  return out;
}

Dispatched dp_compute(DispatchContext& ctx, std::vector<Value> args) {
  const size_t ws = static_cast<size_t>(ctx.world_size());
  Dispatched out;
  out.per_rank.assign(ws, std::vector<Value>(args.size()));
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].is_list() || args[i].list().size() != ws)
      throw ShapeError("DP_COMPUTE: " + arg_label(i) + " must be a per-rank list of " + std::to_string(ws) +
                       " values, got " + args[i].kind());
    for (size_t r = 0; r < ws; ++r) out.per_rank[r][i] = std::move(args[i].list()[r]);
  }
  return out;
}

Dispatched dp_compute_proto(DispatchContext& ctx, std::vector<Value> args) {
  return split_proto_args(std::move(args), ctx.world_size(), /*allow_padding=*/true, 0);
}

Dispatched dp_compute_proto_with_func(DispatchContext& ctx, std::vector<Value> args) {
  if (args.empty() || !args[0].is_json() || !args[0].json().is_string())
    throw BindError("DP_COMPUTE_PROTO_WITH_FUNC: argument 0 must be the name of a registered worker function, got " +
                    (args.empty() ? std::string("no arguments") : args[0].kind()));
  return split_proto_args(std::move(args), ctx.world_size(), /*allow_padding=*/false, 1);
}

Value collect_list(DispatchContext&, std::vector<Value> outputs) { return Value(std::move(outputs)); }

Value collect_rank_zero(DispatchContext&, std::vector<Value> outputs) {
  if (outputs.empty()) throw ShapeError("RANK_ZERO collect: no outputs");
  return std::move(outputs.front());
}

Value collect_dp_compute(DispatchContext& ctx, std::vector<Value> outputs) {
  if (static_cast<int>(outputs.size()) != ctx.world_size())
    throw ShapeError("DP_COMPUTE collect: expected " + std::to_string(ctx.world_size()) + " outputs, got " +
                     std::to_string(outputs.size()));
  return Value(std::move(outputs));
}

Value collect_concat(DispatchContext&, std::vector<Value> outputs) {
  std::vector<DataProto> parts;
  parts.reserve(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].is_dataproto())
      throw BindError("concat collect: output " + std::to_string(i) + " is " + outputs[i].kind() + ", not a DataProto");
    parts.push_back(std::move(outputs[i].dataproto()));
  }
  if (parts.empty()) throw ShapeError("concat collect: no outputs");
  // Always through concat, as verl does: with one worker too, meta_info["metrics"] becomes a
  // dict of lists (tensors of a single part are passed through without a copy).
  return Value(DataProto::concat(parts));
}

}  // namespace dispatch_fns

namespace {

Dispatched direct_rollout_dispatch(DispatchContext&, std::vector<Value>) {
  throw NotSupportedError(
      "DIRECT_ROLLOUT_METHOD methods cannot be called through a WorkerGroup; the rollout calls them on the worker");
}

std::map<std::string, std::shared_ptr<const DispatchFns>> builtin_dispatch_modes() {
  using namespace dispatch_fns;
  std::map<std::string, std::shared_ptr<const DispatchFns>> modes;
  auto add = [&](const char* name, DispatchFn d, CollectFn c, bool proto) {
    modes[name] = std::make_shared<DispatchFns>(DispatchFns{std::move(d), std::move(c), proto});
  };
  add(Dispatch::RANK_ZERO, one_to_all, collect_rank_zero, false);
  add(Dispatch::ONE_TO_ALL, one_to_all, collect_list, false);
  add(Dispatch::ALL_TO_ALL, all_to_all, collect_list, false);
  add(Dispatch::DP_COMPUTE, dp_compute, collect_dp_compute, false);
  add(Dispatch::DP_COMPUTE_PROTO, dp_compute_proto, collect_concat, true);
  add(Dispatch::DP_COMPUTE_PROTO_WITH_FUNC, dp_compute_proto_with_func, collect_concat, true);
  add(Dispatch::DP_COMPUTE_METRIC, dp_compute_proto, collect_list, false);
  add(Dispatch::DIRECT_ROLLOUT_METHOD, direct_rollout_dispatch, collect_list, false);
  return modes;
}

std::map<std::string, std::shared_ptr<const ExecuteMode>> builtin_execute_modes() {
  std::map<std::string, std::shared_ptr<const ExecuteMode>> modes;
  modes[Execute::ALL] = std::make_shared<ExecuteMode>(ExecuteMode{
      [](int ws) {
        std::vector<int> r(static_cast<size_t>(ws));
        std::iota(r.begin(), r.end(), 0);
        return r;
      },
      false});
  modes[Execute::RANK_ZERO] = std::make_shared<ExecuteMode>(ExecuteMode{[](int) { return std::vector<int>{0}; }, true});
  return modes;
}

NamedRegistry<std::shared_ptr<const DispatchFns>>& dispatch_registry() {
  static NamedRegistry<std::shared_ptr<const DispatchFns>> registry("dispatch mode", builtin_dispatch_modes());
  return registry;
}

NamedRegistry<std::shared_ptr<const ExecuteMode>>& execute_registry() {
  static NamedRegistry<std::shared_ptr<const ExecuteMode>> registry("execute mode", builtin_execute_modes());
  return registry;
}

std::atomic<bool>& auto_padding_flag() {
  static std::atomic<bool> flag = [] {
    const char* env = std::getenv("VERL_AUTO_PADDING");
    return env != nullptr && (std::string(env) == "1" || std::string(env) == "true" || std::string(env) == "TRUE");
  }();
  return flag;
}

}  // namespace

void register_dispatch_mode(const std::string& name, DispatchFn dispatch, CollectFn collect, bool collects_dataproto) {
  if (!dispatch || !collect) throw ValueError("register_dispatch_mode('" + name + "'): both functions are required");
  dispatch_registry().add(
      name, std::make_shared<DispatchFns>(DispatchFns{std::move(dispatch), std::move(collect), collects_dataproto}));
}

void update_dispatch_mode(const std::string& name, DispatchFn dispatch, CollectFn collect, bool collects_dataproto) {
  if (!dispatch || !collect) throw ValueError("update_dispatch_mode('" + name + "'): both functions are required");
  dispatch_registry().replace(
      name, std::make_shared<DispatchFns>(DispatchFns{std::move(dispatch), std::move(collect), collects_dataproto}));
}

std::shared_ptr<const DispatchFns> dispatch_mode(const std::string& name) { return dispatch_registry().get(name); }

void register_execute_mode(const std::string& name, ExecuteMode mode) {
  if (!mode.ranks) throw ValueError("register_execute_mode('" + name + "'): the ranks function is required");
  execute_registry().add(name, std::make_shared<ExecuteMode>(std::move(mode)));
}

std::shared_ptr<const ExecuteMode> execute_mode(const std::string& name) { return execute_registry().get(name); }

std::shared_ptr<const DispatchFns> make_nd_compute_dataproto_dispatch_fn(const std::string& mesh) {
  auto dispatch = [mesh](DispatchContext& ctx, std::vector<Value> args) {
    const auto& dp_rank = ctx.dispatch_info(mesh);  // lazy: queried once per group, then cached
    // Warm the collect cache too: a non-blocking call collects on the transport's thread,
    // which must not issue a call of its own.
    ctx.collect_info(mesh);
    if (static_cast<int>(dp_rank.size()) != ctx.world_size())
      throw ShapeError("nd dispatch for mesh '" + mesh + "': " + std::to_string(dp_rank.size()) +
                       " dispatch entries for world size " + std::to_string(ctx.world_size()));
    int64_t dp_size = 0;
    for (int64_t r : dp_rank) dp_size = std::max(dp_size, r + 1);
    Dispatched chunks = dispatch_fns::split_proto_args(std::move(args), dp_size, /*allow_padding=*/false, 0);
    Dispatched out;
    out.per_rank.reserve(dp_rank.size());
    for (int64_t r : dp_rank) out.per_rank.push_back(chunks.per_rank[static_cast<size_t>(r)]);
    return out;
  };
  auto collect = [mesh](DispatchContext& ctx, std::vector<Value> outputs) {
    const auto& keep = ctx.collect_info(mesh);
    if (keep.size() != outputs.size())
      throw ShapeError("nd collect for mesh '" + mesh + "': " + std::to_string(keep.size()) + " collect flags for " +
                       std::to_string(outputs.size()) + " outputs");
    std::vector<Value> kept;
    for (size_t r = 0; r < outputs.size(); ++r)
      if (keep[r]) kept.push_back(std::move(outputs[r]));
    return dispatch_fns::collect_concat(ctx, std::move(kept));
  };
  return std::make_shared<DispatchFns>(DispatchFns{dispatch, collect, true});
}

void set_auto_padding(bool enabled) { auto_padding_flag().store(enabled); }
bool auto_padding_enabled() { return auto_padding_flag().load(); }

}  // namespace hyflow::actors
