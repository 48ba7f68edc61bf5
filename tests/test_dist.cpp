// The dist layer: the torchrun environment contract and a world of one.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "minimind/config.h"
#include "minimind/data/batcher.h"
#include "minimind/data/prepare.h"
#include "minimind/dist/distributed.h"
#include "minimind/eval/evaluate.h"
#include "minimind/model/minimind_model.h"
#include "minimind/model/weights_io.h"
#include "minimind/run/checkpoint.h"
#include "minimind/run/routing_metrics.h"
#include "minimind/run/run_log.h"
#include "minimind/train/checkpointer.h"
#include "minimind/train/collapse_watcher.h"
#include "minimind/train/console.h"
#include "minimind/train/evaluator.h"
#include "minimind/train/interval_window.h"
#include "minimind/train/lr_schedule.h"
#include "minimind/train/optim.h"
#include "minimind/train/run_log_observer.h"
#include "minimind/train/train_step.h"
#include "minimind/train/trainer.h"
#include "minimind/util/blas_check.h"
#include "minimind/util/side_by_side.h"
#include "support/test_support.h"

using namespace minimind;
using namespace minimind::test;
namespace fs = std::filesystem;

namespace {

// Sets the torchrun variables for one test and restores the environment afterwards.
class TorchrunEnv {
 public:
  explicit TorchrunEnv(std::map<std::string, std::string> vars) {
    for (const char* k : kNames) unsetenv(k);
    for (const auto& [k, v] : vars) setenv(k.c_str(), v.c_str(), 1);
  }
  ~TorchrunEnv() {
    for (const char* k : kNames) unsetenv(k);
  }

 private:
  static constexpr const char* kNames[] = {
      "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
};

std::string dist_error(std::map<std::string, std::string> vars) {
  TorchrunEnv env(std::move(vars));
  try {
    minimind::dist_env_from_environment();
  } catch (const minimind::DistError& e) {
    return e.what();
  }
  return "";
}

TEST(DistEnv, NoVariablesIsOneProcess) {
  TorchrunEnv env({});
  minimind::DistEnv d = minimind::dist_env_from_environment();
  EXPECT_EQ(d.world_size, 1);
  EXPECT_EQ(d.rank, 0);
}

TEST(DistEnv, ReadsTorchrunVariables) {
  TorchrunEnv env({{"RANK", "3"},
                   {"WORLD_SIZE", "4"},
                   {"LOCAL_RANK", "1"},
                   {"LOCAL_WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "10.0.0.7"},
                   {"MASTER_PORT", "29511"}});
  minimind::DistEnv d = minimind::dist_env_from_environment();
  EXPECT_EQ(d.rank, 3);
  EXPECT_EQ(d.world_size, 4);
  EXPECT_EQ(d.local_rank, 1);
  EXPECT_EQ(d.local_world_size, 2);
  EXPECT_EQ(d.master_addr, "10.0.0.7");
  EXPECT_EQ(d.master_port, 29511);
}

TEST(DistEnv, LocalVariablesDefaultToAllRanksOnThisMachine) {
  TorchrunEnv env(
      {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}});
  minimind::DistEnv d = minimind::dist_env_from_environment();
  EXPECT_EQ(d.local_world_size, 2);
  EXPECT_EQ(d.local_rank, 1);
}

TEST(DistEnv, MissingOrBadVariablesAreNamed) {
  EXPECT_NE(dist_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}})
                .find("MASTER_ADDR"),
            std::string::npos);
  EXPECT_NE(
      dist_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}).find("MASTER_PORT"),
      std::string::npos);
  EXPECT_NE(dist_error({{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})
                .find("RANK is not set"),
            std::string::npos);
  EXPECT_NE(
      dist_error({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})
          .find("RANK='2'"),
      std::string::npos);
  EXPECT_NE(dist_error({{"RANK", "0"}, {"WORLD_SIZE", "two"}}).find("WORLD_SIZE='two'"),
            std::string::npos);
  EXPECT_NE(
      dist_error(
          {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}})
          .find("MASTER_PORT='70000'"),
      std::string::npos);
}

TEST(Distributed, WorldOfOneLeavesTensorsAlone) {
  minimind::Distributed one;
  torch::Tensor t = torch::arange(4, torch::kFloat32);
  one.all_reduce_sum(t);
  one.all_reduce_max(t);
  EXPECT_TRUE(torch::equal(t, torch::arange(4, torch::kFloat32)));
  torch::Tensor p = torch::ones({3}, torch::requires_grad());
  p.mutable_grad() = torch::full({3}, 2.0);
  one.average_gradients({p});
  EXPECT_TRUE(torch::equal(p.grad(), torch::full({3}, 2.0)));
  EXPECT_EQ(one.comm_seconds(), 0.0);
  // Expert parallelism's collectives: a world of one keeps its rows, and checks the blocks.
  torch::Tensor rows = torch::arange(6, torch::kFloat32).view({3, 2});
  EXPECT_TRUE(torch::equal(one.all_to_all(rows, {3}, {3}), rows));
  EXPECT_THROW(one.all_to_all(rows, {2}, {3}), c10::Error);
  EXPECT_TRUE(torch::equal(one.gather_to_main(rows), rows.unsqueeze(0)));
  one.sum_gradients_divided({p}, 4.0);  // no other rank: only the division
  EXPECT_TRUE(torch::equal(p.grad(), torch::full({3}, 0.5)));
  auto group = one.subgroup("g", {0});
  EXPECT_EQ(group->world_size(), 1);
  EXPECT_EQ(group->rank(), 0);
}

}  // namespace
