#include <hyflow/parallel/process_group.hpp>

#include <hyflow/core/error.hpp>
#include <hyflow/core/shape.hpp>
#include <hyflow/parallel/peer_liveness.hpp>
#include <hyflow/parallel/rendezvous_store.hpp>

#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#if HYFLOW_WITH_NCCL
#include "nccl/nccl_communicator.hpp"
#endif
#include <hyflow/core/torch_compat.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

namespace hyflow::parallel {

const char* to_string(Backend backend) {
  return backend == Backend::gloo ? "gloo" : "nccl";
}

bool nccl_available() {
  return HYFLOW_WITH_NCCL != 0;
}

ReduceOp reduce_op_for(ReduceOp op, at::ScalarType dtype, const std::string& what) {
  if (dtype != at::kBool) return op;
  if (op == ReduceOp::sum) return ReduceOp::max;
  if (op == ReduceOp::avg) throw ValueError(what + ": avg of bool tensors has no meaning (use sum or max for 'any')");
  return op;
}

Backend collective_backend(Backend backend, const c10::Device& device) {
  return backend == Backend::nccl && device.is_cuda() ? Backend::nccl : Backend::gloo;
}

namespace {

/// KeyValueStore over a c10d store (the group's PrefixStore).
class C10dStore : public KeyValueStore {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override { store_->set(key, value); }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    try {
      store_->wait({key}, timeout);
      return store_->get(key);
    } catch (const c10::Error& e) {
      throw Error("store: key '" + key + "' did not appear within " + std::to_string(timeout.count()) +
                  " ms: " + e.what_without_backtrace());
    }
  }
  std::optional<std::vector<uint8_t>> try_get(const std::string& key) override {
    if (!store_->check({key})) return std::nullopt;
    return store_->get(key);
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

/// c10d's view of the authenticated store (rendezvous_store.hpp), under gloo and PrefixStore:
/// one connection. Rank 0's also holds the server, which thus lives as long as any (sub-)group
/// uses the store, as c10d's TCPStore server did.
class AuthenticatedStore : public c10d::Store {
 public:
  AuthenticatedStore(RendezvousClientOptions options, std::chrono::milliseconds timeout,
                     std::shared_ptr<RendezvousServer> server = nullptr)
      : c10d::Store(timeout),
        options_(options),
        server_(std::move(server)),
        client_(std::make_shared<RendezvousClient>(std::move(options))) {}
  /// LibTorch 2.x's Store::clone (pure there, absent in 1.13): a connection of its own to the
  /// same store.
  virtual c10::intrusive_ptr<c10d::Store> clone() {
    return c10::make_intrusive<AuthenticatedStore>(options_, timeout_, server_);
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) override { client_->set(key, value); }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    return client_->compare_set(key, expected, desired);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    if (auto present = client_->get(key)) return *present;  // one round trip when the key is there
    wait({key});
    auto value = client_->get(key);
    TORCH_CHECK(value, "store key '", key, "' vanished (store ", client_->where(), ")");
    return *value;
  }
  int64_t add(const std::string& key, int64_t value) override { return client_->add(key, value); }
  bool deleteKey(const std::string& key) override { return client_->erase(key); }
  bool check(const std::vector<std::string>& keys) override { return client_->check(keys); }
  int64_t getNumKeys() override { return client_->num_keys(); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    if (keys.empty()) return;
    // c10d's kNoTimeout (0) waits for ever; a year is as good
    const auto bound = timeout == kNoTimeout ? std::chrono::milliseconds(std::chrono::hours(24 * 365)) : timeout;
    TORCH_CHECK(client_->wait(keys, bound), "wait for store key '", keys.front(), "' timed out after ",
                bound.count(), " ms (store ", client_->where(), ")");
  }

 private:
  RendezvousClientOptions options_;
  std::shared_ptr<RendezvousServer> server_;
  std::shared_ptr<RendezvousClient> client_;
};

std::string where(const ProcessGroupOptions& o) {
  return "rank " + std::to_string(o.rank) + " of " + std::to_string(o.world_size) + ", store " + o.master_addr + ":" +
         std::to_string(o.master_port);
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return c10d::ReduceOp::SUM;
    case ReduceOp::product:
      return c10d::ReduceOp::PRODUCT;
    case ReduceOp::min:
      return c10d::ReduceOp::MIN;
    case ReduceOp::max:
      return c10d::ReduceOp::MAX;
  }
  throw ValueError("unknown ReduceOp");
}

// gloo (LibTorch 1.13) reduces neither bool nor bfloat16 and broadcasts neither: bool travels as
// its 0/1 bytes (max, min and product of those are or, and, and), a broadcast only copies bits.
at::Tensor gloo_bits(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBool:
      return t.view(at::kByte);
    case at::kBFloat16:
    case at::kShort:
      return t.view(at::kHalf);
    default:
      return t;
  }
}

// output (world * n, ...) for input (n, ...), or the other way round for reduce_scatter.
void check_blocks(const char* op, const at::Tensor& big, const at::Tensor& small, int world) {
  const bool ok = big.dim() >= 1 && big.dim() == small.dim() && big.size(0) == world * small.size(0) &&
                  big.sizes().slice(1) == small.sizes().slice(1) && big.scalar_type() == small.scalar_type();
  if (!ok) {
    throw ShapeError(std::string(op) + ": needs " + std::to_string(world) + " x " + shape_of(small) +
                     " of the same dtype in the larger tensor, got " + shape_of(big) + " and " + shape_of(small));
  }
}

#if HYFLOW_WITH_NCCL
detail::NcclType nccl_type(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return detail::NcclType::f32;
    case at::kDouble:
      return detail::NcclType::f64;
    case at::kHalf:
      return detail::NcclType::f16;
    case at::kBFloat16:
      return detail::NcclType::bf16;
    case at::kChar:
      return detail::NcclType::i8;
    case at::kByte:
    case at::kBool:
      return detail::NcclType::u8;
    case at::kInt:
      return detail::NcclType::i32;
    case at::kLong:
      return detail::NcclType::i64;
    default:
      throw ValueError(std::string("nccl ") + op + ": unsupported dtype " + c10::toString(t.scalar_type()));
  }
}

detail::NcclOp nccl_op(ReduceOp requested, const at::Tensor& t, const std::string& what) {
  switch (reduce_op_for(requested, t.scalar_type(), what)) {
    case ReduceOp::sum:
      return detail::NcclOp::sum;
    case ReduceOp::product:
      return detail::NcclOp::product;
    case ReduceOp::min:
      return detail::NcclOp::min;
    case ReduceOp::max:
      return detail::NcclOp::max;
    case ReduceOp::avg:
      return detail::NcclOp::avg;
  }
  throw ValueError("unknown ReduceOp");
}
#endif

/// Whether (and why) a group was aborted; shared by a group, its sub-groups and the completion
/// callbacks of gloo work, which may outlive them.
struct AbortState {
  std::mutex mutex;
  std::condition_variable changed;
  std::optional<std::string> reason;
  std::atomic<bool> abandoned{false};  // a gloo work was given up while it still ran
  /// How long a failed gloo work waits for the liveness check to name the peer (0: no check).
  std::chrono::milliseconds verdict_wait{0};
};

/// Waits for a gloo work until it completes, or until the group is aborted (a peer is gone),
/// which throws CollectiveAbortedError naming `what`.
void wait_abortable(const c10::intrusive_ptr<c10d::Work>& work, const std::shared_ptr<AbortState>& state,
                    const std::string& what) {
  auto future = work->getFuture();
  future->addCallback([state](c10::ivalue::Future&) {
    { std::lock_guard lock(state->mutex); }
    state->changed.notify_all();
  });
  {
    std::unique_lock lock(state->mutex);
    state->changed.wait(lock, [&] { return future->completed() || state->reason.has_value(); });
    if (!future->completed()) {
      state->abandoned = true;
      throw CollectiveAbortedError(what + " was aborted: " + *state->reason);
    }
  }
  try {
    work->wait();
  } catch (const std::exception& e) {
    // gloo names only the broken socket ("Connection closed by peer [addr]:port"): the liveness
    // check names the rank and its node once that peer has been silent for peer_timeout.
    const auto* c10 = dynamic_cast<const c10::Error*>(&e);
    const std::string gloo = c10 ? c10->what_without_backtrace() : e.what();
    std::unique_lock lock(state->mutex);
    state->changed.wait_for(lock, state->verdict_wait, [&] { return state->reason.has_value(); });
    if (state->reason) throw CollectiveAbortedError(what + " failed: " + *state->reason + " (gloo: " + gloo + ")");
    throw Error(what + " failed: " + gloo);
  }
  // gloo's worker thread completes the work (which wakes us) and only then drops its two
  // references to it (its run loop's and execute's), and with the last one the work's tensors:
  // wait for that, so that the collective's tensors are the caller's alone on return and a
  // temporary the caller frees (broadcast_parameters' staging buffer) is freed now, on this
  // thread, not a moment later on gloo's. The caller holds the one reference left; the wait is
  // bounded in case a backend keeps another, and a backend (a LibTorch version) seen to keep one
  // past the bound is not waited for again: the wait is then at most one second per process.
  static std::atomic<bool> backend_keeps_work{false};
  if (backend_keeps_work.load(std::memory_order_relaxed)) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (work.use_count() > 1) {
    if (std::chrono::steady_clock::now() >= deadline) {
      backend_keeps_work.store(true, std::memory_order_relaxed);
      return;
    }
    std::this_thread::yield();
  }
}

/// A gloo collective in flight; `finish` runs once after it has completed.
class GlooWork : public Work {
 public:
  GlooWork(c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish, std::string what,
           std::shared_ptr<AbortState> abort_state)
      : work_(std::move(work)),
        finish_(std::move(finish)),
        what_(std::move(what)),
        abort_state_(std::move(abort_state)) {}
  ~GlooWork() override {
    if (done_) return;
    try {  // the collective still uses its tensors: never leave it running behind their owner's back
      wait_abortable(work_, abort_state_, what_);
    } catch (...) {
    }
  }
  void wait() override {
    if (done_) return;
    done_ = true;
    try {
      wait_abortable(work_, abort_state_, what_);
    } catch (const Error&) {
      throw;  // wait_abortable's, which names the op (and the dead peer when it is known)
    } catch (const c10::Error& e) {
      throw Error(what_ + " failed: " + e.what_without_backtrace());
    } catch (const std::exception& e) {
      throw Error(what_ + " failed: " + e.what());
    }
    if (finish_) finish_();
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::function<void()> finish_;
  std::string what_;
  std::shared_ptr<AbortState> abort_state_;
  bool done_ = false;
};

/// A collective that was complete (for the host) when it was issued: NCCL's stream-ordered ops.
class CompletedWork : public Work {
 public:
  void wait() override {}
};

}  // namespace

struct ProcessGroup::Impl {
  ProcessGroupOptions options;
  std::vector<std::string> nodes;            // each rank's node (ProcessGroupOptions::node)
  c10::intrusive_ptr<c10d::Store> store;
  std::unique_ptr<C10dStore> kv;
  c10::intrusive_ptr<torch_compat::GlooBase> group;  // gloo
  std::shared_ptr<AbortState> abort_state = std::make_shared<AbortState>();
  std::unique_ptr<PeerLiveness> liveness;

  std::string describe(const char* op) const {
    return std::string("gloo ") + op + " of group '" + options.name + "' (" + where(options) + ")";
  }

  void abort(const std::string& reason) {
    {
      std::lock_guard lock(abort_state->mutex);
      if (!abort_state->reason) abort_state->reason = reason;
    }
    abort_state->changed.notify_all();
  }

  void throw_if_aborted(const char* op) const {
    std::lock_guard lock(abort_state->mutex);
    if (abort_state->reason) {
      throw CollectiveAbortedError(describe(op) + " refused: the group was aborted: " + *abort_state->reason);
    }
  }

  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* op) {
    wait_abortable(work, abort_state, describe(op));
  }

  void start_liveness() {
    if (options.peer_timeout.count() <= 0 || options.world_size < 2) return;
    const auto interval =
        std::clamp(options.peer_timeout / 10, std::chrono::milliseconds(10), std::chrono::milliseconds(500));
    // its own connection, whose operations give up within 2 s; the liveness thread bounds the
    // time a stopped store may block it by wall time (peer_liveness.cpp)
    auto tcp = c10::make_intrusive<AuthenticatedStore>(store_client(std::chrono::milliseconds(2000)),
                                                       std::chrono::milliseconds(2000));
    auto own = std::make_unique<C10dStore>(c10::make_intrusive<c10d::PrefixStore>(options.name, tcp));
    // the verdict comes peer_timeout after the peer's last beat, which this rank saw up to a
    // round late: a few rounds of margin
    abort_state->verdict_wait = options.peer_timeout + 4 * interval;
    liveness = std::make_unique<PeerLiveness>(
        PeerLiveness::Options{.group = options.name,
                              .rank = options.rank,
                              .world_size = options.world_size,
                              .interval = interval,
                              .timeout = options.peer_timeout,
                              .store_address = options.master_addr + ":" + std::to_string(options.master_port),
                              .nodes = nodes},
        std::move(own), [this](const std::string& why) { abort(why); });
  }
  RendezvousClientOptions store_client(std::chrono::milliseconds timeout) const {
    return {
        .address = options.master_addr, .port = options.master_port, .token = options.store_token, .timeout = timeout};
  }
  /// Every rank's node, published before the gloo rendezvous (which every rank has passed when
  /// this reads them), for the failures that name a dead rank's node.
  void learn_nodes() {
    nodes.assign(static_cast<size_t>(options.world_size), "");
    for (int r = 0; r < options.world_size; ++r) {
      auto value = kv->get("node/" + std::to_string(r), options.timeout);
      nodes[static_cast<size_t>(r)].assign(value.begin(), value.end());
    }
  }
  /// Joins the gloo group of this rank: the whole group (backend gloo), or an nccl group's CPU
  /// side under the key prefix "cpu" (PyTorch's "cpu:gloo,cuda:nccl").
  void join_gloo() {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(
        options.bind_addr.empty() ? options.master_addr : options.bind_addr));
    c10::intrusive_ptr<c10d::Store> gloo_store = store;
    if (options.backend == Backend::nccl) gloo_store = c10::make_intrusive<c10d::PrefixStore>("cpu", store);
    group = c10::make_intrusive<c10d::ProcessGroupGloo>(gloo_store, options.rank, options.world_size, gloo_options);
  }
#if HYFLOW_WITH_NCCL
  std::unique_ptr<detail::NcclCommunicator> nccl;

  /// Whether a collective on `t` goes to NCCL: a CUDA tensor of an nccl group (collective_backend).
  bool on_nccl(const at::Tensor& t) const {
    return nccl && collective_backend(Backend::nccl, t.device()) == Backend::nccl;
  }
  /// on_nccl for an op with an output and an input, which must be on the same kind of device.
  bool on_nccl(const at::Tensor& output, const at::Tensor& input, const char* op) const {
    if (nccl && output.device().type() != input.device().type())
      throw ValueError(std::string(op) + ": output on " + output.device().str() + ", input on " + input.device().str() +
                       " (" + where(options) + ")");
    return on_nccl(output);
  }

  // The CUDA tensor's current stream (LibTorch with CUDA), or the legacy default stream.
  void* stream_of(const at::Tensor& t, const char* op) const {
    if (!t.is_cuda()) {
      throw ValueError(std::string("nccl ") + op + ": tensors must be on a CUDA device, got " + t.device().str() +
                       " (" + where(options) + ")");
    }
    if (!t.is_contiguous()) throw ValueError(std::string("nccl ") + op + ": tensors must be contiguous");
#if HYFLOW_TORCH_CUDA
    return torch_compat::current_stream(t.device().index());
#else
    return nullptr;
#endif
  }
#endif
};

ProcessGroup::ProcessGroup(const ProcessGroupOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
  if (options.world_size <= 0 || options.rank < 0 || options.rank >= options.world_size)
    throw ValueError("ProcessGroup: rank " + std::to_string(options.rank) + " is outside world size " +
                     std::to_string(options.world_size));
  if (options.master_port <= 0 || options.master_port > 65535)
    throw ValueError("ProcessGroup: master port " + std::to_string(options.master_port) + " is not a valid port (" +
                     where(options) + ")");
  if (options.backend == Backend::nccl && options.device < 0)
    throw ValueError("ProcessGroup: backend nccl needs the rank's CUDA device (ProcessGroupOptions::device, the "
                     "worker's own cuda index), got " + std::to_string(options.device) +
                     "; the current device is cuda:0 on every thread of a process, so ranks would share one GPU (" +
                     where(options) + ")");
  if (options.backend == Backend::nccl && !nccl_available())
    throw ValueError(
        "ProcessGroup: backend nccl needs a CUDA build of hyflow (-DHYFLOW_CUDA=ON with NCCL); this build "
        "has gloo only (" +
        where(options) + ")");
  try {
    std::shared_ptr<RendezvousServer> server;
    if (options.rank == 0) {
      server = std::make_shared<RendezvousServer>(RendezvousServerOptions{
          .address = options.master_addr, .port = options.master_port, .token = options.store_token});
    }
    auto tcp = c10::make_intrusive<AuthenticatedStore>(impl_->store_client(options.timeout), options.timeout,
                                                       std::move(server));
    impl_->store = c10::make_intrusive<c10d::PrefixStore>(options.name, tcp);
    impl_->kv = std::make_unique<C10dStore>(impl_->store);
    impl_->kv->set("node/" + std::to_string(options.rank),
                   std::vector<uint8_t>(options.node.begin(), options.node.end()));
    impl_->join_gloo();  // nccl groups too: CPU tensors and control never go to NCCL
    impl_->learn_nodes();
    impl_->start_liveness();
  } catch (const c10::Error& e) {
    throw Error("ProcessGroup rendezvous failed (" + where(options) + "): " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw Error("ProcessGroup rendezvous failed (" + where(options) + "): " + e.what());
  }
#if HYFLOW_WITH_NCCL
  if (options.backend == Backend::nccl) {
    impl_->nccl =
        std::make_unique<detail::NcclCommunicator>(*impl_->kv, options.name, options.rank, options.world_size,
                                                   options.device, options.timeout, options.collective_timeout);
  }
#endif
}

ProcessGroup::ProcessGroup() : impl_(std::make_unique<Impl>()) {}

ProcessGroup::~ProcessGroup() {
  if (!impl_) return;
  impl_->liveness.reset();  // stops the beating thread, which may call abort()
  if (impl_->abort_state->abandoned && impl_->group) {
    // gloo joins its worker threads on destruction, and one of them is still inside the
    // abandoned collective until gloo's own timeout: let that happen off this thread.
    std::thread([group = std::move(impl_->group), store = std::move(impl_->store)]() mutable {
      group.reset();
      store.reset();
    }).detach();
  }
}

void ProcessGroup::abort(const std::string& reason) {
  impl_->abort(reason);
}

std::optional<std::string> ProcessGroup::aborted() const {
  std::lock_guard lock(impl_->abort_state->mutex);
  return impl_->abort_state->reason;
}

const std::string& ProcessGroup::name() const {
  return impl_->options.name;
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_subgroup(const std::vector<int>& ranks, const std::string& name) {
  std::string listed;
  for (int r : ranks) listed += (listed.empty() ? "" : ", ") + std::to_string(r);
  const auto me = std::find(ranks.begin(), ranks.end(), rank());
  bool valid = !ranks.empty() && std::is_sorted(ranks.begin(), ranks.end()) &&
               std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end() && ranks.front() >= 0 &&
               ranks.back() < size() && me != ranks.end();
  if (!valid) {
    throw ValueError("new_subgroup '" + name + "': ranks [" + listed + "] must be sorted, unique, within world size " +
                     std::to_string(size()) + " and include this rank " + std::to_string(rank()));
  }
  auto sub = std::shared_ptr<ProcessGroup>(new ProcessGroup());
  auto& o = sub->impl_->options;
  o = impl_->options;
  o.rank = static_cast<int>(me - ranks.begin());
  o.world_size = static_cast<int>(ranks.size());
  o.name = impl_->options.name + "/" + name;
  // The parent's liveness check covers every rank of the sub-group: aborting one aborts both.
  sub->impl_->abort_state = impl_->abort_state;
  try {
    sub->impl_->store = c10::make_intrusive<c10d::PrefixStore>(name, impl_->store);
    sub->impl_->kv = std::make_unique<C10dStore>(sub->impl_->store);
    sub->impl_->join_gloo();
  } catch (const c10::Error& e) {
    throw Error("sub-group '" + o.name + "' of ranks [" + listed + "] failed to form (" + where(o) +
                "): " + e.what_without_backtrace());
  }
#if HYFLOW_WITH_NCCL
  if (o.backend == Backend::nccl) {
    sub->impl_->nccl = std::make_unique<detail::NcclCommunicator>(*sub->impl_->kv, o.name, o.rank, o.world_size,
                                                                  o.device, o.timeout, o.collective_timeout);
  }
#endif
  return sub;
}

std::unique_ptr<Work> ProcessGroup::all_gather_into_tensor_async(at::Tensor& output, const at::Tensor& input) {
  check_blocks("all_gather_into_tensor", output, input, size());
#if HYFLOW_WITH_NCCL
  if (impl_->on_nccl(output, input, "all_gather_into_tensor")) {
    all_gather_into_tensor(output, input);
    return std::make_unique<CompletedWork>();
  }
#endif
  if (!output.is_contiguous())
    throw ValueError("all_gather_into_tensor_async: output must be contiguous (group '" + name() + "')");
  // gloo has no bfloat16: a gather only copies bits, so it moves them as (2-byte) half
  const bool bf16 = input.scalar_type() == at::kBFloat16;
  std::vector<at::Tensor> in{bf16 ? input.contiguous().view(at::kHalf) : input.contiguous()};
  auto target = bf16 ? output.view(at::kHalf) : output;
  std::vector<std::vector<at::Tensor>> out(1);
  const int64_t n = input.size(0);
  for (int r = 0; r < size(); ++r) out[0].push_back(target.narrow(0, r * n, n));  // gloo copies into the views
  impl_->throw_if_aborted("all_gather_into_tensor");
  auto work = impl_->group->allgather(out, in);
  return std::make_unique<GlooWork>(std::move(work), nullptr, impl_->describe("all_gather_into_tensor"),
                                    impl_->abort_state);
}

std::unique_ptr<Work> ProcessGroup::reduce_scatter_async(at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  check_blocks("reduce_scatter", input, output, size());
#if HYFLOW_WITH_NCCL
  if (impl_->on_nccl(output, input, "reduce_scatter")) {
    reduce_scatter(output, input, op);
    return std::make_unique<CompletedWork>();
  }
#endif
  // gloo has no reduce_scatter: all-reduce a copy, keep this rank's block when it is done
  // (bfloat16, which gloo cannot reduce, in float32)
  auto all = input.scalar_type() == at::kBFloat16 ? input.to(at::kFloat) : input.contiguous().clone();
  std::vector<at::Tensor> tensors{input.scalar_type() == at::kBool ? gloo_bits(all) : all};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(reduce_op_for(op, input.scalar_type(), "reduce_scatter on group '" + name() + "'"));
  impl_->throw_if_aborted("reduce_scatter");
  auto work = impl_->group->allreduce(tensors, opts);
  at::Tensor out = output;
  const int world = size(), me = rank();
  auto finish = [all, out, op, world, me]() mutable {
    auto mine = all.narrow(0, me * out.size(0), out.size(0));
    if (op == ReduceOp::avg) mine.div_(world);
    out.copy_(mine);
  };
  return std::make_unique<GlooWork>(std::move(work), std::move(finish), impl_->describe("reduce_scatter"),
                                    impl_->abort_state);
}

std::unique_ptr<Work> ProcessGroup::all_reduce_async(at::Tensor& tensor, ReduceOp op) {
#if HYFLOW_WITH_NCCL
  if (impl_->on_nccl(tensor)) {
    all_reduce(tensor, op);
    return std::make_unique<CompletedWork>();
  }
#endif
  const bool bf16 = tensor.scalar_type() == at::kBFloat16;  // gloo cannot reduce it: float32 on the wire
  at::Tensor t = tensor, wire = bf16 ? tensor.to(at::kFloat) : tensor;
  std::vector<at::Tensor> tensors{tensor.scalar_type() == at::kBool ? gloo_bits(wire) : wire};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(reduce_op_for(op, tensor.scalar_type(), "all_reduce on group '" + name() + "'"));
  impl_->throw_if_aborted("all_reduce");
  auto work = impl_->group->allreduce(tensors, opts);
  const int world = size();
  std::function<void()> finish;
  if (op == ReduceOp::avg || bf16) {
    finish = [t, wire, world, op, bf16]() mutable {
      if (op == ReduceOp::avg) wire.div_(world);
      if (bf16) t.copy_(wire);
    };
  }
  return std::make_unique<GlooWork>(std::move(work), std::move(finish), impl_->describe("all_reduce"),
                                    impl_->abort_state);
}

int ProcessGroup::rank() const {
  return impl_->options.rank;
}
int ProcessGroup::size() const {
  return impl_->options.world_size;
}
Backend ProcessGroup::backend() const {
  return impl_->options.backend;
}
KeyValueStore& ProcessGroup::store() {
  return *impl_->kv;
}

torch_compat::GlooBase& ProcessGroup::native() {
  return *impl_->group;
}

void ProcessGroup::all_reduce(at::Tensor& tensor, ReduceOp op) {
#if HYFLOW_WITH_NCCL
  if (impl_->on_nccl(tensor)) {
    void* stream = impl_->stream_of(tensor, "all_reduce");
    impl_->nccl->all_reduce(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                            nccl_type(tensor, "all_reduce"),
                            nccl_op(op, tensor, "all_reduce on group '" + name() + "'"), stream);
    return;
  }
#endif
  const bool bf16 = tensor.scalar_type() == at::kBFloat16;  // gloo cannot reduce it: float32 on the wire
  at::Tensor wire = bf16 ? tensor.to(at::kFloat) : tensor;
  std::vector<at::Tensor> tensors{tensor.scalar_type() == at::kBool ? gloo_bits(wire) : wire};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(reduce_op_for(op, tensor.scalar_type(), "all_reduce on group '" + name() + "'"));
  impl_->throw_if_aborted("all_reduce");
  impl_->wait(impl_->group->allreduce(tensors, opts), "all_reduce");
  if (op == ReduceOp::avg) wire.div_(size());
  if (bf16) tensor.copy_(wire);
}

void ProcessGroup::broadcast(at::Tensor& tensor, int root) {
  if (root < 0 || root >= size())
    throw ValueError("broadcast: root " + std::to_string(root) + " outside world size " + std::to_string(size()));
#if HYFLOW_WITH_NCCL
  if (impl_->on_nccl(tensor)) {
    void* stream = impl_->stream_of(tensor, "broadcast");
    impl_->nccl->broadcast(tensor.data_ptr(), static_cast<size_t>(tensor.numel()), nccl_type(tensor, "broadcast"), root,
                           stream);
    return;
  }
#endif
  std::vector<at::Tensor> tensors{gloo_bits(tensor)};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  impl_->throw_if_aborted("broadcast");
  impl_->wait(impl_->group->broadcast(tensors, opts), "broadcast");
}

std::vector<at::Tensor> ProcessGroup::all_gather(const at::Tensor& tensor) {
#if HYFLOW_WITH_NCCL
  if (impl_->on_nccl(tensor)) {
    auto input = tensor.contiguous();
    auto output = at::empty({size(), input.numel()}, input.options());
    void* stream = impl_->stream_of(input, "all_gather");
    impl_->nccl->all_gather(input.data_ptr(), output.data_ptr(), static_cast<size_t>(input.numel()),
                            nccl_type(input, "all_gather"), stream);
    std::vector<at::Tensor> parts;
    for (int r = 0; r < size(); ++r) parts.push_back(output[r].view(input.sizes()));
    return parts;
  }
#endif
  std::vector<at::Tensor> input{tensor.contiguous()};
  std::vector<std::vector<at::Tensor>> output(1);
  for (int r = 0; r < size(); ++r) output[0].push_back(at::empty_like(input[0]));
  impl_->throw_if_aborted("all_gather");
  impl_->wait(impl_->group->allgather(output, input), "all_gather");
  return output[0];
}

void ProcessGroup::all_gather_into_tensor(at::Tensor& output, const at::Tensor& input) {
  check_blocks("all_gather_into_tensor", output, input, size());
#if HYFLOW_WITH_NCCL
  if (impl_->on_nccl(output, input, "all_gather_into_tensor")) {
    auto in = input.contiguous();
    void* stream = impl_->stream_of(output, "all_gather_into_tensor");
    impl_->nccl->all_gather(in.data_ptr(), output.data_ptr(), static_cast<size_t>(in.numel()),
                            nccl_type(in, "all_gather_into_tensor"), stream);
    return;
  }
#endif
  auto parts = all_gather(input);
  for (int r = 0; r < size(); ++r) output.narrow(0, r * input.size(0), input.size(0)).copy_(parts[r]);
}

void ProcessGroup::reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  check_blocks("reduce_scatter", input, output, size());
#if HYFLOW_WITH_NCCL
  if (impl_->on_nccl(output, input, "reduce_scatter")) {
    auto in = input.contiguous();
    void* stream = impl_->stream_of(output, "reduce_scatter");
    impl_->nccl->reduce_scatter(in.data_ptr(), output.data_ptr(), static_cast<size_t>(output.numel()),
                                nccl_type(in, "reduce_scatter"),
                                nccl_op(op, in, "reduce_scatter on group '" + name() + "'"), stream);
    return;
  }
#endif
  // gloo has no reduce_scatter: reduce everything, keep this rank's block
  auto all = input.clone();
  all_reduce(all, op);
  output.copy_(all.narrow(0, rank() * output.size(0), output.size(0)));
}

void ProcessGroup::barrier() {
#if HYFLOW_WITH_NCCL
  if (impl_->nccl) {
#if HYFLOW_TORCH_CUDA
    void* stream = torch_compat::current_stream(static_cast<c10::DeviceIndex>(impl_->nccl->device()));
#else
    void* stream = nullptr;
#endif
    impl_->nccl->barrier(stream);
    return;
  }
#endif
  impl_->throw_if_aborted("barrier");
  impl_->wait(impl_->group->barrier(), "barrier");
}

void ProcessGroup::synchronize() {
#if HYFLOW_WITH_NCCL
  if (impl_->nccl) impl_->nccl->synchronize();
#endif
}

}  // namespace hyflow::parallel
