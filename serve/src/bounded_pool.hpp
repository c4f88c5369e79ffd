#pragma once
// BoundedPool: cpp-httplib's task queue with a bounded backlog, shared by serve::Server and
// serve::Router (internal to hyflow::serve).

#include <httplib.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace hyflow::serve::detail {

// A thread pool with a bounded queue: when every thread is busy and `capacity` connections
// wait, the accepting thread serves the next one itself, so no more are accepted meanwhile
// (the kernel's backlog holds them) and nothing a client does grows the queue.
class BoundedPool : public httplib::TaskQueue {
 public:
  BoundedPool(size_t threads, size_t capacity) : capacity_(capacity) {
    for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
  }
  void enqueue(std::function<void()> fn) override {
    {
      std::unique_lock lk(mu_);
      if (jobs_.size() < capacity_) {
        jobs_.push_back(std::move(fn));
        cv_.notify_one();
        return;
      }
    }
    fn();
  }
  void shutdown() override {
    {
      std::lock_guard lk(mu_);
      shutdown_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void work() {
    while (true) {
      std::function<void()> fn;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return shutdown_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
    }
  }
  size_t capacity_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  bool shutdown_ = false;
};

}  // namespace hyflow::serve::detail
