// The run directory's machine-readable logs: metrics.jsonl, expert_load.jsonl and
// events.jsonl, one JSON object per line, appended as the run goes.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <string>

#include "minimind/run/routing_metrics.h"

namespace minimind {

class JsonlWriter {
 public:
  // On resume, lines with "step" > keep_until_step are dropped first (they were logged
  // after the checkpoint the run continues from). keep_until_step < 0: start empty.
  // An empty path writes nothing (ranks other than 0 of a multi-process run).
  JsonlWriter(const std::string& path, int64_t keep_until_step);
  void write(const nlohmann::json& record);  // one line, flushed

 private:
  std::ofstream out_;
};

// The expert_load.jsonl record of one layer: counts and every metric of
// docs/moe-routing.md. aux_unscaled < 0 is written as null (no aux loss computed).
nlohmann::json expert_load_record(int64_t step, int64_t layer, const std::string& split,
                                  const RoutingMetrics& m, double aux_unscaled);

}  // namespace minimind
