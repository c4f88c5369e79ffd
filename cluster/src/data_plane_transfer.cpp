// The data plane as the runtime's PayloadTransfer.
#include <hyflow/actors/payload_transfer.hpp>
#include <hyflow/cluster/data_plane.hpp>

#include <mutex>

namespace hyflow::cluster {
namespace {

class DataPlaneTransfer final : public actors::PayloadTransfer {
 public:
  bool in_use(bool caf_uses_tls) const override { return data_plane_in_use(caf_uses_tls); }

  std::function<void()> export_large(std::vector<Value>& values, bool expires, const std::string& job) override {
    auto refs = cluster::export_large(values, expires, store_token(job));
    if (refs.empty()) return {};
    return [refs = std::move(refs)] {
      for (const auto& r : refs) DataPlane::process().release(r.id);
    };
  }
  void export_large(Value& value, bool expires, const std::string& job) override {
    cluster::export_large(value, expires, store_token(job));
  }

  bool has_handles(const Value& value) const override { return !object_refs_in(value).empty(); }

  void import_handles(std::vector<Value>& values, const std::string& job) override {
    import_refs(values, DataPlane::process_options().io_timeout, request_token(job));
  }
  void import_handles(Value& value, const std::string& job) override {
    import_refs(value, DataPlane::process_options().io_timeout, request_token(job));
  }

  void discard_handles(const Value& value, const std::string& job) noexcept override {
    try {
      const auto timeout = DataPlane::process_options().io_timeout;
      const auto token = request_token(job);
      for (const auto& r : object_refs_in(value)) DataPlane::discard(r, timeout, token);
    } catch (...) {  // unreachable holders free their objects after object_ttl
    }
  }

 private:
  /// The key objects of `job` are stored under (empty: the plane's own, the cluster's token).
  static std::string store_token(const std::string& job) { return job.empty() ? std::string() : request_token(job); }
  /// The token requests for `job`'s objects carry. Every remote call asks, almost always for the
  /// same job on the same thread (a worker's, a collector's): the last derivation is kept.
  static std::string request_token(const std::string& job) {
    std::string cluster = DataPlane::process_token();
    if (job.empty()) return cluster;
    thread_local std::string last_cluster, last_job, last_token;
    if (cluster != last_cluster || job != last_job) {
      last_token = job_data_plane_token(cluster, job);
      last_cluster = std::move(cluster);
      last_job = job;
    }
    return last_token;
  }
};

}  // namespace

void install_data_plane() {
  static std::once_flag once;
  std::call_once(once, [] { actors::set_payload_transfer(std::make_shared<DataPlaneTransfer>()); });
}

}  // namespace hyflow::cluster
