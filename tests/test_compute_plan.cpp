// The compute plan (compute_plan.h): each setting decided from the config and the machine by
// the documented rule, refusals naming the key, the JSON a checkpoint keeps, and a scope
// that applies a plan and restores what was there before.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>
#include <string>

#include "minimind/compute_plan.h"
#include "minimind/error.h"
#include "minimind/util/blas_check.h"
#include "minimind/util/matmul.h"
#include "support/test_support.h"

namespace minimind {
namespace {

Machine machine(const std::string& flags, int cores, bool openblas) {
  Machine m;
  m.cpu = parse_cpu_features("model name\t: Test CPU\nflags\t\t: " + flags + "\n");
  m.cores = cores, m.openblas = openblas;
  return m;
}
const Machine kAvx512Bf16 = machine("avx2 avx512f avx512_bf16", 2, true);
const Machine kAvx2 = machine("avx2 fma", 8, true);

Config config(const std::vector<std::string>& sets) {
  Config cfg;
  for (const auto& s : sets) apply_override(cfg, s);
  validate_and_resolve(cfg);
  return cfg;
}

std::string config_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

TEST(ComputePlan, DecidesEachSettingByItsRule) {
  // Defaults on an AVX-512 CPU with OpenBLAS: fp32 on oneDNN, every core to OpenBLAS.
  ComputePlan p = plan_compute(config({}), kAvx512Bf16, {});
  EXPECT_EQ(p.precision, Precision::fp32);
  EXPECT_EQ(p.matmul, MatmulBackend::onednn);
  EXPECT_EQ(p.matmul_reason, "run.matmul: auto, AVX-512 CPU");
  EXPECT_EQ(p.threads, 2);
  EXPECT_EQ(p.blas_threads, 2);
  EXPECT_EQ(p.torch_threads, 1);
  EXPECT_EQ(p.shards, 1);  // not training
  EXPECT_EQ(p.expert_parallel, 1);

  // auto is oneDNN on an AVX2 CPU, OpenBLAS on an older one; a named library is taken as named.
  p = plan_compute(config({}), kAvx2, {});
  EXPECT_EQ(p.matmul, MatmulBackend::onednn);
  EXPECT_EQ(p.matmul_reason, "run.matmul: auto, AVX2 CPU");
  p = plan_compute(config({}), machine("sse4_2 avx", 2, true), {});
  EXPECT_EQ(p.matmul, MatmulBackend::openblas);
  EXPECT_EQ(p.matmul_reason, "run.matmul: auto, no AVX2");
  p = plan_compute(config({"run.matmul=openblas"}), kAvx512Bf16, {});
  EXPECT_EQ(p.matmul, MatmulBackend::openblas);
  EXPECT_EQ(p.matmul_reason, "run.matmul: openblas");

  // Threads: run.threads, else the cores shared by the ranks on the machine; with a BLAS
  // other than OpenBLAS torch takes them.
  EXPECT_EQ(plan_compute(config({}), kAvx2, {false, 1, 4, 4}).threads, 2);
  EXPECT_EQ(plan_compute(config({"run.threads=3"}), kAvx2, {false, 1, 4, 4}).threads, 3);
  p = plan_compute(config({}), machine("avx2", 4, false), {});
  EXPECT_EQ(p.blas_threads, 0);
  EXPECT_EQ(p.torch_threads, 4);

  // Shards: training only, one per thread up to the rows, none with dropout or capacity.
  EXPECT_EQ(plan_compute(config({}), kAvx2, {true, 16, 1, 1}).shards, 8);
  EXPECT_EQ(plan_compute(config({}), kAvx2, {true, 3, 1, 1}).shards, 3);
  EXPECT_EQ(plan_compute(config({"model.dropout=0.1"}), kAvx2, {true, 16, 1, 1}).shards, 1);
  EXPECT_EQ(plan_compute(config({"model.use_moe=true", "model.capacity_factor=1.25"}), kAvx2,
                         {true, 16, 1, 1})
                .shards,
            1);

  // Expert parallelism: the key for training a MoE model; a program that loads the run's
  // checkpoint (one process) holds the whole model.
  const Config ep = config({"model.use_moe=true", "run.expert_parallel=2"});
  EXPECT_EQ(plan_compute(ep, kAvx2, {true, 4, 4, 2}).expert_parallel, 2);
  EXPECT_EQ(plan_compute(ep, kAvx2, {}).expert_parallel, 1);
}

TEST(ComputePlan, RefusesWhatThisMachineOrJobCannotRunNamingTheKey) {
  // bf16 without bf16 instructions: refused unless emulation is asked for.
  const std::string bf16 =
      config_error([] { plan_compute(config({"run.precision=bf16"}), kAvx2, {}); });
  EXPECT_NE(bf16.find("run.precision is bf16"), std::string::npos) << bf16;
  EXPECT_NE(bf16.find("Test CPU"), std::string::npos) << bf16;
  EXPECT_EQ(
      plan_compute(config({"run.precision=bf16", "run.bf16_emulation=true"}), kAvx2, {}).precision,
      Precision::bf16);
  EXPECT_EQ(plan_compute(config({"run.precision=bf16"}), kAvx512Bf16, {}).precision,
            Precision::bf16);
  // Expert groups must divide the job.
  const std::string ep = config_error([] {
    plan_compute(config({"model.use_moe=true", "run.expert_parallel=2"}), kAvx2, {true, 4, 3, 3});
  });
  EXPECT_NE(ep.find("run.expert_parallel = 2 does not divide the job's 3 ranks"), std::string::npos)
      << ep;
}

TEST(ComputePlan, DescribesItselfAndSurvivesItsJson) {
  ComputePlan p = plan_compute(config({"run.precision=bf16", "model.use_moe=true"}), kAvx512Bf16,
                               {true, 8, 1, 1});
  const std::string line = p.describe();
  for (const char* part :
       {"compute plan: matrix products in bf16 on oneDNN",
        "the router's in fp32 on oneDNN, run.matmul: auto, AVX-512 CPU",
        "2 threads (OpenBLAS 2, torch 1)", "each micro-batch in 2 shards side by side",
        "CPU Test CPU (avx2 avx512f avx512_bf16)"})
    EXPECT_NE(line.find(part), std::string::npos) << part << " in " << line;

  const ComputePlan back = ComputePlan::from_json(p.to_json());
  EXPECT_EQ(back.to_json(), p.to_json());
  EXPECT_TRUE(back.differences(p).empty());
  ComputePlan other = with_matmul(p, MatmulBackend::openblas, "rank 0's");
  other.threads = 1;
  const std::vector<std::string> d = other.differences(p);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0], "run.matmul: onednn -> openblas");
  EXPECT_EQ(d[1], "threads: 2 -> 1");

  nlohmann::json broken = p.to_json();
  EXPECT_EQ(broken["precision"], "bf16");  // closed choices by their names
  EXPECT_EQ(broken["matmul"], "onednn");
  broken["matmul"] = "auto";  // a plan holds a resolved library
  EXPECT_THROW(ComputePlan::from_json(broken), DataError);
  broken["matmul"] = "mkl";
  EXPECT_THROW(ComputePlan::from_json(broken), DataError);
  broken["matmul"] = "onednn";
  broken["threads"] = "2";
  try {
    ComputePlan::from_json(broken);
    ADD_FAILURE() << "a mistyped field was read";
  } catch (const DataError& e) {
    EXPECT_NE(e.message().find("'threads'"), std::string::npos) << e.message();
  }
  broken.erase("threads");
  EXPECT_THROW(ComputePlan::from_json(broken), DataError);
  // A plan written before run.bf16_emulation existed: read as without it.
  nlohmann::json older = p.to_json();
  older.erase("bf16_emulation");
  EXPECT_FALSE(ComputePlan::from_json(older).bf16_emulation);
}

// The scope sets both thread counts, and restores the previous ones when it ends, nested or
// left by an exception. (The products are the model's: ComputePlan::products.)
TEST(ComputeScope, AppliesAPlanAndRestoresWhatWasThere) {
  const ComputeScope outer(test::test_plan(Precision::fp32, MatmulBackend::openblas, 1));
  ASSERT_EQ(blas_threads(), 1) << "OpenBLAS is the BLAS (Blas.OptimisedBlasIsLoaded)";
  {
    ComputePlan p = test::test_plan(Precision::bf16, MatmulBackend::onednn, 2);
    p.torch_threads = 2;
    const ComputeScope inner(p);
    EXPECT_EQ(blas_threads(), 2);
    EXPECT_EQ(torch::get_num_threads(), 2);
  }
  EXPECT_EQ(blas_threads(), 1);
  EXPECT_EQ(torch::get_num_threads(), 1);
  try {
    ComputePlan p = test::test_plan(Precision::bf16, MatmulBackend::onednn, 2);
    p.torch_threads = 2;
    const ComputeScope failing(p);
    throw std::runtime_error("left by an exception");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(blas_threads(), 1);
  EXPECT_EQ(torch::get_num_threads(), 1);
}

}  // namespace
}  // namespace minimind
