// minimind-train: trains a MiniMind model (dense or MoE) from a YAML config.
// All logic is in the library (minimind/train/trainer.h); this parses the command line,
// sets up what belongs to the process (logger, signal handlers), and calls train().
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <ctime>
#include <iostream>
#include <limits>
#include <thread>

#include "command_line.h"
#include "minimind/compute_plan.h"
#include "minimind/config.h"
#include "minimind/data/prepare.h"
#include "minimind/dist/distributed.h"
#include "minimind/error.h"
#include "minimind/train/report_writer.h"
#include "minimind/train/trainer.h"
#include "minimind/util/blas_check.h"
#include "minimind/util/stop_flag.h"

namespace {

minimind::StopFlag g_stop;
std::atomic<int64_t> g_first_signal_ms{0};

int64_t monotonic_ms() {  // clock_gettime is async-signal-safe
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// The first SIGINT/SIGTERM asks the run to stop after the current step (with a checkpoint);
// another one a second or more later ends the process at once. Signals within that second
// count as the same request: a Ctrl-C in a terminal reaches each rank of
// scripts/launch-local.sh both directly and forwarded by the script.
extern "C" void on_stop_signal(int sig) {
  if (g_stop.signal() != 0) {
    if (monotonic_ms() - g_first_signal_ms.load() < 1000) return;
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_first_signal_ms.store(monotonic_ms());
  g_stop.request(sig);
  const char msg[] =
      "\nstopping after this step with a checkpoint, or now if preparing data (send the signal "
      "again to quit at once)\n";
  (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
}

// The handler runs on a thread of its own, never on a thread in the middle of a matrix
// product: with the signals blocked here, every thread started from now on (shards, product
// tasks) inherits the block, and one idle thread takes them. A SIGINT handled on the main
// thread while it was inside oneDNN's fp32 GEMM corrupted the heap in about one run of ten
// (tests/e2e_kill_resume.sh); handled on a thread of its own, in none of 30.
void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::thread([stop_signals] {
    pthread_sigmask(SIG_UNBLOCK, &stop_signals, nullptr);
    for (;;) pause();
  }).detach();
}

}  // namespace

int main(int argc, char** argv) {
  minimind::use_kernels_fitting_the_cpu(argv);  // may re-execute: before anything else
  CLI::App app{"minimind-train: train a MiniMind language model (dense or MoE) from a YAML config"};
  std::string config_path;
  std::vector<std::string> overrides;
  minimind::TrainOptions options;
  int64_t threads = -1, seed = -1;
  bool prepare_only = false, print_config = false;
  bool list_presets = false;
  app.add_option("--config", config_path,
                 "YAML config file, or a shipped preset by name (moe, dense, ...)");
  app.add_flag("--list-presets", list_presets, "list the shipped presets and where they are");
  app.add_option("--set", overrides,
                 "override a key before validation: section.key=value (repeatable)");
  app.add_option("--out", options.out_dir, "run directory (default: runs/<run.name>)");
  app.add_flag("--resume", options.resume,
               "continue from the newest complete checkpoint in the run directory");
  app.add_flag("--overwrite", options.overwrite,
               "start again in a run directory that holds an earlier run");
  app.add_option("--threads", threads,
                 "intra-op threads (same as --set run.threads=N; 0 = one per core)")
      ->check(minimind_app::integer_in(0, minimind::kMaxThreads));
  app.add_option("--seed", seed, "random seed (same as --set run.seed=N)")
      ->check(minimind_app::integer_in(0, std::numeric_limits<int64_t>::max()));
  app.add_flag("--prepare-only", prepare_only,
               "prepare tokenizer and token files (cached), then exit");
  app.add_flag("--print-config", print_config, "print the resolved config as YAML and exit");
  if (const int status = minimind_app::parse_command_line(app, argc, argv); status >= 0)
    return status;
  if (list_presets) {
    for (const auto& [name, path] : minimind::list_presets()) fmt::print("{:16} {}\n", name, path);
    return 0;
  }
  if (config_path.empty()) {
    std::cerr << "--config is required (a YAML file or a preset: minimind-train --list-presets)\n"
              << "Run with --help for more information.\n";
    return 1;
  }
  if (threads >= 0) overrides.push_back("run.threads=" + std::to_string(threads));
  if (seed >= 0) overrides.push_back("run.seed=" + std::to_string(seed));
  minimind_app::use_console_logger("minimind");  // stdout: data only

  return minimind::run_main([&] {
    minimind::LoadedConfig loaded =
        minimind::load_config(minimind::find_config_file(config_path), overrides);
    for (const auto& w : loaded.warnings) spdlog::warn("{}", w);
    const minimind::Config& cfg = loaded.config;
    if (print_config) {
      fmt::print("{}", minimind::config_to_yaml(cfg));
      return 0;
    }
    if (prepare_only) {
      minimind::check_data_paths(cfg);
      install_stop_handlers();
      const minimind::ComputePlan plan = minimind::plan_compute(cfg, minimind::this_machine(), {});
      const minimind::ComputeScope compute(plan);
      minimind::prepare_data(cfg.data, cfg.model.vocab_size, plan.threads,
                             *spdlog::default_logger(), &g_stop);
      return 0;
    }
    // torchrun's variables (RANK, WORLD_SIZE, ...) make this one rank of a job.
    const minimind::DistEnv env = minimind::dist_env_from_environment();
    std::unique_ptr<minimind::Distributed> dist;
    if (env.world_size > 1) {
      spdlog::info("rank {} of {} (local {} of {}): joining {}:{}", env.rank, env.world_size,
                   env.local_rank, env.local_world_size, env.master_addr, env.master_port);
      dist =
          std::make_unique<minimind::Distributed>(env, std::chrono::seconds(cfg.run.dist_timeout));
    }
    install_stop_handlers();
    minimind::ReportWriter report(cfg.log.report_interval);
    options.stop = &g_stop;
    options.dist = dist.get();
    options.observers.push_back(&report);
    const minimind::TrainResult r = minimind::train(cfg, options);
    return r.interrupted ? 128 + r.signal : 0;  // 130 for Ctrl-C, 143 for SIGTERM
  });
}
