// Helpers shared by the test programs: temporary directories, a small corpus cut from the
// shipped one, the tiny MoE config most trainer and eval tests run, and reading logs.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "minimind/compute_plan.h"
#include "minimind/config.h"

namespace minimind::test {

// A fresh, empty directory for one test. Per process: CTest runs each test of a program in
// a process of its own, in parallel.
inline std::string temp_dir(const std::string& name) {
  const std::filesystem::path p = std::filesystem::path(testing::TempDir()) /
                                  ("minimind_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

inline std::string source_path(const std::string& relative) {
  return std::string(MINIMIND_SOURCE_DIR) + "/" + relative;
}

// The first `records` lines of the shipped corpus, written to dir/corpus.jsonl (once).
inline std::string small_corpus(const std::string& dir, int records = 300) {
  const std::string path = dir + "/corpus.jsonl";
  if (!std::filesystem::exists(path)) {
    std::ifstream in(source_path("data/austen.jsonl"));
    std::ofstream out(path);
    std::string line;
    for (int i = 0; i < records && std::getline(in, line); ++i) out << line << "\n";
  }
  return path;
}

// The compute plan a test runs under (apply it with a ComputeScope): the plan the programs
// build on this machine for products in `precision` on `matmul` and `threads` cores
// (OpenBLAS's, torch one). bf16 is allowed on a CPU without bf16 instructions (emulated).
inline ComputePlan test_plan(Precision precision, MatmulBackend matmul, int threads = 1) {
  Config c;
  c.run.precision = precision, c.run.matmul = matmul, c.run.threads = threads;
  c.run.bf16_emulation = true;
  return plan_compute(c, this_machine(), {});
}

// A test case's compute: test_plan applied (its threads) while it lives, and its products,
// which the case builds its model and calls the product functions with.
struct PlanScope {
  PlanScope(Precision precision, MatmulBackend matmul, int threads = 1)
      : plan(test_plan(precision, matmul, threads)), scope(plan) {}
  Products products() const { return plan.products(); }

  const ComputePlan plan;
  const ComputeScope scope;
};

// A tiny MoE (hidden 32, 2 layers, 4 experts top-2, vocab 512) on small_corpus(dir): a run
// of 8 steps takes about a second. `extra` are --set style overrides applied before
// validation; data and cache live in dir.
inline Config tiny_config(const std::string& dir, const std::vector<std::string>& extra = {}) {
  Config cfg = load_config_string(
      "run: {name: tiny, seed: 5, threads: 1}\n"
      "model: {hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 2,\n"
      "        num_key_value_heads: 1, vocab_size: 512, max_position_embeddings: 128,\n"
      "        use_moe: true, num_experts: 4, num_experts_per_tok: 2}\n"
      "data: {max_seq_len: 32, val_fraction: 0.05}\n"
      "train: {batch_size: 4, accumulation_steps: 2, max_steps: 8, learning_rate: 3.0e-3,\n"
      "        eval_interval: 4, checkpoint_interval: 3, keep_checkpoints: 2}\n"
      "log: {interval: 2}\n",
      "tiny.yaml");
  apply_override(cfg, "data.train=" + small_corpus(dir));
  apply_override(cfg, "data.cache_dir=" + dir + "/cache");
  for (const auto& o : extra) apply_override(cfg, o);
  validate_and_resolve(cfg);
  return cfg;
}

inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// The message of the exception `f` throws as type E; fails the test if it throws none.
template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception thrown";
  return "";
}

// A shell command's exit status, stdout and stderr.
struct Command {
  int status;
  std::string out, err;
};
inline Command run_command(const std::string& cmd) {
  const std::string err_file = testing::TempDir() + "cmd_err_" + std::to_string(::getpid());
  Command c{0, "", ""};
  FILE* p = popen((cmd + " 2>" + err_file).c_str(), "r");
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) c.out.append(buf, n);
  c.status = WEXITSTATUS(pclose(p));
  c.err = read_text(err_file);
  return c;
}

// A tmpfs of `size` (e.g. "8m") mounted on dir for the object's life: a disk that fills
// up. Needs root; callers skip the test otherwise.
struct TmpfsMount {
  std::string dir;
  TmpfsMount(std::string d, const std::string& size) : dir(std::move(d)) {
    std::filesystem::create_directories(dir);
    mounted = std::system(("mount -t tmpfs -o size=" + size + " tmpfs " + dir).c_str()) == 0;
  }
  ~TmpfsMount() {
    if (mounted) (void)!std::system(("umount -l " + dir).c_str());
  }
  bool mounted = false;
};

}  // namespace minimind::test
