#pragma once
// Errors of the worker runtime. Every message names the method, the rank and what happened.

#include <hyflow/core/error.hpp>

#include <string>
#include <vector>

namespace hyflow::actors {

/// A method failed on a worker (it threw, or the worker is gone). what() reads
/// "method 'update_critic' failed on rank 2 of 4: <worker's message>".
class CallError : public Error {
 public:
  CallError(std::string method, int rank, std::string message, std::string what, std::string kind = {})
      : Error(std::move(what)), method_(std::move(method)), rank_(rank), message_(std::move(message)),
        kind_(std::move(kind)) {}
  const std::string& method() const { return method_; }
  /// The lowest failed rank (-1 when the failure is not tied to one rank).
  int rank() const { return rank_; }
  /// The worker's own message (e.g. the exception text).
  const std::string& message() const { return message_; }
  /// The class of the worker's exception ("std::runtime_error", "ValueError"); empty when the
  /// failure was not an exception in a method (a dead worker, a deadline).
  const std::string& kind() const { return kind_; }

 private:
  std::string method_;
  int rank_;
  std::string message_;
  std::string kind_;
};

/// The worker of `rank` died (or was dead already) while the call was pending.
class WorkerDiedError : public CallError {
 public:
  using CallError::CallError;
};

/// The watchdog deadline passed; ranks() are the ranks that had not answered.
class CallTimeoutError : public CallError {
 public:
  CallTimeoutError(std::string method, std::vector<int> ranks, std::string what)
      : CallError(std::move(method), ranks.empty() ? -1 : ranks.front(), "deadline exceeded", std::move(what)),
        ranks_(std::move(ranks)) {}
  const std::vector<int>& ranks() const { return ranks_; }

 private:
  std::vector<int> ranks_;
};

/// A call through a group whose Runtime was destroyed: it was in flight when the Runtime
/// stopped, or it came after. The group handle stays safe to hold, copy and destroy.
class RuntimeStoppedError : public CallError {
 public:
  explicit RuntimeStoppedError(const std::string& method)
      : CallError(method, -1, "the hyflow Runtime was shut down",
                  "method '" + method + "': the hyflow Runtime was shut down (a group handle outlived its Runtime)") {}
};

/// A call that the runtime refuses by design (e.g. DIRECT_ROLLOUT_METHOD through a group).
class NotSupportedError : public Error {
 public:
  using Error::Error;
};

/// A method called with arguments of the wrong number or type, or an unknown method. method()
/// names the method when one was called by name (empty for a member that is in no table);
/// rank() is the rank whose arguments did not bind, -1 when the call was refused before any
/// rank was asked (an unknown method, a wrong argument count).
class BindError : public Error {
 public:
  explicit BindError(std::string what, std::string method = {}, int rank = -1)
      : Error(std::move(what)), method_(std::move(method)), rank_(rank) {}
  const std::string& method() const { return method_; }
  int rank() const { return rank_; }

 private:
  std::string method_;
  int rank_;
};

}  // namespace hyflow::actors

// Short names in hyflow:: for what verl users and embedding applications write.
namespace hyflow {
using actors::BindError;
using actors::CallError;
using actors::CallTimeoutError;
using actors::NotSupportedError;
using actors::RuntimeStoppedError;
using actors::WorkerDiedError;
}  // namespace hyflow
