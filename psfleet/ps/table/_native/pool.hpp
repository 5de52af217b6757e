// A small pool of native threads for the shards of one table call. The calling thread
// works too, so a call never waits on a pool thread to start (or on none, in a child
// process after fork, whose pool is replaced empty).
#pragma once

#include <functional>
#include <string>

namespace psfleet {

// Threads a call may use (the caller included); 0: min(hardware cores, tasks).
void set_pool_threads(int n);
int pool_threads();

// Runs fn(0) .. fn(tasks - 1), each once, on up to ``threads`` threads (caller
// included), and returns when all are done. Thread safe; calls may overlap. An
// exception thrown by fn is rethrown here as std::runtime_error (the first one).
void run_tasks(int tasks, int threads, const std::function<void(int)>& fn);

}  // namespace psfleet
