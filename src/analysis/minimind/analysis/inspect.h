// `minimind-eval --inspect RUN_DIR`: the expert-load story of a run in the terminal.
#pragma once

#include <string>
#include <vector>

#include "minimind/run/run_log.h"

namespace minimind {

// A sparkline of `values` squeezed into at most `width` characters (bucket means),
// scaled between the series' min and max.
std::string sparkline(const std::vector<double>& values, size_t width);

// Loss curves, then per MoE layer: the current load histogram (last 10 steps), how MaxVio,
// entropy and max share moved over the run, and the collapse warnings with their steps.
std::string inspect_text(const RunLogs& logs, size_t width = 48);

}  // namespace minimind
