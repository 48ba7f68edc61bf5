#include "minimind/run/run_log.h"

#include <fmt/format.h>

#include <filesystem>
#include <iterator>
#include <limits>

#include "minimind/error.h"
#include "minimind/util/input_file.h"

namespace minimind {
namespace {

using json = nlohmann::json;

// ---- Writing: each field as it is; an unset optional as null.
struct FieldWriter {
  json& j;
  void operator()(const char* key, Tag tag) { j[key] = tag.value; }
  template <class T>
  void operator()(const char* key, const std::optional<T>& v) {
    j[key] = v ? json(*v) : json();
  }
  template <class T>
  void operator()(const char* key, const T& v) {
    j[key] = v;
  }
};

// ---- Reading: every field checked for presence and type; errors name the field.
[[noreturn]] void bad_field(const std::string& name, const json& v, const char* expected) {
  throw DataError(fmt::format("field '{}' should be {}, found {}", name, expected,
                              v.is_null() ? "null" : v.type_name()));
}

void read_value(const std::string& name, const json& v, int64_t& out) {
  if (!v.is_number_integer()) bad_field(name, v, "an integer");
  out = v.get<int64_t>();
}
void read_value(const std::string& name, const json& v, double& out) {
  // JSON has no NaN or infinity: a non-finite figure (a diverged evaluation) is written as
  // null, and read back as NaN.
  if (v.is_null()) {
    out = std::numeric_limits<double>::quiet_NaN();
    return;
  }
  if (!v.is_number()) bad_field(name, v, "a number");
  out = v.get<double>();
}
void read_value(const std::string& name, const json& v, bool& out) {
  if (!v.is_boolean()) bad_field(name, v, "true or false");
  out = v.get<bool>();
}
void read_value(const std::string& name, const json& v, std::string& out) {
  if (!v.is_string()) bad_field(name, v, "a string");
  out = v.get<std::string>();
}
// A nested record (EvalSummary's expert_load).
void read_value(const std::string& name, const json& v, LoadRecord& out) {
  try {
    from_json(v, out);
  } catch (const DataError& e) {
    throw DataError(name + ": " + e.message());
  }
}
template <class T>
void read_value(const std::string& name, const json& v, std::vector<T>& out) {
  if (!v.is_array()) bad_field(name, v, "an array");
  out.assign(v.size(), T{});
  for (size_t i = 0; i < v.size(); ++i) read_value(fmt::format("{}[{}]", name, i), v[i], out[i]);
}

struct FieldReader {
  const json& j;
  const json& at(const char* key) const {
    auto it = j.find(key);
    if (it == j.end()) throw DataError(fmt::format("field '{}' is missing", key));
    return *it;
  }
  void operator()(const char* key, Tag tag) const {
    const json& v = at(key);
    if (!v.is_string() || v.get<std::string>() != tag.value)
      throw DataError(
          fmt::format("field '{}' is {} where \"{}\" was expected", key, v.dump(), tag.value));
  }
  template <class T>
  void operator()(const char* key, std::optional<T>& out) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
      out.reset();
      return;
    }
    T v{};
    read_value(key, *it, v);
    out = std::move(v);
  }
  template <class T>
  void operator()(const char* key, T& out) const {
    read_value(key, at(key), out);
  }
};

template <class R>
json write_record(const R& r) {
  json j = json::object();
  R::fields(r, FieldWriter{j});
  return j;
}

template <class R>
void read_record(const json& j, R& r) {
  if (!j.is_object())
    throw DataError(fmt::format("expected a JSON object, found {}", j.type_name()));
  R::fields(r, FieldReader{j});
}

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
