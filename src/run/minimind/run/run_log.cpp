#include "minimind/run/run_log.h"

#include <filesystem>
#include <sstream>
#include <vector>

namespace minimind {

JsonlWriter::JsonlWriter(const std::string& path, int64_t keep_until_step) {
  if (path.empty()) return;
  std::vector<std::string> kept;
  if (keep_until_step >= 0 && std::filesystem::exists(path)) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded()) continue;  // a line cut short by a crash
      if (j.value("step", int64_t{0}) <= keep_until_step) kept.push_back(line);
    }
  }
  out_.open(path, std::ios::trunc);
  for (const auto& line : kept) out_ << line << "\n";
  out_.flush();
}

void JsonlWriter::write(const nlohmann::json& record) {
  if (!out_.is_open()) return;
  out_ << record.dump() << "\n";
  out_.flush();
}

nlohmann::json expert_load_record(int64_t step, int64_t layer, const std::string& split,
                                  const RoutingMetrics& m, double aux_unscaled) {
  nlohmann::json j = {{"step", step},
                      {"layer", layer},
                      {"split", split},
                      {"counts", m.counts},
                      {"share", m.share},
                      {"max_vio", m.max_vio},
                      {"cv", m.cv},
                      {"entropy", m.entropy},
                      {"effective_experts", m.effective_experts},
                      {"max_share", m.max_share},
                      {"max_expert", m.max_expert},
                      {"dead", m.dead.size()},
                      {"dead_experts", m.dead}};
  j["aux_unscaled"] = aux_unscaled < 0 ? nlohmann::json() : nlohmann::json(aux_unscaled);
  return j;
}

}  // namespace minimind
