#include "minimind/util/side_by_side.h"

#include <ATen/ThreadLocalState.h>

#include <exception>
#include <stdexcept>
#include <thread>

#include "minimind/util/blas_check.h"
#include "minimind/util/step_part.h"

namespace minimind {

void ShardGroup::sum(int shard, torch::Tensor& t, const std::function<void(torch::Tensor&)>& then) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (aborted_) throw std::runtime_error("another shard of this micro-batch failed");
  parts_.at(static_cast<size_t>(shard)) = t;
  if (++arrived_ == size()) {
    torch::Tensor total = parts_[0].clone();
    for (size_t s = 1; s < parts_.size(); ++s) total.add_(parts_[s]);
    if (then) {
      try {
        then(total);
      } catch (...) {
        aborted_ = true;
        changed_.notify_all();
        throw;
      }
    }
    result_ = total;
    arrived_ = 0;
    ++round_;
    for (auto& p : parts_) p.reset();
    changed_.notify_all();
  } else {
    const int64_t round = round_;
    const StepScope waiting(StepPart::wait);
    changed_.wait(lock, [&] { return round_ != round || aborted_; });
    if (round_ == round) throw std::runtime_error("another shard of this micro-batch failed");
  }
  // result_ stays until every shard has arrived at the next sum, this one included.
  t = result_.clone();
}

void ShardGroup::abort() {
  const std::lock_guard<std::mutex> lock(mutex_);
  aborted_ = true;
  changed_.notify_all();
}

void run_side_by_side(int n, ShardGroup& group, const std::function<void(int)>& task) {
  const OneBlasThread one_thread;  // each shard's GEMMs on its own core
  std::mutex error_mutex;
  std::exception_ptr error;
  auto run = [&](int s) {
    try {
      task(s);
    } catch (...) {
      {
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
      group.abort();
    }
  };
  const at::ThreadLocalState state;  // the caller's grad mode, profiler, dispatch keys
  const StepPart part = current_step_part();
  std::vector<std::thread> helpers;
  for (int s = 1; s < n; ++s) {
    try {
      helpers.emplace_back([&, s] {
        const at::ThreadLocalStateGuard guard(state);
        const StepScope inherited(part);
        run(s);
      });
    } catch (const std::system_error&) {  // no thread to be had: the others must not wait
      group.abort();
      for (auto& h : helpers) h.join();
      throw std::runtime_error("could not start a thread for each of the " + std::to_string(n) +
                               " shards of a micro-batch (set run.threads: 1)");
    }
  }
  run(0);
  const StepScope waiting(StepPart::wait);
  for (auto& h : helpers) h.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace minimind
