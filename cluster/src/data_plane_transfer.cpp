// The data plane as the runtime's PayloadTransfer.
#include <hyflow/actors/payload_transfer.hpp>
#include <hyflow/cluster/data_plane.hpp>

#include <mutex>

namespace hyflow::cluster {
namespace {

class DataPlaneTransfer final : public actors::PayloadTransfer {
 public:
  bool in_use(bool caf_uses_tls) const override { return data_plane_in_use(caf_uses_tls); }

  std::function<void()> export_large(std::vector<Value>& values, bool expires) override {
    auto refs = cluster::export_large(values, expires);
    if (refs.empty()) return {};
    return [refs = std::move(refs)] {
      for (const auto& r : refs) DataPlane::process().release(r.id);
    };
  }
  void export_large(Value& value, bool expires) override { cluster::export_large(value, expires); }

  bool has_handles(const Value& value) const override { return !object_refs_in(value).empty(); }

  void import_handles(std::vector<Value>& values) override {
    import_refs(values, DataPlane::process_options().io_timeout);
  }
  void import_handles(Value& value) override { import_refs(value, DataPlane::process_options().io_timeout); }

  void discard_handles(const Value& value) noexcept override {
    try {
      const auto timeout = DataPlane::process_options().io_timeout;
      for (const auto& r : object_refs_in(value)) DataPlane::discard(r, timeout);
    } catch (...) {  // unreachable holders free their objects after object_ttl
    }
  }
};

}  // namespace

void install_data_plane() {
  static std::once_flag once;
  std::call_once(once, [] { actors::set_payload_transfer(std::make_shared<DataPlaneTransfer>()); });
}

}  // namespace hyflow::cluster
