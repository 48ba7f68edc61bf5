// report.html: one self-contained page (inline SVG, no scripts, no network) showing a run:
// per MoE layer a heatmap of expert share over steps, MaxVio and entropy curves, train and
// validation loss, learning rate, and collapse events marked. Dense runs: the loss part.
#pragma once

#include <string>

#include "minimind/run/run_logs.h"

namespace minimind {

std::string render_report(const RunLogs& logs);

// Renders the report of run_dir into run_dir/report.html (atomically); returns its path.
std::string write_report(const std::string& run_dir);

}  // namespace minimind
