// The process-wide PayloadTransfer slot.
#include <hyflow/actors/payload_transfer.hpp>

#include <mutex>

namespace hyflow::actors {
namespace {
struct Slot {
  std::mutex mutex;
  std::shared_ptr<PayloadTransfer> transfer;
};
Slot& slot() {
  static Slot s;
  return s;
}
}  // namespace

std::shared_ptr<PayloadTransfer> payload_transfer() {
  auto& s = slot();
  std::lock_guard lock(s.mutex);
  return s.transfer;
}

void set_payload_transfer(std::shared_ptr<PayloadTransfer> transfer) {
  auto& s = slot();
  std::lock_guard lock(s.mutex);
  s.transfer = std::move(transfer);
}

}  // namespace hyflow::actors
