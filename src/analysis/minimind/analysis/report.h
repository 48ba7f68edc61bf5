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

}  // namespace minimind
