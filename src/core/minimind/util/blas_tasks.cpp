#include "minimind/util/blas_tasks.h"

#include <ATen/ThreadLocalState.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <numeric>
#include <system_error>
#include <thread>

#include "minimind/util/blas_check.h"
#include "minimind/util/step_part.h"

namespace minimind {

bool blas_tasks_serial(bool side_by_side) {
  return !side_by_side || blas_threads() <= 1;
}

void run_blas_tasks(const std::vector<int64_t>& order, const std::function<void(int64_t)>& task,
                    bool side_by_side) {
  const int threads = blas_tasks_serial(side_by_side) ? 1 : blas_threads();
  const int64_t workers = std::min<int64_t>(threads, static_cast<int64_t>(order.size()));
  if (workers <= 1) {
    for (const int64_t t : order) task(t);
    return;
  }
  const OneBlasThread one_thread;  // each task's GEMMs on its own core; restored on return
  std::atomic<size_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < order.size();) {
      try {
        task(order[i]);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next = order.size();  // the others stop after their current task
      }
    }
  };
  const at::ThreadLocalState state;  // the caller's grad mode, profiler, dispatch keys
  const StepPart part = current_step_part();
  std::vector<std::thread> helpers;
  for (int64_t w = 1; w < workers; ++w) {
    try {
      helpers.emplace_back([&] {
        const at::ThreadLocalStateGuard guard(state);
        const StepScope inherited(part);
        work();
      });
    } catch (const std::system_error&) {  // no thread to be had: fewer workers
      break;
    }
  }
  work();
  {
    const StepScope waiting(StepPart::wait);
    for (auto& h : helpers) h.join();
  }
  if (error) std::rethrow_exception(error);
}

void run_blas_tasks(int64_t n, const std::function<void(int64_t)>& task, bool side_by_side) {
  std::vector<int64_t> order(static_cast<size_t>(std::max<int64_t>(n, 0)));
  std::iota(order.begin(), order.end(), 0);
  run_blas_tasks(order, task, side_by_side);
}

void run_row_blocks(int64_t rows, int64_t block, const std::function<void(int64_t, int64_t)>& f) {
  run_blas_tasks((rows + block - 1) / block,
                 [&](int64_t b) { f(b * block, std::min(block, rows - b * block)); });
}

}  // namespace minimind
