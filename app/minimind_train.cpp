// minimind-train: reads a YAML config and trains a MiniMind model.
// (The trainer loop proper arrives with the trainer work; for now this prepares the data,
// builds the model from the config and runs a few optimizer steps on real batches.)
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <chrono>

#include "minimind/config.h"
#include "minimind/data/batcher.h"
#include "minimind/data/prepare.h"
#include "minimind/data/tokenizer.h"
#include "minimind/model/minimind_model.h"
#include "minimind/optim.h"
#include "minimind/util/blas_check.h"

namespace {

int run(const minimind::Config& cfg, int steps, bool prepare_only) {
  using namespace minimind;
  const int threads = cfg.run.threads > 0 ? static_cast<int>(cfg.run.threads) : torch::get_num_threads();
  PreparedData data = prepare_data(cfg.data, cfg.model.vocab_size, threads);
  if (prepare_only) return 0;

  BlasReport blas = check_blas();
  if (!blas.ok) {
    spdlog::warn("!!! matmul runs at {:.1f} GFLOP/s (BLAS: {}); expected > {:.0f}. Install an "
                 "optimised BLAS: `apt-get install libopenblas0-pthread` (scripts/install-deps.sh "
                 "does). Training will be ~20x slower.",
                 blas.gflops, blas.library, kMinSaneGflops);
  } else {
    spdlog::info("BLAS {} at {:.0f} GFLOP/s", blas.library, blas.gflops);
  }

  torch::manual_seed(cfg.run.seed);
  MiniMindForCausalLM model(cfg.model);
  init_weights(model);
  ParamCount n = count_parameters(model);
  spdlog::info("model: {} layers, hidden {}, {}: {:.3f} M parameters ({:.3f} M active)",
               cfg.model.num_hidden_layers, cfg.model.hidden_size,
               cfg.model.use_moe ? fmt::format("MoE {} experts top-{}", cfg.model.num_experts,
                                               cfg.model.num_experts_per_tok)
                                 : std::string("dense"),
               n.total / 1e6, n.active / 1e6);

  TokenFile train_tokens = TokenFile::open(data.train_path);
  BatchSampler sampler(train_tokens, cfg.data.mode, cfg.train.batch_size, cfg.data.max_seq_len,
                       static_cast<uint64_t>(cfg.run.seed));
  auto optimizer = make_optimizer(model->parameters(), cfg.train);
  spdlog::info("demo: {} optimizer steps on {} batches of {} rows", steps, cfg.data.mode,
               cfg.train.batch_size);
  model->train();
  for (int step = 1; step <= steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    Batch batch = sampler.next();
    ForwardOutput out = model(batch.input_ids, batch.labels);
    torch::Tensor loss = out.loss + out.aux_loss;
    optimizer->zero_grad();
    loss.backward();
    double norm = finish_gradients(model->parameters(), cfg.train.grad_clip);
    optimizer->step();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string load;
    for (size_t l = 0; l < out.expert_counts.size(); ++l)
      load += fmt::format(" L{}:{}", l, fmt::join(out.expert_counts[l].data_ptr<int64_t>(),
                                                  out.expert_counts[l].data_ptr<int64_t>() +
                                                      out.expert_counts[l].numel(), "/"));
    spdlog::info("step {}/{} loss {:.4f} (lm {:.4f} aux {:.5f}) grad_norm {:.3f} {:.0f} tok/s{}",
                 step, steps, loss.item<double>(), out.loss.item<double>(),
                 out.aux_loss.item<double>(), norm, batch.input_ids.numel() / secs,
                 load.empty() ? "" : " expert load" + load);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"minimind-train: train a MiniMind language model (dense or MoE) from a YAML config"};
  std::string config_path;
  std::vector<std::string> overrides;
  int threads = -1, demo_steps = 3;
  app.add_option("--config", config_path, "YAML config (sections run, model, data, train, log)")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--set", overrides, "override a key before validation: section.key=value")
      ->take_all();
  app.add_option("--threads", threads, "intra-op threads (default: run.threads, 0 = all cores)");
  app.add_option("--demo-steps", demo_steps, "forward/backward steps of the demo")->check(CLI::PositiveNumber);
  app.add_flag("--print-config", "print the resolved config as YAML and exit");
  app.add_flag("--prepare-only", "prepare tokenizer and token files (cached), then exit");
  CLI11_PARSE(app, argc, argv);

  try {
    minimind::LoadedConfig loaded = minimind::load_config(config_path, overrides);
    for (const auto& w : loaded.warnings) spdlog::warn("{}", w);
    if (app.count("--print-config")) {
      fmt::print("{}", minimind::config_to_yaml(loaded.config));
      return 0;
    }
    int64_t n_threads = threads >= 0 ? threads : loaded.config.run.threads;
    if (n_threads > 0) torch::set_num_threads(static_cast<int>(n_threads));
    return run(loaded.config, demo_steps, app.count("--prepare-only") > 0);
  } catch (const minimind::ConfigError& e) {
    spdlog::error("{}", e.what());
    return 2;
  } catch (const minimind::DataError& e) {
    spdlog::error("{}", e.what());
    return 2;
  } catch (const minimind::TokenizerError& e) {
    spdlog::error("{}", e.what());
    return 2;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
