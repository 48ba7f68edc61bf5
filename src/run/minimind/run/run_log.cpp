#include "minimind/run/run_log.h"

#include <fmt/format.h>

#include <filesystem>
#include <iterator>
#include <limits>

#include "minimind/error.h"
#include "minimind/util/input_file.h"
#include "minimind/util/json_fields.h"

namespace minimind {
namespace {

using json = nlohmann::json;

// The longest line a run log may hold: a record of 1,024 layers of 512 experts is ~20 MiB.
constexpr size_t kMaxLogLine = size_t{64} << 20;

// Calls f(record_json) for each line of a JSONL file, naming file and line in any error f
// throws. A missing file has no lines; an unfinished last line (a run still writing) is
// left out.

template <class F>
void for_each_line(const std::string& path, F f) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return;
  InputFile in = open_input<DataError>(path, "run log", "a JSONL file");
  LineReader lines(in);
  std::string text;
  bool cut = false;
  while (lines.next(text, kMaxLogLine, cut)) {
    const int64_t line = lines.line_number();
    const bool unfinished = !lines.ended();
    if (cut)
      throw DataError(fmt::format("{}:{}: a line over {} MiB, which no run writes", path, line,
                                  kMaxLogLine >> 20),
                      "the file was changed by hand or by another program; restore it, or "
                      "delete the line");
    const std::string_view body(text);
    if (body.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() && unfinished) return;
    try {
      if (j.is_discarded()) throw DataError("not valid JSON");
      f(j);
    } catch (const DataError& e) {
      throw DataError(fmt::format("{}:{}: {}", path, line, e.message()),
                      "the file was changed by hand or by another program; restore it, or "
                      "delete the line");
    }
  }
}

}  // namespace

#define MINIMIND_DEFINE_JSON(Record)         \
  void to_json(json& j, const Record& r) {   \
    j = write_record(r);                     \
  }                                          \
  void from_json(const json& j, Record& r) { \
    read_record(j, r);                       \
  }
MINIMIND_RUN_LOG_RECORDS(MINIMIND_DEFINE_JSON)
#undef MINIMIND_DEFINE_JSON

LoadRecord LoadRecord::make(int64_t step, int64_t layer, std::string split, const RoutingMetrics& m,
                            std::optional<double> aux_unscaled) {
  LoadRecord r;
  r.step = step, r.layer = layer, r.split = std::move(split);
  r.counts = m.counts, r.share = m.share;
  r.max_vio = m.max_vio, r.cv = m.cv, r.entropy = m.entropy;
  r.effective_experts = m.effective_experts, r.max_share = m.max_share;
  r.max_expert = m.max_expert;
  r.dead = static_cast<int64_t>(m.dead.size()), r.dead_experts = m.dead;
  r.aux_unscaled = aux_unscaled;
  return r;
}

void LoadRecord::set_router(const RouterInfo& r) {
  if (r.tokens <= 0) return;
  token_entropy = r.token_entropy, marginal_entropy = r.marginal_entropy;
  mi = r.mi, confidence = r.confidence;
}

RunLogWriter::RunLogWriter(const std::string& run_dir, int64_t keep_until_step) {
  if (run_dir.empty()) return;
  const std::filesystem::path dir(run_dir);
  open(metrics_, (dir / "metrics.jsonl").string(), keep_until_step);
  open(loads_, (dir / "expert_load.jsonl").string(), keep_until_step);
  open(events_, (dir / "events.jsonl").string(), keep_until_step);
}

void RunLogWriter::open(std::ofstream& out, const std::string& path, int64_t keep_until_step) {
  std::vector<std::string> kept;
  if (keep_until_step >= 0) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object()) continue;  // a line cut short by a crash
      const auto step = j.find("step");
      if (step != j.end() && step->is_number_integer() && step->get<int64_t>() <= keep_until_step)
        kept.push_back(line);
    }
  }
  out.open(path, std::ios::trunc);
  if (!out) throw DataError("cannot write '" + path + "'");
  for (const auto& line : kept) out << line << "\n";
  out.flush();
}

void RunLogWriter::append(std::ofstream& out, const json& j) {
  if (!out.is_open()) return;
  out << j.dump() << "\n";
  out.flush();
}

int64_t RunLogs::last_step() const {
  int64_t s = train.empty() ? 0 : train.back().step;
  for (const auto& [layer, records] : train_load)
    if (!records.empty()) s = std::max(s, records.back().step);
  return s;
}

RunLogs read_run_logs(const std::string& run_dir) {
  namespace fs = std::filesystem;
  if (!fs::exists(fs::path(run_dir) / "metrics.jsonl"))
    throw DataError("'" + run_dir + "' has no metrics.jsonl: not a minimind-train run directory");
  RunLogs r;
  r.run_dir = run_dir;
  for_each_line(run_dir + "/metrics.jsonl", [&](const json& j) {
    const auto split = j.find("split");
    if (split == j.end()) throw DataError("field 'split' is missing");
    if (*split == "train") {
      r.train.push_back(j.get<TrainRecord>());
    } else if (*split == "eval") {
      r.eval.push_back(j.get<EvalRecord>());
    } else {
      throw DataError("field 'split' is " + split->dump() + "; expected \"train\" or \"eval\"");
    }
  });
  for_each_line(run_dir + "/expert_load.jsonl", [&](const json& j) {
    LoadRecord rec = j.get<LoadRecord>();
    if (rec.split != "train" && rec.split != "eval")
      throw DataError("field 'split' is \"" + rec.split + "\"; expected \"train\" or \"eval\"");
    auto& by_layer = rec.split == "train" ? r.train_load : r.eval_load;
    by_layer[rec.layer].push_back(std::move(rec));
  });
  for_each_line(run_dir + "/events.jsonl", [&](const json& j) {
    const auto event = j.find("event");
    if (event == j.end()) throw DataError("field 'event' is missing");
    // Kinds of event this version does not know are left for the tools that do.
    if (*event == "collapse") r.collapses.push_back(j.get<CollapseRecord>());
    if (*event == "uninformative") r.uninformative.push_back(j.get<UninformativeRecord>());
    if (*event == "init_from") r.init = j.get<InitRecord>();
    if (*event == "flops") r.flops = j.get<FlopsRecord>();
  });
  return r;
}

std::vector<int64_t> recent_counts(const std::vector<LoadRecord>& records, size_t steps) {
  std::vector<int64_t> sum;
  for (size_t i = records.size() > steps ? records.size() - steps : 0; i < records.size(); ++i)
    add_counts(sum, records[i].counts);
  return sum;
}

}  // namespace minimind
