// Independent tasks spread over the cores OpenBLAS has, each core running whole tasks with
// a one-thread OpenBLAS: GEMM-bound ones (the experts of a MoE layer), instead of every core
// splitting every GEMM, and the optimizer's memory-bound passes (optim.cpp), which would
// otherwise run on one core while OpenBLAS's threads wait.
//
// Why: a small expert's GEMMs are too narrow to split well. On this project's 2-core
// machine a [512, 256] x [256, 52] GEMM ran at 42-90 GFLOP/s with OpenBLAS on 2 threads and
// ~80-105 on one. Wide GEMMs are the other way round there: OpenBLAS's two threads beat two
// one-thread GEMMs side by side (the E = 4 experts' step was 10-25 % slower side by side),
// so callers choose (routed_experts.cpp: experts of width <= 128 only).
//
// Numbers: a task's GEMMs run on one thread, so they are those of a one-thread run. They
// can differ in the last bits from the same GEMM on several threads: OpenBLAS rounded a
// GEMM summing over many rows (a weight gradient, [256, 517] x [517, 832]) differently on
// two threads than on one. The tasks write disjoint outputs, so their order does not
// matter.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace minimind {

// Runs task(t) for each t of `order`, taken in that order (put the longest first) by as
// many threads as OpenBLAS has (the calling thread is one of them), with OpenBLAS at one
// thread meanwhile and restored after. The helper threads carry the caller's ATen
// thread-local state (grad mode, profiler). Serial when OpenBLAS has one thread or is not
// the BLAS. The first exception a task throws is rethrown here once all threads stopped.
void run_blas_tasks(const std::vector<int64_t>& order, const std::function<void(int64_t)>& task,
                    bool side_by_side = true);
// task(0) .. task(n - 1), taken in that order (tasks of about equal size).
void run_blas_tasks(int64_t n, const std::function<void(int64_t)>& task, bool side_by_side = true);

// f(first row, rows) over [0, rows) in blocks of `block` rows, the blocks as tasks of
// run_blas_tasks (side by side over the cores, or in order on the calling thread).
void run_row_blocks(int64_t rows, int64_t block, const std::function<void(int64_t, int64_t)>& f);

// Whether run_blas_tasks(..., side_by_side) runs its tasks one after another on the calling
// thread, in the order given (inside a task, a shard, or with a one-thread OpenBLAS).
bool blas_tasks_serial(bool side_by_side = true);

}  // namespace minimind
