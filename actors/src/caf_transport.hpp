#pragma once
// Internal to the actors module: a group's Transport on CAF (caf_transport.cpp): its calls go
// to the group's collector, which owns the conversation with the worker actors.

#include "runtime_core.hpp"

#include <hyflow/actors/runtime.hpp>

#include <caf/actor.hpp>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace hyflow::actors::detail {

class CafTransport : public Transport {
 public:
  CafTransport(std::shared_ptr<RuntimeCore> core, std::vector<WorkerRef> workers, bool owns);
  ~CafTransport() override;
  const std::vector<WorkerRef>& workers() const override { return workers_; }
  void submit(std::shared_ptr<PendingCall> call) override;
  void kill(int rank) override;
  bool alive(int rank) const override { return (*alive_)[static_cast<size_t>(rank)]; }

  /// Ends the collector (its pending calls fail) and, when this group owns them, the workers;
  /// drops the actor handles. Later calls fail with RuntimeStoppedError. Idempotent.
  void stop();

 private:
  std::shared_ptr<RuntimeCore> core_;  // small: holds no actor system
  std::vector<WorkerRef> workers_;
  bool owns_;
  std::shared_ptr<std::vector<std::atomic<bool>>> alive_;
  std::mutex mutex_;
  caf::actor collector_;
};

}  // namespace hyflow::actors::detail
