#include "minimind/run/run_logs.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "minimind/error.h"

namespace minimind {
namespace {

template <typename F>
void for_each_line(const std::string& path, F f) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object()) f(j);
  }
}

}  // namespace

int64_t RunLogs::last_step() const {
  int64_t s = 0;
  if (!train.empty()) s = train.back().step;
  for (const auto& [l, pts] : train_load)
    if (!pts.empty()) s = std::max(s, pts.back().step);
  return s;
}

RunLogs read_run_logs(const std::string& run_dir) {
  namespace fs = std::filesystem;
  if (!fs::exists(fs::path(run_dir) / "metrics.jsonl"))
    throw DataError("'" + run_dir + "' has no metrics.jsonl: not a minimind-train run directory");
  RunLogs r;
  r.run_dir = run_dir;
  for_each_line(run_dir + "/metrics.jsonl", [&](const nlohmann::json& j) {
    if (j.value("split", "") == "eval") {
      r.eval.push_back({j.value("step", int64_t{0}), j.value("val_loss", 0.0)});
    } else {
      r.train.push_back({j.value("step", int64_t{0}), j.value("loss", 0.0), j.value("lm_loss", 0.0),
                         j.value("aux_loss", 0.0), j.value("lr", 0.0), j.value("grad_norm", 0.0),
                         j.value("tok_per_s", 0.0)});
    }
  });
  for_each_line(run_dir + "/expert_load.jsonl", [&](const nlohmann::json& j) {
    LoadPoint p;
    p.step = j.value("step", int64_t{0});
    p.counts = j.value("counts", std::vector<int64_t>{});
    p.max_vio = j.value("max_vio", 0.0);
    p.entropy = j.value("entropy", 0.0);
    p.max_share = j.value("max_share", 0.0);
    p.dead = j.value("dead", int64_t{0});
    auto& dst = j.value("split", "") == "eval" ? r.eval_load : r.train_load;
    dst[j.value("layer", int64_t{0})].push_back(std::move(p));
  });
  for_each_line(run_dir + "/events.jsonl", [&](const nlohmann::json& j) {
    if (j.value("event", "") == "collapse")
      r.collapses.push_back({j.value("step", int64_t{0}), j.value("layer", int64_t{0}),
                             j.value("message", std::string())});
  });
  return r;
}

std::vector<int64_t> recent_counts(const std::vector<LoadPoint>& points, size_t steps) {
  std::vector<int64_t> sum;
  for (size_t i = points.size() > steps ? points.size() - steps : 0; i < points.size(); ++i) {
    sum.resize(points[i].counts.size(), 0);
    for (size_t e = 0; e < points[i].counts.size(); ++e) sum[e] += points[i].counts[e];
  }
  return sum;
}

}  // namespace minimind
