#include "minimind/run/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "minimind/model/weights_io.h"
#include "minimind/run/optimizer_state.h"
#include "minimind/util/atomic_file.h"
#include "minimind/util/input_file.h"
#include "minimind/util/output_path.h"
#include "minimind/util/zip_check.h"

namespace fs = std::filesystem;

namespace minimind {
namespace {

const char* kFiles[] = {"model.pth", "optimizer.pt", "rng.pt", "state.json"};

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::vector<std::pair<int64_t, fs::path>> complete_checkpoints(const std::string& run_dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  const fs::path root = fs::path(run_dir) / "checkpoints";
  if (!fs::exists(root)) return out;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind("step_", 0) != 0) continue;
    try {
      out.emplace_back(std::stoll(name.substr(5)), entry.path());
    } catch (const std::exception&) {
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

RunLock RunLock::acquire(const std::string& run_dir) {
  const std::string path = (fs::path(run_dir) / ".lock").string();
  RunLock lock;
  lock.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock.fd_ < 0)
    throw TrainError("cannot create the run's lock file '" + path + "': " + std::strerror(errno));
  if (::flock(lock.fd_, LOCK_EX | LOCK_NB) != 0) {
    char buf[32] = {};
    const ssize_t n = ::pread(lock.fd_, buf, sizeof(buf) - 1, 0);
    const std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "unknown";
    throw TrainError("'" + run_dir + "' is in use by another minimind-train (PID " + pid + ")",
                     "wait for it to finish, stop it with `kill -INT " + pid +
                         "` (it saves a checkpoint first), or use --out DIR for another "
                         "directory");
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(lock.fd_, 0) != 0 || ::pwrite(lock.fd_, pid.data(), pid.size(), 0) < 0)
    throw TrainError("cannot write the run's lock file '" + path + "': " + std::strerror(errno));
  return lock;
}

RunLock& RunLock::operator=(RunLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

namespace {

// The marker of a run directory, written when the trainer first takes the directory.
constexpr const char* kRunMarker = ".minimind-run";

// What the trainer and the evaluation tools write in a run directory: --overwrite removes
// these (and their temporaries, NAME.tmp.PID.N) and nothing else.
bool written_by_a_run(const std::string& name) {
  static const char* kEntries[] = {".lock",         kRunMarker,        "config.yaml",
                                   "train.log",     "metrics.jsonl",   "expert_load.jsonl",
                                   "events.jsonl",  "tokenizer.model", "tokenizer.json",
                                   "checkpoints",   "tensorboard",     "analysis.json",
                                   "analysis.html", "report.html"};
  for (const char* e : kEntries) {
    const std::string entry(e);
    if (name == entry || name.rfind(entry + ".tmp.", 0) == 0) return true;
  }
  return false;
}

// A run directory carries the marker; one made before the marker existed, the lock file
// that every run writes first, with config.yaml or with nothing that runs do not write.
bool is_run_directory(const fs::path& dir, const std::vector<std::string>& names) {
  if (fs::exists(dir / kRunMarker)) return true;
  if (!fs::exists(dir / ".lock")) return false;
  return fs::exists(dir / "config.yaml") ||
         std::all_of(names.begin(), names.end(), written_by_a_run);
}

std::string some_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 4; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 4) out += fmt::format(" and {} more", names.size() - 4);
  return out;
}

}  // namespace

RunDirectory open_run_directory(const std::string& path, bool resume, bool overwrite,
                                Distributed& dist, const std::vector<std::string>& inputs) {
  RunDirectory run{path, std::nullopt, {}};
  if (dist.is_main()) {
    if (resume && !fs::is_directory(path))
      throw TrainError("--resume: '" + path + "' does not exist",
                       "run without --resume to start training");
    if (fs::exists(path) && !fs::is_directory(path))
      throw TrainError("the run directory '" + path + "' is " + path_kind(path),
                       "give --out a new or empty directory");
    // Never a directory of someone else's files: refused before anything is written in it.
    std::vector<std::string> names;  // what it holds now
    if (fs::exists(path))
      for (const auto& e : fs::directory_iterator(path))
        names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    if (!names.empty() && !is_run_directory(path, names))
      throw TrainError("'" + path + "' is not a run directory: it holds " + some_names(names) +
                           ", which minimind-train did not write",
                       "give --out a new or empty directory (nothing was changed)");
    if (overwrite && !resume && !names.empty())
      check_replaceable_directory(path, "the run directory", inputs);
    fs::create_directories(path);
    run.lock = RunLock::acquire(path);  // before anything in it is read or changed
    if (!fs::exists(fs::path(path) / kRunMarker))
      write_file_atomic((fs::path(path) / kRunMarker).string(),
                        "minimind-train run directory: --overwrite may empty it\n");
    std::vector<fs::path> entries;  // of the run, besides the lock and the marker
    for (const auto& e : fs::directory_iterator(path)) {
      const std::string name = e.path().filename().string();
      if (name != ".lock" && name != kRunMarker) entries.push_back(e.path());
    }
    if (resume) {
      const fs::path root = fs::path(path) / "checkpoints";
      if (fs::exists(root))
        for (const auto& e : fs::directory_iterator(root))
          if (e.path().filename().string().rfind(".tmp-", 0) == 0) fs::remove_all(e.path());
      run.checkpoint = latest_checkpoint(path);
      if (!run.checkpoint)
        throw TrainError("--resume: no complete checkpoint in '" + path + "'" +
                             (entries.empty() ? "" : " (the run stopped before its first one)"),
                         entries.empty() ? "run without --resume to start training"
                                         : "start it again: the same command with --overwrite "
                                           "instead of --resume");
    } else if (!entries.empty()) {
      if (!overwrite) {
        const auto checkpoint = latest_checkpoint(path);
        if (checkpoint)
          throw TrainError("'" + path + "' already holds a run",
                           "continue it with --resume (from " +
                               fs::path(*checkpoint).filename().string() +
                               "), start it again with --overwrite, or give --out DIR for a "
                               "new directory");
        throw TrainError("'" + path + "' already holds a run, stopped before its first checkpoint",
                         "start it again with --overwrite, or give --out DIR for a new directory");
      }
      std::vector<std::string> kept;
      for (const auto& e : entries) {
        const std::string name = e.filename().string();
        if (written_by_a_run(name))
          fs::remove_all(e);
        else
          kept.push_back(name);
      }
      std::sort(kept.begin(), kept.end());
      if (!kept.empty())
        spdlog::warn("--overwrite: '{}' also holds {}, not written by a run: left as it is", path,
                     some_names(kept));
    }
  }
  dist.barrier();
  if (!dist.is_main() && resume) {
    run.checkpoint = latest_checkpoint(path);
    if (!run.checkpoint)
      throw TrainError(
          "--resume: rank " + std::to_string(dist.rank()) + " sees no checkpoint in '" + path + "'",
          "the run directory must be shared with rank 0");
  }
  return run;
}

std::string save_checkpoint(const std::string& run_dir, const MiniMindForCausalLM& model,
                            torch::optim::AdamW& optimizer, const TrainState& state, int64_t keep,
                            const std::function<void(const std::string&)>& after_file,
                            const ParallelContext& parallel) {
  std::optional<WholeModel> whole;
  if (!model->expert_shard().whole()) {
    ExpertParallel* ep = parallel.experts;
    TORCH_CHECK(ep, "save_checkpoint: a model holding some of the experts needs its group");
    whole = gather_whole_model(model, optimizer, *ep);  // a collective of the first group
    if (!ep->job().is_main()) return {};
  }
  const fs::path root = fs::path(run_dir) / "checkpoints";
  const fs::path final_dir = root / step_name(state.step);
  const fs::path tmp = root / (".tmp-" + step_name(state.step));
  // Each file is serialised in memory and written with write_file_atomic, which checks
  // every write and flushes it to disk: a full disk is an error here, not a torch writer
  // failing inside a destructor.
  auto write = [&](const char* name, std::string_view bytes) {
    write_file_atomic((tmp / name).string(), bytes);
    if (after_file) after_file(name);
  };
  try {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    if (whole) {
      save_weights(whole->weights, (tmp / "model.pth").string(), torch::kFloat32);
    } else {
      save_weights(model, (tmp / "model.pth").string(), torch::kFloat32);
    }
    if (after_file) after_file("model.pth");
    const std::vector<char> optimizer_bytes =
        whole ? optimizer_state_bytes(whole->optimizer) : optimizer_state_bytes(optimizer);
    write("optimizer.pt", std::string_view(optimizer_bytes.data(), optimizer_bytes.size()));
    auto gen = at::detail::getDefaultCPUGenerator();
    torch::Tensor rng;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      rng = gen.get_state();
    }
    const std::vector<char> rng_bytes = torch::pickle_save(rng);
    write("rng.pt", std::string_view(rng_bytes.data(), rng_bytes.size()));
    nlohmann::json j = {{"format_version", kCheckpointVersion},
                        {"step", state.step},
                        {"tokens", state.tokens},
                        {"loader_rows", state.loader_rows},
                        {"elapsed_seconds", state.elapsed_seconds},
                        {"config", state.config_yaml},
                        {"monitor", state.monitor}};
    if (state.init_from) j["init_from"] = *state.init_from;
    if (state.plan) j["plan"] = state.plan->to_json();
    // The other files are zip archives with a CRC per entry; this one carries its own: the
    // CRC-32 of its text without this field (nlohmann writes an object's keys sorted, so the
    // reader can write that text again).
    j["crc32"] = crc32_of(j.dump(2));
    write("state.json", j.dump(2) + "\n");
    sync_directory(tmp.string());
  } catch (const std::exception& e) {
    // Leave nothing half-written behind (it would hold the space a retry needs).
    std::error_code ec;
    fs::remove_all(tmp, ec);
    const fs::space_info space = fs::space(run_dir, ec);
    const int64_t params = count_parameters(model).total;
    // Weights plus AdamW's two moments, in float32.
    const double need_mb = 3.0 * 4.0 * static_cast<double>(params) / 1e6;
    throw CheckpointError(
        fmt::format("cannot write checkpoint {}: {} ({:.1f} MB free on that file system; a "
                    "checkpoint of this model needs about {:.1f} MB)",
                    final_dir.string(), e.what(), ec ? -1.0 : space.available / 1e6, need_mb),
        "free some space (or lower train.keep_checkpoints), then continue with --resume from "
        "the last checkpoint");
  }

  fs::remove_all(final_dir);  // a re-run step (after resume) replaces its old checkpoint
  fs::rename(tmp, final_dir);
  sync_directory(root.string());

  auto all = complete_checkpoints(run_dir);
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) fs::remove_all(all[i].second);
  return final_dir.string();
}

bool is_run_directory(const std::string& dir) {
  std::error_code ec;
  return fs::is_directory(fs::path(dir) / "checkpoints", ec);
}

std::string run_of_checkpoint(const std::string& checkpoint_dir) {
  fs::path p = fs::absolute(checkpoint_dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // a trailing '/'
  if (p.parent_path().filename() != "checkpoints") return "";
  // The path as given, when it was relative, stays relative in messages.
  fs::path given = fs::path(checkpoint_dir).lexically_normal();
  if (!given.has_filename()) given = given.parent_path();
  const fs::path run = given.parent_path().parent_path();
  return run.empty() ? p.parent_path().parent_path().string() : run.string();
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& run_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  for (const auto& [step, path] : complete_checkpoints(run_dir)) {
    bool complete = true;
    for (const char* f : kFiles) complete = complete && fs::exists(path / f);
    if (complete) out.emplace_back(step, path.string());
  }
  return out;
}

std::optional<std::string> latest_checkpoint(const std::string& run_dir) {
  auto all = complete_checkpoints(run_dir);
  if (all.empty()) return std::nullopt;
  return all.back().second.string();
}

TrainState read_checkpoint_state(const std::string& dir) {
  for (const char* f : kFiles) {
    if (!fs::exists(fs::path(dir) / f))
      throw CheckpointError("checkpoint '" + dir + "' is incomplete (no " + f + ")",
                            "delete it to resume from the one before");
  }
  const std::string file = (fs::path(dir) / "state.json").string();
  const std::string text = open_input<CheckpointError>(file, "checkpoint state").read_all();
  return parse_checkpoint_state(text, file);
}

TrainState parse_checkpoint_state(const std::string& text, const std::string& file) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    throw CheckpointError("checkpoint state '" + file + "' is not a JSON object",
                          "delete this checkpoint to resume from the one before");
  // Checkpoints written before the field existed have none.
  if (const auto crc = j.find("crc32"); crc != j.end()) {
    nlohmann::json body = j;
    body.erase("crc32");
    if (!crc->is_number_unsigned() || crc->get<uint64_t>() != crc32_of(body.dump(2)))
      throw CheckpointError("checkpoint state '" + file +
                                "' is damaged: its CRC-32 does not match its text (the bytes "
                                "on disk changed)",
                            "delete this checkpoint to resume from the one before");
  }
  const auto v = j.find("format_version");
  const int64_t version = v != j.end() && v->is_number_integer() ? v->get<int64_t>() : int64_t{-1};
  if (version != 1 && version != kCheckpointVersion)
    throw CheckpointError("checkpoint state '" + file + "' has format version " +
                          std::to_string(version) + "; this program reads versions 1 to " +
                          std::to_string(kCheckpointVersion) +
                          " (hint: its model.pth still loads with minimind-eval loss or generate)");
  TrainState s;
  s.format_version = static_cast<int>(version);
  auto field = [&](const char* key, auto& out, bool (nlohmann::json::*is_type)() const noexcept,
                   const char* type) {
    const auto it = j.find(key);
    if (it == j.end() || !((*it).*is_type)())
      throw CheckpointError(
          "checkpoint state '" + file + "': field '" + key + "' is " +
              (it == j.end() ? std::string("missing") : "not " + std::string(type)),
          "the file was changed by hand; delete this checkpoint to resume from the one before");
    out = it->get<std::decay_t<decltype(out)>>();
  };
  field("step", s.step, &nlohmann::json::is_number_integer, "an integer");
  field("tokens", s.tokens, &nlohmann::json::is_number_integer, "an integer");
  if (j.contains("loader_rows")) {
    field("loader_rows", s.loader_rows, &nlohmann::json::is_number_integer, "an integer");
  } else {  // written before positions were stored in rows
    s.loader_rows = -1;
    field("loader_position", s.loader_batches, &nlohmann::json::is_number_integer, "an integer");
  }
  field("elapsed_seconds", s.elapsed_seconds, &nlohmann::json::is_number, "a number");
  field("config", s.config_yaml, &nlohmann::json::is_string, "a string");
  if (const auto m = j.find("monitor"); m != j.end() && m->is_object()) s.monitor = *m;
  if (const auto i = j.find("init_from"); i != j.end() && !i->is_null()) {
    try {
      s.init_from = i->get<StartFrom>();
    } catch (const DataError& e) {
      throw CheckpointError("checkpoint state '" + file + "': init_from: " + e.message(),
                            "the file was changed by hand; restore it");
    }
  }
  if (const auto m = j.find("matmul"); m != j.end() && m->is_string()) {
    MatmulBackend library{};
    if (parse_choice(m->get<std::string>(), library) && library != MatmulBackend::automatic)
      s.matmul_before_plan = library;
  }
  if (const auto p = j.find("plan"); p != j.end()) {
    try {
      s.plan = ComputePlan::from_json(*p);
    } catch (const DataError& e) {
      throw CheckpointError("checkpoint state '" + file + "': plan: " + e.message(),
                            "the file was changed by hand; delete this checkpoint to resume "
                            "from the one before");
    }
  }
  if (s.step < 0 || s.tokens < 0 || s.loader_rows < -1 || !(s.elapsed_seconds >= 0))
    throw CheckpointError("checkpoint state '" + file + "' holds a negative count",
                          "the file was changed by hand; delete this checkpoint to resume from "
                          "the one before");
  return s;
}

void restore_rng_state(const std::string& file) {
  const c10::IValue rng = read_pickle(file);
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  try {
    if (!rng.isTensor()) throw std::runtime_error("it does not hold a tensor");
    gen.set_state(rng.toTensor());
  } catch (const std::exception& e) {
    throw CheckpointError(
        "'" + file + "' is not a random-generator state: " + first_line(e.what(), 200),
        "the checkpoint is damaged; delete it to resume from the one before");
  }
}

TrainState load_checkpoint(const std::string& dir, MiniMindForCausalLM& model,
                           torch::optim::AdamW& optimizer) {
  TrainState s = read_checkpoint_state(dir);
  load_weights(model, (fs::path(dir) / "model.pth").string());
  std::vector<int64_t> whole_index;
  int64_t whole_count = 0;
  if (!model->expert_shard().whole()) whole_index = whole_parameter_index(model, &whole_count);
  load_optimizer_state(optimizer, (fs::path(dir) / "optimizer.pt").string(), s.format_version,
                       whole_index, whole_count);
  restore_rng_state((fs::path(dir) / "rng.pt").string());
  return s;
}

}  // namespace minimind
