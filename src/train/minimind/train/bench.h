// What minimind-bench measures, as a library: the bench config, the model-FLOP count its MFU
// divides, and the variant runner behind --variant (scripts/bench-balancing.sh).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "minimind/compute_plan.h"
#include "minimind/config.h"
#include "minimind/flops.h"

namespace minimind {

// The fixed bench config (hidden 256, 4 layers, 8 heads, 2 kv heads, vocab 6400, seq 256,
// batch 8, fp32) as `preset` shapes it (dense | moe-top1 | moe-top2 | moe-e16k4 |
// moe-e64k16), with --set style overrides, validated; warnings go to spdlog.
Config bench_config(const std::string& preset, const std::vector<std::string>& sets);
constexpr int64_t kBenchBatch = 8, kBenchSeq = 256;

double median(std::vector<double> v);

// Several configs trained in one process, one step of each in turn, so that the machine's
// speed drifting (a shared VM moves by tens of percent over seconds) hits every variant
// alike. specs: "NAME:section.key=value,..." applied to `base`, which runs first as "default".
// Each variant computes by its own plan (plan_for its config; run.precision and run.matmul
// may differ between variants), applied around each of its steps.
struct VariantSpeed {
  std::string name;
  ComputePlan plan;
  double step_seconds = 0;  // median
  double tok_s = 0, gflops = 0;
};
std::vector<VariantSpeed> compare_variants(
    const Config& base, const std::vector<std::string>& specs, int steps, int warmup,
    const std::function<ComputePlan(const Config&)>& plan_for);

}  // namespace minimind
