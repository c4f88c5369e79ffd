#pragma once
// Ranks as threads for the FSDP tests: each builds its own gloo group on one store.

#include <hyflow/core/net.hpp>
#include <hyflow/parallel/process_group.hpp>

#include <chrono>
#include <exception>
#include <memory>
#include <thread>
#include <vector>

namespace test {

/// Runs fn(group) on `n` threads, one rank each; rethrows the first rank's exception, if any.
template <class Fn>
void run_ranks(int n, Fn fn) {
  using hyflow::parallel::ProcessGroup;
  using hyflow::parallel::ProcessGroupOptions;
  const int port = hyflow::pick_free_port();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(std::make_shared<ProcessGroup>(
            ProcessGroupOptions{.rank = r, .world_size = n, .master_port = port, .timeout = std::chrono::seconds(20)}));
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace test
