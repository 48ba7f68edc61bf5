#include "minimind/compute_plan.h"

#include <spdlog/fmt/fmt.h>
#include <torch/torch.h>

#include <algorithm>
#include <thread>

#include "minimind/error.h"
#include "minimind/util/blas_check.h"
#include "minimind/util/matmul.h"

namespace minimind {

Machine this_machine() {
  Machine m;
  m.cpu = cpu_features();
  m.cores = std::max(1u, std::thread::hardware_concurrency());
  m.openblas = blas_threads() > 0;
  m.blas_kernels = blas_core_name();
  return m;
}

int batch_shards(const ModelConfig& model, int64_t batch_size, int threads) {
  if (threads < 2 || batch_size < 2) return 1;
  if (model.dropout > 0) return 1;  // masks drawn from torch's one generator, in order
  if (model.use_moe && (model.capacity_factor > 0 || model.router == RouterKind::random))
    return 1;  // capacity ranks the whole batch's tokens; the random router draws
  return static_cast<int>(std::min<int64_t>(threads, batch_size));
}

ComputePlan plan_compute(const Config& cfg, const Machine& machine, const Workload& work) {
  const RunConfig& run = cfg.run;
  ComputePlan p;
  p.cpu = (machine.cpu.model.empty() ? std::string("unknown CPU") : machine.cpu.model) + " (" +
          machine.cpu.flags() + ")";

  p.precision = run.precision;
  p.bf16_emulation = run.bf16_emulation;
  if (p.precision == Precision::bf16 && work.products)
    check_bf16_cpu(machine.cpu, run.bf16_emulation);

  if (run.matmul == MatmulBackend::automatic) {
    p.matmul = auto_matmul(machine.cpu);
    p.matmul_reason = machine.cpu.avx512f ? "run.matmul: auto, AVX-512 CPU"
                      : machine.cpu.avx2  ? "run.matmul: auto, AVX2 CPU"
                                          : "run.matmul: auto, no AVX2";
  } else {
    p.matmul = run.matmul;
    p.matmul_reason = std::string("run.matmul: ") + name_of(run.matmul);
  }

  const int local = std::max(1, work.local_world_size);
  p.threads = run.threads > 0 ? static_cast<int>(run.threads) : std::max(1, machine.cores / local);
  p.blas_threads = machine.openblas ? p.threads : 0;
  p.torch_threads = machine.openblas ? 1 : p.threads;

  p.world_size = std::max(1, work.world_size);
  // Only a training job spreads the experts: a program that loads a checkpoint (trained with
  // them spread or not) holds the whole model.
  p.expert_parallel =
      cfg.model.use_moe && work.training ? static_cast<int>(run.expert_parallel) : 1;
  if (p.world_size % p.expert_parallel != 0)
    throw ConfigError(fmt::format("run.expert_parallel = {} does not divide the job's {} ranks",
                                  p.expert_parallel, p.world_size),
                      "use a divisor of WORLD_SIZE: the ranks form expert groups of that size");

  p.shards = work.training ? batch_shards(cfg.model, work.batch_size, p.threads) : 1;
  return p;
}

ComputePlan with_matmul(ComputePlan plan, MatmulBackend matmul, const std::string& reason) {
  TORCH_CHECK(matmul != MatmulBackend::automatic, "with_matmul: a resolved library");
  plan.matmul = matmul;
  plan.matmul_reason = reason;
  return plan;
}

std::string ComputePlan::describe() const {
  const char* fp32 = matmul == MatmulBackend::onednn ? "oneDNN" : "OpenBLAS";
  std::string out = "compute plan: ";
  if (precision == Precision::bf16)
    out += fmt::format(
        "matrix products in bf16 on oneDNN{} (fp32 sums; the router's in fp32 on {}, {})",
        bf16_emulation ? ", emulated" : "", fp32, matmul_reason);
  else
    out += fmt::format("matrix products in fp32 on {} ({})", fp32, matmul_reason);
  out += fmt::format("; {} thread{} (", threads, threads == 1 ? "" : "s");
  out += blas_threads > 0 ? fmt::format("OpenBLAS {}, torch {})", blas_threads, torch_threads)
                          : fmt::format("torch {})", torch_threads);
  if (shards > 1) out += fmt::format("; each micro-batch in {} shards side by side", shards);
  if (world_size > 1) out += fmt::format("; {} ranks", world_size);
  if (expert_parallel > 1) out += fmt::format("; experts over {} ranks", expert_parallel);
  out += "; CPU " + cpu;
  return out;
}

nlohmann::json ComputePlan::to_json() const {
  return write_record(*this);
}

ComputePlan ComputePlan::from_json(const nlohmann::json& j) {
  ComputePlan p;
  read_record(j, p);
  if (p.matmul == MatmulBackend::automatic)
    throw DataError("field 'matmul' is \"auto\": a plan holds the library it resolved");
  return p;
}

std::vector<std::string> ComputePlan::differences(const ComputePlan& before) const {
  std::vector<std::string> out;
  auto note = [&](const char* what, const std::string& was, const std::string& now) {
    if (was != now) out.push_back(fmt::format("{}: {} -> {}", what, was, now));
  };
  note("run.precision", name_of(before.precision), name_of(precision));
  note("run.matmul", name_of(before.matmul), name_of(matmul));
  note("threads", std::to_string(before.threads), std::to_string(threads));
  note("shards per micro-batch", std::to_string(before.shards), std::to_string(shards));
  note("ranks", std::to_string(before.world_size), std::to_string(world_size));
  note("run.expert_parallel", std::to_string(before.expert_parallel),
       std::to_string(expert_parallel));
  note("CPU", before.cpu, cpu);
  return out;
}

ComputeScope::ComputeScope(const ComputePlan& plan)
    : blas_threads_(blas_threads()), torch_threads_(torch::get_num_threads()) {
  if (plan.blas_threads > 0) set_blas_threads(plan.blas_threads);
  torch::set_num_threads(plan.torch_threads);
}

ComputeScope::~ComputeScope() {
  if (blas_threads_ > 0) set_blas_threads(blas_threads_);
  torch::set_num_threads(torch_threads_);
}

}  // namespace minimind
