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

namespace minimind {

std::string render_report(const RunLogs& logs);

// One value of a load record (unset: the record does not have it).
using LoadValue = std::function<std::optional<double>(const LoadRecord&)>;
// A curve of one layer's records, averaged over windows of ~1% of the run (records without
// the value are left out).
Series load_series(const std::vector<LoadRecord>& points, const LoadValue& value,
                   const std::string& name, const std::string& color);

// Renders the report of run_dir into run_dir/report.html (atomically); returns its path.
std::string write_report(const std::string& run_dir);

// Writes the report when a training run ends (rank 0); minimind-train adds it to the
// trainer's observers.
class ReportWriter : public Observer {
 public:
  void on_start(const RunStart& s) override { start_ = s; }
  void on_end(const TrainResult&) override {
    if (start_.main_rank) start_.log->info("report {}", write_report(start_.run_dir));
  }

 private:
  RunStart start_;
};

}  // namespace minimind
