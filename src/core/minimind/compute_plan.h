// How a program computes, decided once: the products' precision and fp32 library, the cores
// and how they are split between OpenBLAS and torch, the micro-batch shards and the
// expert-parallel degree. Every program builds one plan from its resolved config and the
// machine (plan_compute), prints it (describe), builds its model with the plan's products
// (products(): each module picks its forward from them when it is built) and runs inside a
// ComputeScope that applies the rest; a training run stores it in state.json. Nothing else
// sets these.
//
// Why one place: set from several places, a program could accept a key and compute with
// another value; with one plan the line a program prints is what it ran.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "minimind/config.h"
#include "minimind/util/json_fields.h"
#include "minimind/util/matmul_peak.h"
#include "minimind/util/products.h"

namespace minimind {

// What the plan depends on besides the config: read once per process (this_machine), or
// made up by tests.
struct Machine {
  CpuFeatures cpu;
  int cores = 1;             // logical CPUs
  bool openblas = false;     // the loaded BLAS is OpenBLAS (its thread count can be set)
  std::string blas_kernels;  // OpenBLAS's kernel set ("SkylakeX"; "" for another BLAS)
};
Machine this_machine();

// What the plan is for.
struct Workload {
  bool training = false;     // shards and expert parallelism: training jobs only
  int64_t batch_size = 1;    // micro-batch rows (train.batch_size)
  int world_size = 1;        // ranks of the job (torchrun's WORLD_SIZE)
  int local_world_size = 1;  // ranks on this machine (LOCAL_WORLD_SIZE): they share its cores
  // false: the program runs no matrix products (minimind-export converts weights), so
  // run.precision is not checked against the CPU.
  bool products = true;
};

struct ComputePlan {
  Precision precision = Precision::fp32;
  bool bf16_emulation = false;
  MatmulBackend matmul = MatmulBackend::openblas;  // resolved: openblas or onednn
  std::string matmul_reason;  // why this library: "run.matmul: auto, AVX-512 CPU", ...
  int threads = 1;            // cores this process computes on (run.threads resolved)
  int blas_threads = 1;       // OpenBLAS's own threads (0: the BLAS is not OpenBLAS)
  int torch_threads = 1;      // torch's intra-op (OpenMP) threads
  int shards = 1;             // each micro-batch trained in this many shards side by side
  int expert_parallel = 1;    // ranks each MoE layer's routed experts are spread over
  int world_size = 1;
  std::string cpu;  // "AMD EPYC 7B13 (avx2 avx512f avx512_bf16)"

  // What the model is built with (MiniMindForCausalLM's constructor).
  Products products() const { return {precision, matmul}; }

  // One line: "compute plan: matrix products in fp32 on oneDNN (run.matmul: auto, AVX-512
  // CPU); 2 threads (OpenBLAS 2, torch 1); each micro-batch in 2 shards side by side; CPU
  // AMD EPYC 7B13 (avx2 avx512f avx512_bf16)".
  std::string describe() const;
  // For state.json, through fields() (util/json_fields.h); from_json reads what to_json
  // wrote (DataError naming a missing or mistyped field, or an unresolved library).
  nlohmann::json to_json() const;
  static ComputePlan from_json(const nlohmann::json& j);
  template <class R, class F>
  static void fields(R& r, F&& f) {
    f("precision", r.precision);
    // Plans written before run.bf16_emulation existed lack it: they ran without it.
    f("bf16_emulation", or_absent(r.bf16_emulation, false));
    f("matmul", r.matmul), f("matmul_reason", r.matmul_reason);
    f("threads", r.threads), f("blas_threads", r.blas_threads);
    f("torch_threads", r.torch_threads), f("shards", r.shards);
    f("expert_parallel", r.expert_parallel), f("world_size", r.world_size), f("cpu", r.cpu);
  }
  // The fields two runs can differ in, named by their keys ("run.precision: fp32 -> bf16"),
  // for a resumed run's log.
  std::vector<std::string> differences(const ComputePlan& before) const;
};

// The plan for `cfg` (resolved) on `machine`. Throws ConfigError naming the key for what this
// machine or workload cannot run: bf16 without bf16 instructions (unless
// run.bf16_emulation), run.expert_parallel that does not divide the job's ranks.
//   precision      run.precision
//   matmul         run.matmul; auto: oneDNN where the CPU has AVX-512, else OpenBLAS
//                  (auto_matmul: a rule on the CPU's flags, never a timing)
//   threads        run.threads; 0: the machine's cores / the ranks on it
//   blas / torch   all threads to OpenBLAS and one to torch when OpenBLAS is the BLAS
//                  (products are most of a step and OpenBLAS splits them well; torch's
//                  OpenMP threads spin after each region and take the cores from it);
//                  otherwise all to torch
//   shards         training: one per thread (at most one per row), 1 when the step draws
//                  from torch's one generator in order or ranks the whole batch
//                  (batch_shards)
//   expert_parallel run.expert_parallel for a training job (1 for a dense model, and for a
//                  program that loads a checkpoint: it holds the whole model)
ComputePlan plan_compute(const Config& cfg, const Machine& machine, const Workload& work);

// The same plan on another fp32 library (a resumed run keeping the one its checkpoint used,
// the ranks of a job taking rank 0's); `reason` says why.
ComputePlan with_matmul(ComputePlan plan, MatmulBackend matmul, const std::string& reason);

// How many shards a micro-batch of `batch_size` rows is trained in on `threads` cores: one
// per thread (at most one per row), or 1 when a step draws from torch's one generator in
// order (dropout, the random router) or ranks the whole batch's tokens (capacity).
int batch_shards(const ModelConfig& model, int64_t batch_size, int threads);

// Applies what of a plan is truly per process, OpenBLAS's and torch's thread counts, while it
// lives and restores what was there before when it ends, also when an exception leaves the
// scope. (The products are not here: the model is built with them.) Scopes nest; a program
// holds one for its whole run, a test one per case, minimind-bench one per variant in turn.
class ComputeScope {
 public:
  explicit ComputeScope(const ComputePlan& plan);
  ~ComputeScope();
  ComputeScope(const ComputeScope&) = delete;
  ComputeScope& operator=(const ComputeScope&) = delete;

 private:
  int blas_threads_, torch_threads_;  // what was there before
};

}  // namespace minimind
