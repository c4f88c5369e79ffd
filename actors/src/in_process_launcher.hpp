#pragma once
// Internal to the actors module: the Runtime's default launcher (in_process_launcher.cpp):
// each rank a detached worker actor of the Runtime's own actor system.

#include <hyflow/actors/runtime.hpp>

#include <memory>
#include <vector>

namespace hyflow::actors::detail {

class RuntimeCore;

class InProcessLauncher : public WorkerLauncher {
 public:
  explicit InProcessLauncher(std::weak_ptr<RuntimeCore> core) : core_(std::move(core)) {}
  std::vector<WorkerRef> launch(const WorkerSpec& spec, const std::vector<WorkerEnv>& envs) override;

 private:
  std::weak_ptr<RuntimeCore> core_;
};

}  // namespace hyflow::actors::detail
