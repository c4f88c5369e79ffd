#pragma once
// Ranks as threads for the parallel tests: each builds its own gloo group on one store.
//
// Catch's assertion macros are not thread-safe (concurrent CHECKs from rank threads corrupt its
// state: a cold CI run crashed in test_fsdp_checkpoint), so rank threads never call them: they
// record results in a RankChecks (RANK_CHECK, RankChecks::throws) and the test's own thread
// reports the failures after run_ranks joined the ranks.

#include <hyflow/core/net.hpp>
#include <hyflow/parallel/process_group.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace test {

/// Runs fn on `n` threads, one rank each, with the rank's group (as a shared_ptr or, when fn takes
/// one, a ProcessGroup&); rethrows the first rank's exception, if any, after joining them all.
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
        auto group = std::make_shared<ProcessGroup>(
            ProcessGroupOptions{.rank = r, .world_size = n, .master_port = port, .timeout = std::chrono::seconds(20)});
        if constexpr (std::is_invocable_v<Fn&, ProcessGroup&>)
          fn(*group);
        else
          fn(group);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

/// Check results recorded by rank threads (thread-safe), reported on the test's thread.
class RankChecks {
 public:
  /// Records a failure naming `what` when `ok` is false.
  void check(bool ok, const std::string& what) {
    std::lock_guard lock(mutex_);
    ++checks_;
    if (!ok) failures_.push_back(what);
  }
  /// Records a failure unless `fn` throws an E whose message contains each of `contains`.
  template <class E, class Fn>
  void throws(Fn&& fn, const std::string& what, const std::vector<std::string>& contains = {}) {
    try {
      fn();
    } catch (const E& e) {
      const std::string message = e.what();
      for (const auto& part : contains)
        if (message.find(part) == std::string::npos) {
          check(false, what + ": the message '" + message + "' lacks '" + part + "'");
          return;
        }
      check(true, what);
      return;
    } catch (const std::exception& e) {
      check(false, what + ": threw another type: " + e.what());
      return;
    }
    check(false, what + ": did not throw");
  }
  /// On the test's thread, after the ranks joined: one failed check per recorded failure, and a
  /// failure when fewer than `expected` checks ran (a rank that skipped its checks).
  void report(int expected) const {
    std::lock_guard lock(mutex_);
    for (const auto& f : failures_) FAIL_CHECK("on a rank: " << f);
    CHECK(checks_ >= expected);
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> failures_;
  int checks_ = 0;
};

}  // namespace test

/// CHECK for rank threads: records the expression and line in `checks` (a test::RankChecks).
#define RANK_CHECK(checks, ...) \
  (checks).check(static_cast<bool>(__VA_ARGS__), std::string(#__VA_ARGS__) + " (line " + std::to_string(__LINE__) + ")")
