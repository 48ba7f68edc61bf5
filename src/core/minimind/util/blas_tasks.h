// Independent GEMM-bound tasks (the experts of a MoE layer) spread over the cores OpenBLAS
// has, each core running whole tasks with a one-thread OpenBLAS, instead of every core
// splitting every GEMM.
//
// Why: a small expert's GEMMs are too narrow to split well. On this project's 2-core
// machine a [512, 256] x [256, 52] GEMM ran at 42-90 GFLOP/s with OpenBLAS on 2 threads,
// while two one-thread GEMMs side by side ran at ~105 each; wide GEMMs gain too (a
// [2048, 256] x [256, 832] one: 145 with 2 threads, ~106 per core alone).
//
// Numbers do not change: OpenBLAS splits a GEMM over the rows and columns of its output,
// never over the sum, so each result is the same with one thread or several; and the
// tasks write disjoint outputs.
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

}  // namespace minimind
