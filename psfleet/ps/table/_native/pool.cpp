// The pool of pool.hpp: persistent threads taking helper jobs from one queue; a call
// hands out its tasks through an atomic counter shared with its helpers.
#include "pool.hpp"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace psfleet {
namespace {

struct Call {
  const std::function<void(int)>* fn = nullptr;
  int tasks = 0;
  std::atomic<int> next{0};
  std::atomic<int> done{0};
  std::mutex mu;
  std::condition_variable finished;
  std::string error;

  void work() {
    for (int t = next.fetch_add(1); t < tasks; t = next.fetch_add(1)) {
      try {
        (*fn)(t);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        if (error.empty()) error = e.what();
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (error.empty()) error = "unknown native error";
      }
      if (done.fetch_add(1) + 1 == tasks) {
        std::lock_guard<std::mutex> lock(mu);
        finished.notify_all();
      }
    }
  }
};

class Pool {
 public:
  void ensure(int helpers) {
    std::lock_guard<std::mutex> lock(mu_);
    while (static_cast<int>(started_) < helpers) {
      std::thread([this] { loop(); }).detach();
      ++started_;
    }
  }
  void submit(const std::shared_ptr<Call>& call, int helpers) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int i = 0; i < helpers; ++i) queue_.push_back(call);
    }
    ready_.notify_all();
  }

 private:
  void loop() {
    for (;;) {
      std::shared_ptr<Call> call;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ready_.wait(lock, [this] { return !queue_.empty(); });
        call = std::move(queue_.front());
        queue_.pop_front();
      }
      call->work();
    }
  }
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::shared_ptr<Call>> queue_;
  unsigned started_ = 0;
};

// Never destroyed: its threads may still wait on it while the process exits.
std::atomic<Pool*> g_pool{new Pool()};
std::atomic<int> g_threads{0};

void after_fork_in_child() { g_pool.store(new Pool()); }  // the old one's threads are gone
const int g_atfork = pthread_atfork(nullptr, nullptr, after_fork_in_child);

}  // namespace

void set_pool_threads(int n) { g_threads.store(std::max(0, n)); }
int pool_threads() { return g_threads.load(); }

void run_tasks(int tasks, int threads, const std::function<void(int)>& fn) {
  (void)g_atfork;
  if (tasks <= 0) return;
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  const int want = threads > 0 ? threads : cores;
  const int used = std::min(want, tasks);
  if (used <= 1) {
    for (int t = 0; t < tasks; ++t) fn(t);
    return;
  }
  auto call = std::make_shared<Call>();
  call->fn = &fn;
  call->tasks = tasks;
  Pool* pool = g_pool.load();
  pool->ensure(used - 1);
  pool->submit(call, used - 1);
  call->work();
  {
    std::unique_lock<std::mutex> lock(call->mu);
    call->finished.wait(lock, [&] { return call->done.load() == tasks; });
    if (!call->error.empty()) throw std::runtime_error(call->error);
  }
}

}  // namespace psfleet
