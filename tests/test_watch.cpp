// Watching a run while it trains: report.html rewritten during training (atomically, with
// a refresh while running, none at the end, a failed write only a warning) and TensorBoard
// event files read back by an independent decoder (tests/reference/check_tfevents.py:
// classes protoc builds from TensorBoard's field numbers).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "minimind/analysis/report.h"
#include "minimind/run/run_log.h"
#include "minimind/run/tensorboard.h"
#include "minimind/train/report_writer.h"
#include "minimind/train/trainer.h"
#include "support/test_support.h"

namespace fs = std::filesystem;
using namespace minimind;

// The masked CRC-32C of TFRecord: CRC-32C's published check value, and TensorFlow's mask.
TEST(TensorBoard, Crc32cIsCastagnolis) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  const uint32_t c = crc32c("123456789");
  EXPECT_EQ(masked_crc32c("123456789"), ((c >> 15) | (c << 17)) + 0xA282EAD8u);
}

// A run with log.tensorboard, stopped and resumed: two event files, the second starting
// with SessionLog START at the checkpoint's step, every value equal to the run's logs.
TEST(TensorBoard, EventFilesMatchTheRunLogsAcrossAResume) {
  const std::string dir = test::temp_dir("tensorboard");
  Config cfg = test::tiny_config(
      dir, {"log.tensorboard=true", "train.max_steps=6", "train.checkpoint_interval=4",
            "train.eval_interval=3", "log.interval=2"});
  TrainOptions options;
  options.out_dir = dir + "/run";
  options.after_step = [](int64_t step, MiniMindForCausalLM&) { return step == 4; };
  train(cfg, options);
  options.after_step = nullptr;
  options.resume = true;
  apply_override(cfg, "train.max_steps=8");
  train(cfg, options);
  const test::Command check = test::run_command(
      std::string(MINIMIND_PYTHON) + " " + test::source_path("tests/reference/check_tfevents.py") +
      " " + options.out_dir + " 4");
  EXPECT_EQ(check.status, 0) << check.out << check.err;
  std::printf("%s", check.out.c_str());
  EXPECT_NE(check.out.find("2 files"), std::string::npos) << check.out;
}

// The report while training: rewritten after each evaluation with "running" and a refresh;
// the final page has neither. A page that cannot be written stops nothing.
TEST(LiveReport, RewrittenWhileTrainingAndFinalAtTheEnd) {
  const std::string dir = test::temp_dir("live_report");
  const Config cfg =
      test::tiny_config(dir, {"train.max_steps=8", "train.eval_interval=3", "log.interval=2"});
  ReportWriter report(/*interval_seconds=*/3600);  // pages after evaluations only
  TrainOptions options;
  options.out_dir = dir + "/run";
  options.observers.push_back(&report);
  std::string at_step_4;
  options.after_step = [&](int64_t step, MiniMindForCausalLM&) {
    if (step == 4) at_step_4 = test::read_text(options.out_dir + "/report.html");
    return false;
  };
  train(cfg, options);
  EXPECT_NE(at_step_4.find("<meta http-equiv=\"refresh\""), std::string::npos);
  EXPECT_NE(at_step_4.find("running: step 3 of 8, written "), std::string::npos) << at_step_4;
  const std::string final_page = test::read_text(options.out_dir + "/report.html");
  EXPECT_EQ(final_page.find("http-equiv=\"refresh\""), std::string::npos);
  EXPECT_EQ(final_page.find("running:"), std::string::npos);
  EXPECT_NE(final_page.find("— step 8"), std::string::npos);

  // report.html taken by a directory: each write fails, training completes with warnings.
  const std::string blocked = dir + "/blocked";
  ReportWriter again(3600);
  TrainOptions o2;
  o2.out_dir = blocked;
  o2.observers.push_back(&again);
  o2.after_step = [&](int64_t step, MiniMindForCausalLM&) {
    if (step == 1) {
      fs::remove(blocked + "/report.html");  // the page of the step-0 evaluation
      fs::create_directories(blocked + "/report.html/x");
    }
    return false;
  };
  const TrainResult r = train(cfg, o2);
  EXPECT_EQ(r.step, 8);
  EXPECT_FALSE(r.interrupted);
  EXPECT_NE(test::read_text(blocked + "/train.log").find("cannot write the report"),
            std::string::npos);
}
