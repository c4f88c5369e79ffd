#pragma once
// The seam through which large DataProtos leave the CAF messages of remote calls. The actors
// module only knows this interface; the cluster module installs its data plane here
// (hyflow/cluster/data_plane.hpp) when a process joins a cluster. Without one, every value
// travels inside its CAF message.

#include <hyflow/actors/value.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace hyflow::actors {

/// Every operation names the job (a controller session) the call belongs to: the id a remote
/// launcher gave its workers (empty: none). The cluster's data plane keys each object to its
/// job, so that one job's objects cannot be fetched or freed by another.
class PayloadTransfer {
 public:
  virtual ~PayloadTransfer() = default;
  /// Whether this process moves large payloads out of band; `caf_uses_tls` tells whether its
  /// CAF connections are encrypted (an unencrypted side channel may then be unwanted).
  virtual bool in_use(bool caf_uses_tls) const = 0;
  /// Replaces large DataProtos in `values` (also inside lists) by handles. With `expires`
  /// the holder frees unclaimed objects after a while (results for a caller that went away);
  /// without, the caller must run the returned release function once the call has settled
  /// (empty when nothing was replaced).
  virtual std::function<void()> export_large(std::vector<Value>& values, bool expires, const std::string& job) = 0;
  virtual void export_large(Value& value, bool expires, const std::string& job) = 0;
  /// Whether `value` holds handles (nothing is fetched).
  virtual bool has_handles(const Value& value) const = 0;
  /// Replaces every handle by the DataProto it names, pulled from its holder. Throws (naming
  /// the holder and the object) when one cannot be fetched; the others are then discarded.
  virtual void import_handles(std::vector<Value>& values, const std::string& job) = 0;
  virtual void import_handles(Value& value, const std::string& job) = 0;
  /// Frees, at their holders, the objects `value`'s handles name (a result nobody will read).
  virtual void discard_handles(const Value& value, const std::string& job) noexcept = 0;
};

/// The process-wide transfer (null: none installed). Installing replaces the previous one.
std::shared_ptr<PayloadTransfer> payload_transfer();
void set_payload_transfer(std::shared_ptr<PayloadTransfer> transfer);

}  // namespace hyflow::actors
