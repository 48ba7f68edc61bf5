// The typed run log: every record written and read back field for field, a run directory
// written before the records existed still reads with its values, and a missing or
// mistyped field is an error naming file, line and field.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "minimind/error.h"
#include "minimind/run/run_log.h"
#include "support/test_support.h"

using namespace minimind;
using namespace minimind::test;
namespace fs = std::filesystem;

namespace {

// A copy of the old-format fixture that a test may damage.
std::string old_run_copy(const std::string& name) {
  const std::string dir = temp_dir(name);
  for (const char* f : {"metrics.jsonl", "expert_load.jsonl", "events.jsonl"})
    fs::copy_file(source_path("tests/data/run_format_v1/") + f, dir + "/" + f);
  return dir;
}

std::string read_error(const std::string& dir) {
  return error_of<DataError>([&] { read_run_logs(dir); });
}

}  // namespace

TEST(RunLog, RecordsRoundTripThroughTheirJsonForm) {
  TrainRecord t;
  t.step = 7, t.tokens = 700, t.loss = 1.25, t.lm_loss = 1.0, t.aux_loss = 0.25, t.lr = 1e-3;
  t.grad_norm = 0.5, t.tok_per_s = 1234.5, t.elapsed = 9.75, t.allreduce_ms = 3.5;
  const nlohmann::json tj = t;
  EXPECT_EQ(tj["split"], "train");
  const TrainRecord t2 = tj.get<TrainRecord>();
  EXPECT_EQ(nlohmann::json(t2), tj);
  EXPECT_EQ(*t2.allreduce_ms, 3.5);

  const LoadRecord l = LoadRecord::make(3, 1, "train", routing_metrics({6, 2, 0, 0}), 1.5);
  const nlohmann::json lj = l;
  EXPECT_EQ(lj["dead"], 2);
  EXPECT_EQ(lj["dead_experts"], nlohmann::json({2, 3}));
  EXPECT_EQ(lj["max_share"], 0.75);
  EXPECT_EQ(nlohmann::json(lj.get<LoadRecord>()), lj);
  // An unset optional is written as null and read back unset.
  const nlohmann::json no_aux = LoadRecord::make(3, 1, "eval", routing_metrics({1, 1}));
  EXPECT_TRUE(no_aux["aux_unscaled"].is_null());
  EXPECT_FALSE(no_aux.get<LoadRecord>().aux_unscaled.has_value());

  CollapseRecord c;
  c.step = 4, c.since_step = 2, c.layer = 3, c.expert = 1, c.max_share = 0.99, c.dead_experts = {0};
  c.message = "m";
  const nlohmann::json cj = c;
  EXPECT_EQ(cj["event"], "collapse");
  EXPECT_EQ(nlohmann::json(cj.get<CollapseRecord>()), cj);

  EvalSummary s{2.0, 7.389, 100, 3, 0.5, 200, "w.pth", {l}, 120, 4, false};
  const nlohmann::json sj = s;
  EXPECT_EQ(nlohmann::json(sj.get<EvalSummary>()), sj);
}

TEST(RunLog, RunDirectoriesOfTheFirstFormatStillRead) {
  // Written by minimind-train before the typed records (configs/moe.yaml, 6 steps, log
  // interval 2, evaluation every 3 steps, collapse thresholds at 0 so that events exist).
  const RunLogs r = read_run_logs(source_path("tests/data/run_format_v1"));
  ASSERT_EQ(r.train.size(), 3u);
  EXPECT_EQ(r.train[0].step, 2);
  EXPECT_EQ(r.train[0].tokens, 8224);
  EXPECT_EQ(r.train[0].loss, 8.723315387498587);
  EXPECT_EQ(r.train[0].lm_loss, 8.721176624298096);
  EXPECT_EQ(r.train[0].lr, 0.002);
  EXPECT_FALSE(r.train[0].allreduce_ms.has_value());  // a one-process run never wrote it
  ASSERT_EQ(r.eval.size(), 3u);                       // steps 0, 3, 6
  EXPECT_EQ(r.eval[1].step, 3);
  EXPECT_EQ(r.eval[1].val_loss, 8.193831065407737);
  ASSERT_EQ(r.train_load.size(), 4u);
  EXPECT_EQ(r.train_load.at(0).size(), 6u);
  EXPECT_EQ(r.train_load.at(0)[0].counts, (std::vector<int64_t>{2157, 442, 571, 942}));
  EXPECT_EQ(*r.train_load.at(0)[0].aux_unscaled, 1.0629456955939531);
  EXPECT_EQ(r.eval_load.at(3).size(), 3u);
  EXPECT_FALSE(r.eval_load.at(3)[0].aux_unscaled.has_value());  // written as null
  ASSERT_EQ(r.collapses.size(), 4u);
  EXPECT_EQ(r.collapses[3].layer, 3);
  EXPECT_EQ(r.collapses[3].expert, 2);
  EXPECT_EQ(r.collapses[3].since_step, 2);
  EXPECT_EQ(r.last_step(), 6);
}

TEST(RunLog, MissingOrMistypedFieldsNameFileLineAndField) {
  const std::string dir = old_run_copy("runlog_bad");
  std::string metrics = read_text(dir + "/metrics.jsonl");
  // Line 2 is the first train record: rename its lm_loss.
  const size_t at = metrics.find("\"lm_loss\"");
  write_text(dir + "/metrics.jsonl", metrics.substr(0, at) + "\"lm_los\"" + metrics.substr(at + 9));
  std::string msg = read_error(dir);
  EXPECT_NE(msg.find(dir + "/metrics.jsonl:2: field 'lm_loss' is missing"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("hint:"), std::string::npos) << msg;

  write_text(dir + "/metrics.jsonl", metrics);
  std::string loads = read_text(dir + "/expert_load.jsonl");
  const size_t counts = loads.find("\"counts\":[", loads.find('\n') + 1);  // line 2
  write_text(dir + "/expert_load.jsonl", loads.substr(0, counts) + "\"counts\":\"many\"," +
                                             loads.substr(loads.find(']', counts) + 2));
  msg = read_error(dir);
  EXPECT_NE(msg.find("expert_load.jsonl:2: field 'counts' should be an array, found string"),
            std::string::npos)
      << msg;

  write_text(dir + "/expert_load.jsonl", loads);
  write_text(dir + "/events.jsonl",
             read_text(dir + "/events.jsonl") + "{\"event\":\"collapse\",\"step\":1.5}\n");
  msg = read_error(dir);
  EXPECT_NE(msg.find("events.jsonl:5: field 'step' should be an integer, found number"),
            std::string::npos)
      << msg;
}

// A diverged evaluation logs NaN, which JSON writes as null: the tool's own readers take it
// back as NaN instead of refusing the run's logs.
TEST(RunLog, ANullFigureWrittenForNaNReadsBackAsNaN) {
  EvalRecord r;
  r.step = 3, r.val_loss = std::nan(""), r.val_ppl = INFINITY;
  const std::string line = nlohmann::json(r).dump();
  EXPECT_NE(line.find("\"val_loss\":null"), std::string::npos) << line;
  const std::string dir = old_run_copy("runlog_null");
  write_text(dir + "/metrics.jsonl", read_text(dir + "/metrics.jsonl") + line + "\n");
  const RunLogs logs = read_run_logs(dir);
  ASSERT_FALSE(logs.eval.empty());
  EXPECT_EQ(logs.eval.back().step, 3);
  EXPECT_TRUE(std::isnan(logs.eval.back().val_loss));
  EXPECT_TRUE(std::isnan(logs.eval.back().val_ppl));
}

TEST(RunLog, AnUnfinishedLastLineIsLeftOutButBrokenLinesElsewhereAreErrors) {
  const std::string dir = old_run_copy("runlog_partial");
  const std::string metrics = read_text(dir + "/metrics.jsonl");
  // A run still writing: the last line has no newline yet.
  write_text(dir + "/metrics.jsonl", metrics + "{\"split\":\"train\",\"step\":8,\"los");
  EXPECT_EQ(read_run_logs(dir).train.size(), 3u);
  // The same damage in the middle of the file is an error.
  write_text(dir + "/metrics.jsonl", "{\"split\":\"train\",\"step\":8,\"los\n" + metrics);
  EXPECT_NE(read_error(dir).find("metrics.jsonl:1: not valid JSON"), std::string::npos);
  write_text(dir + "/metrics.jsonl", "{\"split\":\"test\"}\n");
  EXPECT_NE(read_error(dir).find("metrics.jsonl:1: field 'split' is \"test\""), std::string::npos);
  EXPECT_NE(read_error(temp_dir("runlog_none")).find("no metrics.jsonl"), std::string::npos);
}

TEST(RunLog, WriterKeepsTheLinesUpToTheResumedStep) {
  const std::string dir = old_run_copy("runlog_resume");
  { RunLogWriter resumed(dir, 3); }  // resuming from a checkpoint at step 3
  const RunLogs r = read_run_logs(dir);
  ASSERT_EQ(r.train.size(), 1u);  // step 2 kept, 4 and 6 dropped
  EXPECT_EQ(r.eval.size(), 2u);   // steps 0 and 3
  EXPECT_EQ(r.train_load.at(0).size(), 3u);
  EXPECT_TRUE(r.collapses.empty());  // fired at step 4
  { RunLogWriter fresh(dir, -1); }
  EXPECT_TRUE(read_run_logs(dir).eval.empty());
}

TEST(Errors, MessageAndHint) {
  const TrainError e("'runs/x' already holds a run", "use --resume");
  EXPECT_STREQ(e.what(), "'runs/x' already holds a run\nhint: use --resume");
  EXPECT_EQ(e.message(), "'runs/x' already holds a run");
  EXPECT_EQ(e.hint(), "use --resume");
  EXPECT_STREQ(DataError("no hint").what(), "no hint");
  // Every kind is an Error, so a main needs one catch.
  EXPECT_EQ(run_main([]() -> int { throw ConfigError("bad key"); }), 1);
  EXPECT_EQ(run_main([]() -> int { throw std::runtime_error("not ours"); }), 1);
  EXPECT_EQ(run_main([] { return 3; }), 3);
}
