// The programs as a whole: stdout carries only data, minimind-bench's --breakdown, the
// malloc the programs run on, and the OpenBLAS kernels they pick for the CPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "minimind/util/allocator.h"
#include "support/test_support.h"

using namespace minimind;
namespace fs = std::filesystem;

// stdout carries data only: a config printed with its warnings (the #858 one here) reads
// back as a config, and the benchmark's --json line is the whole of stdout.
TEST(Commands, StdoutCarriesOnlyData) {
  const std::string dir = test::temp_dir("stdout");
  const std::string train = std::string(MINIMIND_TRAIN_BIN) + " --print-config --config ";
  ASSERT_EQ(std::system((train + test::source_path("configs/minimind-3-moe.yaml") + " > " + dir +
                         "/a.yaml 2> " + dir + "/a.err")
                            .c_str()),
            0);
  EXPECT_NE(test::read_text(dir + "/a.err").find("858"), std::string::npos)
      << "the preset should warn (#858); the test needs a warning to check where it goes";
  ASSERT_EQ(std::system((train + dir + "/a.yaml > " + dir + "/b.yaml").c_str()), 0);
  EXPECT_EQ(test::read_text(dir + "/a.yaml"), test::read_text(dir + "/b.yaml"));

  ASSERT_EQ(std::system((std::string(MINIMIND_BENCH_BIN) +
                         " --json --preset dense --steps 1 --warmup 0 --profile " + dir +
                         "/trace.json > " + dir + "/bench.json 2>/dev/null")
                            .c_str()),
            0);
  const std::string out = test::read_text(dir + "/bench.json");
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_EQ(nlohmann::json::parse(out).at("preset"), "dense") << out;
  // The trace is JSON whose first event marks it as --profile's, so a second --profile
  // replaces it (and only it).
  const nlohmann::json trace = nlohmann::json::parse(test::read_text(dir + "/trace.json"));
  ASSERT_TRUE(trace.is_array() && trace.size() > 1) << trace.dump().substr(0, 200);
  EXPECT_EQ(trace[0].at("args").at("name"), "minimind-bench --profile") << trace[0];
  ASSERT_EQ(std::system((std::string(MINIMIND_BENCH_BIN) +
                         " --preset dense --steps 1 --warmup 0 --profile " + dir +
                         "/trace.json > /dev/null 2>&1")
                            .c_str()),
            0);
  EXPECT_EQ(nlohmann::json::parse(test::read_text(dir + "/trace.json"))[0], trace[0]);
}

// --breakdown's products alone: with oneDNN running the fp32 products, every product of
// the profiled step is timed again (each has its two backward products: the three rows'
// FLOPs agree) and the MFU it allows is printed; fp32 on OpenBLAS has none to time.
TEST(Commands, BreakdownTimesTheProductsAlone) {
  const std::string dir = test::temp_dir("alone");
  auto bench = [&](const std::string& library) {
    const std::string cmd =
        std::string(MINIMIND_BENCH_BIN) +
        " --json --preset moe-top1 --precision fp32 --set run.matmul=" + library +
        " --steps 1 --warmup 0 --breakdown 1 > " + dir + "/b.json 2>/dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return nlohmann::json::parse(test::read_text(dir + "/b.json"));
  };
  const nlohmann::json onednn = bench("onednn");
  ASSERT_TRUE(onednn.contains("products_alone")) << onednn.dump();
  const nlohmann::json& rows = onednn["products_alone"]["rows"];
  ASSERT_GE(rows.size(), 4u);
  EXPECT_EQ(rows[0]["name"], "forward");
  EXPECT_EQ(rows[3]["name"], "attention's (in its row)");
  const double forward = rows[0]["gflop"];
  EXPECT_GT(forward, 0);
  EXPECT_NEAR(rows[1]["gflop"].get<double>(), forward, 1e-9 * forward);
  EXPECT_NEAR(rows[2]["gflop"].get<double>(), forward, 1e-9 * forward);
  for (int r = 0; r < 3; ++r) {
    EXPECT_GT(rows[r]["alone_ms"].get<double>(), 0) << r;
    EXPECT_TRUE(rows[r]["step_ms"].is_number()) << r;
  }
  // The families hold every product: their lone times add up to the rows'; the step's
  // kernel times are positive, and the largest loss comes first.
  const nlohmann::json& families = onednn["products_alone"]["families"];
  ASSERT_GE(families.size(), 4u);
  double alone = 0;
  for (const auto& f : families) {
    alone += f["alone_ms"].get<double>();
    EXPECT_GT(f["step_ms"].get<double>(), 0) << f.dump();
    EXPECT_GT(f["per_step"].get<double>(), 0) << f.dump();
    EXPECT_LE(f["lost_ms"].get<double>(), families[0]["lost_ms"].get<double>()) << f.dump();
  }
  const double rows_alone = onednn["products_alone"]["alone_ms"];
  EXPECT_NEAR(alone, rows_alone, 1e-9 * rows_alone);
  EXPECT_GT(onednn["mfu_ceiling"].get<double>(), onednn["mfu"].get<double>());
  EXPECT_GT(onednn["mfu_at_lone_speed"].get<double>(), 0);
  EXPECT_FALSE(bench("openblas").contains("products_alone"));
}

// The programs link tcmalloc; this test program does not, so it sees glibc's malloc, which
// shows that allocator_name() tells the two apart (unless tcmalloc is preloaded here too).
TEST(Allocator, ProgramsRunOnTcmalloc) {
  const char* preload = std::getenv("LD_PRELOAD");
  if (preload == nullptr || std::string(preload).find("tcmalloc") == std::string::npos) {
    EXPECT_STREQ(minimind::allocator_name(), "glibc malloc");
  }
  const std::string dir = test::temp_dir("allocator");
  const std::string cmd = std::string(MINIMIND_BENCH_BIN) +
                          " --json --preset dense --steps 1 --warmup 0 > " + dir +
                          "/b.json 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EXPECT_EQ(nlohmann::json::parse(test::read_text(dir + "/b.json")).at("allocator"), "tcmalloc");
}

// OpenBLAS 0.3.21 falls back to its SSE3 kernels on CPUs it does not know (this project's
// VM on 2026-12-01); the tools then restart themselves with OPENBLAS_CORETYPE set
// (blas_check.h). A user's OPENBLAS_CORETYPE is kept.
TEST(BlasKernels, ToolsRunKernelsFittingTheCpuAndKeepAUsersChoice) {
  const std::string dir = test::temp_dir("kernels");
  auto core_of = [&](const std::string& env) {
    const std::string cmd = "env -u OPENBLAS_CORETYPE " + env + " " + MINIMIND_BENCH_BIN +
                            " --json --preset dense --steps 1 --warmup 0 > " + dir +
                            "/b.json 2>/dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return nlohmann::json::parse(test::read_text(dir + "/b.json"))
        .at("blas_core")
        .get<std::string>();
  };
  EXPECT_EQ(core_of("OPENBLAS_CORETYPE=Prescott"), "Prescott");
  const std::string own = core_of("");
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    for (const char* pre_avx : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom"}) {
      EXPECT_NE(own, pre_avx) << "pre-AVX OpenBLAS kernels on a CPU with AVX2";
    }
  }
}
