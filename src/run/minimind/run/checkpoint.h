// The run directory and its checkpoints: checkpoints/step_XXXXXXXX/ holding model.pth
// (MiniMind-format fp32 weights), optimizer.pt, rng.pt and state.json. Written under a
// temporary name and renamed into place, so a crash never leaves a half-written step_
// directory.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "minimind/compute_plan.h"
#include "minimind/dist/distributed.h"
#include "minimind/error.h"
#include "minimind/model/minimind_model.h"
#include "minimind/run/parallel_context.h"
#include "minimind/run/run_log.h"

namespace minimind {

// 2: optimizer.pt is a plain pickle (optimizer_state.h); 1: torch::save(optimizer), still read.
constexpr int kCheckpointVersion = 2;

// What besides weights and optimizer a run needs to continue exactly.
struct TrainState {
  int format_version = kCheckpointVersion;  // of the checkpoint it was read from
  int64_t step = 0;                         // optimizer steps done
  int64_t tokens = 0;                       // training tokens seen
  // Rows of the global data stream drawn so far (all ranks), so a run can resume under
  // another rank count or batch size. Checkpoints written before this field existed hold
  // a one-process batch count instead: then loader_rows is -1 and loader_batches is set.
  int64_t loader_rows = 0;
  int64_t loader_batches = -1;
  double elapsed_seconds = 0;  // training time so far
  std::string config_yaml;     // the resolved config of the run
  // The compute plan the run trained with (compute_plan.h; none in checkpoints written
  // before it was kept): a resumed run says what changed, and with run.matmul: auto keeps
  // its fp32 library (fp32_library), so that it continues bit for bit on a CPU where auto
  // means the other one.
  std::optional<ComputePlan> plan;
  // Checkpoints of the days between keeping the library and keeping the plan (2026-12-02/03)
  // name only the library ("matmul"); read, never written.
  std::optional<MatmulBackend> matmul_before_plan;
  // The library that ran the fp32 products: the plan's, else the older field's.
  std::optional<MatmulBackend> fp32_library() const {
    return plan ? std::optional<MatmulBackend>(plan->matmul) : matmul_before_plan;
  }
  // The monitors' state (a log interval's partial sums, collapse streaks), so that a resumed
  // run logs what an uninterrupted one would. An object keyed by monitor; null when a
  // checkpoint predates it (the monitors then start afresh).
  nlohmann::json monitor;
  // The weights the run started from (train.init_from; run_log.h); none for a run from
  // random weights.
  std::optional<StartFrom> init_from;
};

// One owner per run directory: an advisory lock (flock) on run_dir/.lock, held while the
// object lives, by the process that writes the directory (rank 0). The file holds the
// owner's PID so that a second trainer can name it. Readers (evaluation, inspection) take
// no lock.
class RunLock {
 public:
  // Throws TrainError naming the holder's PID when another process holds the lock.
  static RunLock acquire(const std::string& run_dir);
  RunLock() = default;
  RunLock(RunLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  RunLock& operator=(RunLock&& other) noexcept;
  ~RunLock();

 private:
  int fd_ = -1;
};

// A training run's directory, ready for the run: made fresh, emptied (overwrite) or found
// holding the checkpoint to resume from, and locked. Rank 0 checks and prepares it; the
// other ranks then look for rank 0's checkpoint in it (the directory must be shared).
// Throws TrainError with a hint when the directory holds a run and neither resume nor
// overwrite was asked, or when another trainer owns it. A checkpoint left half-written by a
// crash (checkpoints/.tmp-*) is removed. Only a run directory (its marker .minimind-run, or
// a run from before the marker) is ever used or emptied: a non-empty directory of other
// files is refused untouched; --overwrite removes only what runs write, and refuses the
// working directory, a directory holding it, and one holding any of `inputs` (data files).
struct RunDirectory {
  std::string path;
  std::optional<std::string> checkpoint;  // resume: the newest complete checkpoint
  RunLock lock;                           // rank 0
};
RunDirectory open_run_directory(const std::string& path, bool resume, bool overwrite,
                                Distributed& dist, const std::vector<std::string>& inputs = {});

// Writes checkpoints/step_<step>/ under run_dir and deletes all but the newest `keep`.
// `after_file` (tests) is called after each file is written, to simulate a crash. A model
// holding some of the experts (expert parallelism, `parallel.experts`): every rank of the
// first expert group calls it, the experts are gathered on the job's rank 0, which writes
// the whole model's checkpoint; the others return "".
std::string save_checkpoint(const std::string& run_dir, const MiniMindForCausalLM& model,
                            torch::optim::AdamW& optimizer, const TrainState& state, int64_t keep,
                            const std::function<void(const std::string&)>& after_file = {},
                            const ParallelContext& parallel = {});

// The run layout, known here only: RUN/checkpoints/step_N/. Whether `dir` is a run directory
// (it has checkpoints/), and the run a checkpoint directory lies in ("" when it does not lie
// in a run's checkpoints/, such as a copy of one elsewhere).
bool is_run_directory(const std::string& dir);
std::string run_of_checkpoint(const std::string& checkpoint_dir);

// Every checkpoint directory under run_dir with all its files, oldest first: (step, path).
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& run_dir);

// The newest complete checkpoint directory under run_dir, if any.
std::optional<std::string> latest_checkpoint(const std::string& run_dir);

// Reads state.json only (to check the config before building anything).
TrainState read_checkpoint_state(const std::string& checkpoint_dir);
// The same from the text of a state.json (`file` names it in errors); CheckpointError for
// anything that is not a state of this format version.
TrainState parse_checkpoint_state(const std::string& text, const std::string& file);

// Sets torch's CPU generator from a checkpoint's rng.pt; CheckpointError/WeightsError for a
// damaged file.
void restore_rng_state(const std::string& file);

// Restores weights, optimizer and torch's RNG; returns the state. Refuses incomplete or
// other-version checkpoints with a hint. A model holding some of the experts takes its own.
TrainState load_checkpoint(const std::string& checkpoint_dir, MiniMindForCausalLM& model,
                           torch::optim::AdamW& optimizer);

}  // namespace minimind
