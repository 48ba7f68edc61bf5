// report.html: one self-contained page (inline SVG, no scripts, no network) showing a run:
// per MoE layer a heatmap of expert share over steps, MaxVio and entropy curves, train and
// validation loss, learning rate, and collapse events marked. Dense runs: the loss part.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "minimind/analysis/charts.h"
#include "minimind/run/run_log.h"
#include "minimind/train/observer.h"
#include "minimind/util/stopwatch.h"

namespace minimind {

// What a page written while the run trains says about it: "running: step X of Y, written
// HH:MM", and a refresh, so that an open browser tab follows the run. The final page has
// neither.
struct ReportStatus {
  int64_t step = 0, max_steps = 0;
  std::string written_at;    // HH:MM, local time
  int refresh_seconds = 60;  // the page reloads itself this often
};

std::string render_report(const RunLogs& logs, const ReportStatus* running = nullptr);

// One value of a load record (unset: the record does not have it).
using LoadValue = std::function<std::optional<double>(const LoadRecord&)>;
// A curve of one layer's records, averaged over windows of ~1% of the run (records without
// the value are left out).
Series load_series(const std::vector<LoadRecord>& points, const LoadValue& value,
                   const std::string& name, const std::string& color);

// Renders the report of run_dir into run_dir/report.html (atomically: a reader sees the
// old page or the new one); returns its path.
std::string write_report(const std::string& run_dir, const ReportStatus* running = nullptr);

// Writes the report on rank 0: at the end of the run, and with interval_seconds > 0 (the
// run's log.report_interval) also while it trains, after every evaluation and whenever
// that many seconds have passed since the last page. A page that cannot be written (a full
// disk) is a warning; training goes on. minimind-train adds it to the trainer's observers.
class ReportWriter : public Observer {
 public:
  explicit ReportWriter(int64_t interval_seconds = 0) : interval_(interval_seconds) {}
  void on_start(const RunStart& s) override;
  void on_eval(const EvalInfo& e) override;
  void on_step_end(const StepInfo& s, bool last) override;
  void on_end(const TrainResult& r) override;

 private:
  void write(bool running);  // running: a page with the status line and a refresh
  RunStart start_;
  bool started_ = false;  // the evaluation before step 1 comes before this observer's start
  int64_t interval_;
  int64_t step_ = 0, max_steps_ = 0;
  Stopwatch since_last_;     // since the last page
  double seconds_live_ = 0;  // spent writing pages while training
  int64_t pages_ = 0;
};

}  // namespace minimind
