// compare.html: several runs side by side (the balancing study, or any runs): validation
// and training loss overlaid, MaxVio and routing entropy per layer per run, and a table of
// final figures. Self-contained like report.html.
#pragma once

#include <string>
#include <vector>

#include "minimind/run/run_log.h"

namespace minimind {

// The final figures of one run, as the table shows them.
struct RunSummary {
  std::string name;  // the run directory's name
  int64_t steps = 0;
  std::optional<double> val_loss, val_ppl;  // the last evaluation
  std::vector<double> max_vio_global;       // per layer: MaxVio of the last evaluation's counts
  std::vector<int64_t> dead;                // per layer: experts the last evaluation never chose
  std::vector<std::optional<double>> mi;    // per layer: the last evaluation's routing information
  std::optional<double> dropped;            // capacity: fraction dropped in the last interval
  double tok_per_s = 0;                     // training tokens per second over the run
  // The training behind the last evaluation, that of the weights it started from included
  // (train.init_from): tokens and FLOPs (flops.h; unset for runs logged before FLOPs were).
  int64_t tokens = 0;
  std::optional<double> flops;
};
// The training that made a run's starting weights (0 for a run from random weights).
struct Upstream {
  int64_t tokens = 0;
  double flops = 0;
};
Upstream upstream_of(const RunLogs& logs);
RunSummary summarize_run(const RunLogs& logs);

// How the page names each run: its directory's name where that is distinct, else the
// shortest suffix of its path that no other run shares ("a/run", "b/run").
std::vector<std::string> run_labels(const std::vector<std::string>& run_dirs);

// Throws DataError when fewer than two runs are given.
std::string render_compare(const std::vector<RunLogs>& runs);

// Reads each run directory's logs and writes the page to out_path (atomically).
void write_compare(const std::vector<std::string>& run_dirs, const std::string& out_path);

}  // namespace minimind
