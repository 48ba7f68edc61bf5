#include "minimind/eval/eval_inputs.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <filesystem>

#include "minimind/data/jsonl.h"
#include "minimind/flops.h"
#include "minimind/model/weights_io.h"
#include "minimind/run/checkpoint.h"
#include "minimind/util/stopwatch.h"

namespace fs = std::filesystem;

namespace minimind {

WeightsSource find_weights(const std::string& path) {
  WeightsSource w;
  if (!fs::exists(path)) throw CheckpointError("checkpoint '" + path + "' does not exist");
  if (!fs::is_directory(path)) {
    w.weights = path;
    return w;
  }
  std::string ckpt;
  if (is_run_directory(path)) {  // its newest checkpoint
    auto latest = latest_checkpoint(path);
    if (!latest) throw CheckpointError("run directory '" + path + "' has no complete checkpoint");
    ckpt = *latest;
  } else if (fs::exists(fs::path(path) / "state.json") ||
             fs::exists(fs::path(path) / "model.pth")) {
    ckpt = path;
  } else {
    throw CheckpointError("'" + path +
                              "' is neither a run directory (it has no checkpoints/) nor a "
                              "checkpoint directory (no state.json, no model.pth)",
                          "give a run directory such as runs/moe, one of its "
                          "checkpoints/step_N directories, or a .pth file with --config");
  }
  TrainState state;
  try {
    state = read_checkpoint_state(ckpt);  // refuses incomplete / other versions
  } catch (const CheckpointError& e) {
    // Its hint speaks of resuming the checkpoint's own run; here it is only read.
    throw CheckpointError(e.message(),
                          "the checkpoint was not written whole or was changed: give another "
                          "checkpoint of its run (under its checkpoints/), or its model.pth "
                          "with --config naming the model");
  }
  w.step = state.step;
  w.config = load_config_string(state.config_yaml, ckpt + "/state.json");
  w.run_dir = run_of_checkpoint(ckpt);
  w.weights = (fs::path(ckpt) / "model.pth").string();
  w.trained_tokens = state.tokens;
  w.trained_flops = static_cast<double>(state.tokens) *
                    flops_per_token(w.config->model, w.config->data.max_seq_len).total();
  if (state.init_from && state.init_from->source_tokens && state.init_from->source_flops) {
    *w.trained_tokens += *state.init_from->source_tokens;
    *w.trained_flops += *state.init_from->source_flops;
  }
  return w;
}

namespace {

void apply_run_settings(Config& cfg, const std::vector<std::string>& sets) {
  for (const auto& s : sets) {
    if (s.rfind("run.", 0) != 0)
      throw ConfigError("--set " + s + ": minimind-eval takes run.* keys only",
                        "the model and its data come from the checkpoint; --set changes how it "
                        "is computed (run.precision, run.matmul, run.threads, "
                        "run.bf16_emulation)");
    apply_override(cfg, s);
  }
}

}  // namespace

EvalModel load_eval_model(const std::string& path, const std::string& config_path,
                          const std::string& tokenizer_path, bool need_tokenizer,
                          const EvalCompute& compute) {
  EvalModel m;
  const WeightsSource source = find_weights(path);
  m.weights = source.weights;
  m.run_dir = source.run_dir;
  m.step = source.step;
  if (source.config) {
    m.config = *source.config;
    if (!config_path.empty()) {
      // A --config may change how the model is evaluated (data, precision, threads), never
      // what the trained weights compute.
      Config given = load_config_file(find_config_file(config_path));
      Config saved = m.config;
      validate_and_resolve(saved);
      validate_and_resolve(given);
      const std::vector<std::string> diff = config_differences(saved, given, "model");
      if (!diff.empty())
        throw ConfigError("--config '" + config_path + "' describes another model than the " +
                              "checkpoint's own config (" + diff.front() +
                              (diff.size() > 1 ? fmt::format("; {} more", diff.size() - 1) : "") +
                              ")",
                          "leave out --config: the checkpoint's config (in its state.json) is "
                          "used, or fix the model keys to match it");
      m.config = given;
    }
  } else {
    if (config_path.empty())
      throw ConfigError("config error: '" + path +
                        "' is a bare weights file; pass --config FILE.yaml "
                        "describing its model");
    m.config = load_config_file(find_config_file(config_path));
  }
  validate_and_resolve(m.config);
  if (!compute.run_settings.empty()) {
    apply_run_settings(m.config, compute.run_settings);
    // Its warnings are about the model, which run.* keys cannot change (shown above).
    validate_and_resolve(m.config);
  }
  check_model_fits_memory(m.config.model, /*training=*/false);
  m.plan = plan_compute(m.config, this_machine(), compute.work);
  m.model = MiniMindForCausalLM(m.config.model, m.plan.products());
  load_weights(m.model, m.weights);

  std::string tok = tokenizer_path;
  const std::string own = m.run_dir.empty() ? std::string() : run_tokenizer_file(m.run_dir);
  if (tok.empty()) tok = own;
  if (tok.empty()) tok = m.config.data.tokenizer;
  if (tok.empty()) {
    if (need_tokenizer)
      throw TokenizerError(
          "no tokenizer: pass --tokenizer FILE (a .model or tokenizer.json) (or set data.tokenizer "
          "in the config)");
    return m;
  }
  m.tokenizer = Tokenizer::from_file(tok);
  m.tokenizer->check_vocab_size(m.config.model.vocab_size);
  // The run's weights know only its own tokenizer's ids (its validation split is tokenised
  // with it too): another one is a mistake, the same one (a copy) is fine.
  if (tok != own && !own.empty() &&
      m.tokenizer->model_bytes() != Tokenizer::from_file(own).model_bytes())
    throw TokenizerError("--tokenizer '" + tok + "' is another tokenizer than the run's own '" +
                             own + "', which its weights were trained with",
                         "leave out --tokenizer: the run's own tokenizer is used");
  return m;
}

TokenFile tokenize_corpus(const std::string& jsonl, const Tokenizer& tok,
                          const std::string& tmp_dir, int64_t max_docs) {
  fs::create_directories(tmp_dir);
  const std::string path = (fs::path(tmp_dir) / "eval.tok").string();
  {
    TokenFileWriter w(path, static_cast<uint32_t>(tok.vocab_size()), {0, 0},
                      static_cast<uint32_t>(tok.specials().pad));
    int64_t n = 0, bytes = 0;
    // A large corpus takes a while: say how far it is every few seconds.
    std::error_code ec;  // read_corpus below says what is wrong with a path that has no size
    const auto total = static_cast<double>(fs::file_size(jsonl, ec));
    const Stopwatch clock;
    double next_report = 5;
    read_corpus(jsonl, {}, [&](std::string_view text, int64_t) {
      if (max_docs >= 0 && n >= max_docs) return;
      w.add_document(tok.encode_document(text));
      ++n;
      bytes += static_cast<int64_t>(text.size());
      if (clock.seconds() >= next_report) {
        next_report = clock.seconds() + 5;
        spdlog::info("tokenising {}: {} documents, {:.0f} of {:.0f} MB of text", jsonl, n,
                     bytes / 1e6, total / 1e6);
      }
    });
    w.finish();
  }
  return TokenFile::open(path);
}

ChatTokens tokenize_chat_corpus(const std::string& jsonl, const Tokenizer& tok,
                                const std::string& tmp_dir, int64_t max_docs) {
  fs::create_directories(tmp_dir);
  const std::string path = (fs::path(tmp_dir) / "eval-chat.tok").string();
  const SftEncoder enc(tok);
  SftIndex index = enc.index_base();
  {
    TokenFileWriter w(path, static_cast<uint32_t>(tok.vocab_size()), {0, 0},
                      static_cast<uint32_t>(tok.specials().pad));
    int64_t n = 0;
    read_conversations(jsonl, {}, [&](Conversation&& c, int64_t) {
      if (max_docs >= 0 && n >= max_docs) return;
      enc.add_to(c, w, index);
      ++n;
    });
    index.write(path);
    w.finish();
  }
  return {TokenFile::open(path), std::move(index)};
}

}  // namespace minimind
