#include "minimind/run/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "minimind/model/weights_io.h"
#include "minimind/util/atomic_file.h"

namespace fs = std::filesystem;

namespace minimind {
namespace {

const char* kFiles[] = {"model.pth", "optimizer.pt", "rng.pt", "state.json"};

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

// Flushes a file or directory to disk so a rename after it cannot expose missing data.
void sync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
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

RunDirectory open_run_directory(const std::string& path, bool resume, bool overwrite,
                                Distributed& dist) {
  RunDirectory run{path, std::nullopt};
  if (dist.is_main()) {
    if (resume) {
      run.checkpoint = latest_checkpoint(path);
      if (!run.checkpoint)
        throw TrainError("--resume: no complete checkpoint in '" + path + "'",
                         "run without --resume to start training");
    } else if (fs::exists(path) && !fs::is_empty(path)) {
      if (!overwrite)
        throw TrainError("'" + path + "' already holds a run",
                         "use --resume to continue it, --overwrite to start it again, or --out "
                         "DIR for a new directory");
      fs::remove_all(path);
    }
    fs::create_directories(path);
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
                            torch::optim::Optimizer& optimizer, const TrainState& state,
                            int64_t keep,
                            const std::function<void(const std::string&)>& after_file) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  const fs::path final_dir = root / step_name(state.step);
  const fs::path tmp = root / (".tmp-" + step_name(state.step));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  auto written = [&](const char* name) {
    sync_path(tmp / name);
    if (after_file) after_file(name);
  };

  save_weights(model, (tmp / "model.pth").string(), torch::kFloat32);
  written("model.pth");
  torch::save(optimizer, (tmp / "optimizer.pt").string());
  written("optimizer.pt");
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    torch::Tensor rng;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      rng = gen.get_state();
    }
    const std::vector<char> bytes = torch::pickle_save(rng);
    write_file_atomic((tmp / "rng.pt").string(), std::string_view(bytes.data(), bytes.size()));
  }
  written("rng.pt");
  nlohmann::json j = {{"format_version", kCheckpointVersion},
                      {"step", state.step},
                      {"tokens", state.tokens},
                      {"loader_rows", state.loader_rows},
                      {"elapsed_seconds", state.elapsed_seconds},
                      {"config", state.config_yaml}};
  {
    std::ofstream out(tmp / "state.json");
    out << j.dump(2) << "\n";
    if (!out.flush()) throw CheckpointError("cannot write " + (tmp / "state.json").string());
  }
  written("state.json");
  sync_path(tmp);

  fs::remove_all(final_dir);  // a re-run step (after resume) replaces its old checkpoint
  fs::rename(tmp, final_dir);
  sync_path(root);

  auto all = complete_checkpoints(run_dir);
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) fs::remove_all(all[i].second);
  return final_dir.string();
}

std::optional<std::string> latest_checkpoint(const std::string& run_dir) {
  auto all = complete_checkpoints(run_dir);
  if (all.empty()) return std::nullopt;
  return all.back().second.string();
}

TrainState read_checkpoint_state(const std::string& dir) {
  for (const char* f : kFiles) {
    if (!fs::exists(fs::path(dir) / f))
      throw CheckpointError("checkpoint '" + dir + "' is incomplete (no " + f +
                            "); delete it to resume from the one before");
  }
  nlohmann::json j;
  try {
    std::ifstream in(fs::path(dir) / "state.json");
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw CheckpointError("checkpoint '" + dir + "' has an unreadable state.json (" + e.what() +
                          "); delete it to resume from the one before");
  }
  const int version = j.value("format_version", -1);
  if (version != kCheckpointVersion)
    throw CheckpointError("checkpoint '" + dir + "' has format version " + std::to_string(version) +
                          "; this program reads version " + std::to_string(kCheckpointVersion) +
                          " (hint: its model.pth still loads with minimind-eval --checkpoint)");
  TrainState s;
  s.step = j.at("step").get<int64_t>();
  s.tokens = j.at("tokens").get<int64_t>();
  if (j.contains("loader_rows")) {
    s.loader_rows = j.at("loader_rows").get<int64_t>();
  } else {
    s.loader_rows = -1;
    s.loader_batches = j.at("loader_position").get<int64_t>();
  }
  s.elapsed_seconds = j.at("elapsed_seconds").get<double>();
  s.config_yaml = j.at("config").get<std::string>();
  return s;
}

TrainState load_checkpoint(const std::string& dir, MiniMindForCausalLM& model,
                           torch::optim::Optimizer& optimizer) {
  TrainState s = read_checkpoint_state(dir);
  load_weights(model, (fs::path(dir) / "model.pth").string());
  try {
    torch::load(optimizer, (fs::path(dir) / "optimizer.pt").string());
  } catch (const c10::Error& e) {
    throw CheckpointError("checkpoint '" + dir + "' has an unreadable optimizer.pt: " +
                          std::string(e.what_without_backtrace()).substr(0, 200));
  }
  c10::IValue rng = read_pickle((fs::path(dir) / "rng.pt").string());
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(rng.toTensor());
  return s;
}

}  // namespace minimind
