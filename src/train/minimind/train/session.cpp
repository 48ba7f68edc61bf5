#include "minimind/train/session.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <algorithm>
#include <filesystem>

#include "minimind/data/prepare.h"
#include "minimind/data/tokenizer.h"
#include "minimind/eval/eval_inputs.h"
#include "minimind/model/param_groups.h"
#include "minimind/model/weights_io.h"
#include "minimind/train/optim.h"
#include "minimind/train/train_step.h"
#include "minimind/util/allocator.h"
#include "minimind/util/atomic_file.h"
#include "minimind/util/blas_check.h"
#include "minimind/util/matmul.h"

namespace fs = std::filesystem;

namespace minimind {
namespace {

// The run's log and, on rank 0, train.log alone (for the fatal error of a failed run).
void make_run_loggers(TrainSession& s, const std::string& run_dir, bool append, int rank) {
  if (rank == 0) {
    auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(
        (fs::path(run_dir) / "train.log").string(), /*truncate=*/!append);
    std::vector<spdlog::sink_ptr> sinks = spdlog::default_logger()->sinks();
    sinks.push_back(file);
    s.log = std::make_shared<spdlog::logger>("minimind", sinks.begin(), sinks.end());
    s.file_log = std::make_shared<spdlog::logger>("minimind", file);
    s.file_log->flush_on(spdlog::level::info);
  } else {
    // A sink of its own: a pattern set on a shared sink would change the main's console.
    s.log = std::make_shared<spdlog::logger>(
        "minimind", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    s.log->set_pattern(fmt::format("[%Y-%m-%d %H:%M:%S.%e] [rank {}] [%^%l%$] %v", rank));
    s.log->set_level(spdlog::level::warn);
  }
  s.log->flush_on(spdlog::level::info);
}

// A resumed run must continue the same model; other changed settings are allowed (and
// said). Returns the checkpoint's batch size, which converts an older data position.
int64_t check_resumed_config(const Config& cfg, const TrainState& saved_state,
                             const std::string& checkpoint, const std::string& run_dir,
                             spdlog::logger& log) {
  Config saved = load_config_string(saved_state.config_yaml, checkpoint + "/state.json");
  validate_and_resolve(saved);
  const std::vector<std::string> model_diff = config_differences(saved, cfg, "model");
  if (!model_diff.empty())
    throw CheckpointError("cannot resume '" + checkpoint + "' with a different model (" +
                              fmt::format("{}", fmt::join(model_diff, "; ")) + ")",
                          "resume with the run's own config: " + run_dir + "/config.yaml");
  // The precision changes the run's numbers throughout, as a model change would.
  if (saved.run.precision != cfg.run.precision)
    throw CheckpointError(
        fmt::format("cannot resume '{}' with run.precision {}: the run trains "
                    "in {}",
                    checkpoint, name_of(cfg.run.precision), name_of(saved.run.precision)),
        fmt::format("resume with run.precision: {} (or start a new run)",
                    name_of(saved.run.precision)));
  // The optimizer's state is the trained parameters', in order.
  if (saved.train.freeze != cfg.train.freeze)
    throw CheckpointError("cannot resume '" + checkpoint + "' with another train.freeze",
                          "resume with the run's own config: " + run_dir + "/config.yaml");
  for (const auto& d : config_differences(saved, cfg))
    log.warn("resuming with a changed setting: {}", d);
  log.info("resuming {} from step {} ({} tokens seen)", checkpoint, saved_state.step,
           saved_state.tokens);
  return saved.train.batch_size;
}

// The weights of train.init_from into the model, as train.init_mode says; how upcycling cut
// and scaled the dense feed-forward (nullopt: copied by name).
std::optional<UpcyclePlan> load_init_weights(MiniMindForCausalLM& model, const TrainConfig& t,
                                             const std::string& weights,
                                             int64_t* units_redrawn = nullptr) {
  if (t.init_mode != "upcycle") {
    load_weights(model, weights);
    return std::nullopt;
  }
  UpcyclePlan plan = load_weights_upcycled(model, weights, t.upcycle_scaling);
  const int64_t redrawn = t.upcycle_drop > 0 ? drop_upcycle(model, t.upcycle_drop) : 0;
  if (units_redrawn) *units_redrawn = redrawn;
  return plan;
}

// The hash layers' tables (gate.tid2eid [V, k]) of a model, by name.
std::map<std::string, torch::Tensor> hash_tables(const MiniMindForCausalLM& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& b : model->named_buffers())
    if (is_hash_table(b.key())) out[b.key()] = b.value().clone();
  return out;
}

// train.init_from as checked, with what the check measured.
struct InitSource {
  WeightsSource weights;
  // Upcycling: upcycled_output_gap of the model as built (weights_io.h), and the units each
  // expert redrew (Drop-Upcycling).
  double output_gap = 0;
  int64_t units_redrawn = 0;
};

// train.init_from, checked before the run directory is touched (--resume is checked
// against the checkpoint in set_up): not inside the run's own output, weights whose names and
// shapes fit the configured model, and the tokenizer they were trained with (the source run's,
// unless data.tokenizer names one; cfg.data.tokenizer is set to it) with the weights' vocabulary.
// Throws ConfigError / CheckpointError / WeightsError / TokenizerError.
InitSource check_init_source(Config& cfg, const std::string& run_dir) {
  const std::string& from = cfg.train.init_from;
  const auto origin = cfg.origin.find("train.init_from");
  const std::string key =
      "train.init_from (" + (origin == cfg.origin.end() ? "default" : origin->second) + ")";
  const fs::path own = fs::weakly_canonical(fs::absolute(run_dir));
  const fs::path src = fs::weakly_canonical(fs::absolute(from));
  const auto [o, s] = std::mismatch(own.begin(), own.end(), src.begin(), src.end());
  if (o == own.end())
    throw ConfigError(key + ": '" + from + "' is inside this run's own directory '" + run_dir +
                          "', which the run writes",
                      "start from another run's weights (or a copy of these), or train into "
                      "another --out");
  const bool upcycle = cfg.train.init_mode == "upcycle";
  if (upcycle && !cfg.model.use_moe)
    throw ConfigError(
        "train.init_mode: upcycle turns a dense model into an MoE one, and this "
        "run's model is dense (model.use_moe: false)",
        "set model.use_moe: true (with num_experts and num_experts_per_tok), or "
        "train.init_mode: copy");
  InitSource init{find_weights(from)};
  const WeightsSource& w = init.weights;
  // The model as set_up builds it (the seed draws a random hash table), with the weights
  // loaded: names and shapes as an import checks them, and what the weights bring. Its
  // products are fp32 on OpenBLAS (PyTorch's numbers) whatever the run computes with: the
  // plan is made later, and the claim is about the weights, not the library.
  torch::manual_seed(static_cast<uint64_t>(cfg.run.seed));
  MiniMindForCausalLM probe(cfg.model, Products{});
  const std::map<std::string, torch::Tensor> tables = hash_tables(probe);
  try {
    load_init_weights(probe, cfg.train, w.weights, &init.units_redrawn);
  } catch (const WeightsError& e) {
    throw WeightsError(key + (upcycle ? " with train.init_mode: upcycle" : "") + ": " + e.what());
  }
  // Copied weights bring their hash tables; config.yaml must say the same table.
  for (const auto& [name, table] : hash_tables(probe))
    if (!torch::equal(table, tables.at(name)))
      throw ConfigError(
          key + ": the weights' hash table " + name +
              " is not the one model.hash_table: " + name_of(cfg.model.hash_table) +
              " with run.seed: " + std::to_string(cfg.run.seed) + " draws" +
              (w.config ? " (their run had model.hash_table: " +
                              std::string(name_of(w.config->model.hash_table)) +
                              ", run.seed: " + std::to_string(w.config->run.seed) + ")"
                        : std::string()),
          "set model.hash_table and run.seed as the weights' run had them: the experts learned "
          "that table's tokens");
  // Whether step 0 computes the dense model's function is measured, not assumed.
  if (upcycle) init.output_gap = upcycled_output_gap(probe, w.weights);
  const std::string theirs = w.run_dir.empty() ? "" : run_tokenizer_file(w.run_dir);
  if (!cfg.data.tokenizer.empty())
    Tokenizer::from_file(cfg.data.tokenizer).check_vocab_size(cfg.model.vocab_size);
  if (!cfg.data.tokenizer.empty() && !theirs.empty() && !cfg.train.init_other_tokenizer &&
      Tokenizer::from_file(cfg.data.tokenizer).model_bytes() !=
          Tokenizer::from_file(theirs).model_bytes()) {
    const auto tok_origin = cfg.origin.find("data.tokenizer");
    throw ConfigError(
        "data.tokenizer" +
            (tok_origin == cfg.origin.end() ? std::string() : " (" + tok_origin->second + ")") +
            ": '" + cfg.data.tokenizer + "' is another tokenizer than '" + theirs +
            "', the one the weights of " + key +
            " were trained with: their token ids would "
            "mean other text",
        "leave data.tokenizer empty to train with the weights' own tokenizer, or set "
        "train.init_other_tokenizer: true if another tokenizer is meant");
  }
  if (cfg.data.tokenizer.empty()) {
    if (theirs.empty())
      throw ConfigError(key + ": '" + from +
                            "' brings no tokenizer and data.tokenizer is empty: a tokenizer "
                            "trained from data.train would give ids the weights do not know",
                        "set data.tokenizer to the tokenizer the weights were trained with "
                        "(for a MiniMind .pth: its model/tokenizer.json)");
    cfg.data.tokenizer = theirs;
    cfg.origin["data.tokenizer"] = "the tokenizer of train.init_from's run";
  }
  Tokenizer::from_file(cfg.data.tokenizer).check_vocab_size(cfg.model.vocab_size);
  return init;
}

// Keys a rank may set for itself: how fast it runs, how long it waits, where its files are
// and what its console shows. Every other key decides what is computed and must agree.
bool rank_may_differ(const std::string& key) {
  for (const char* k : {"run.threads", "run.dist_timeout", "data.cache_dir", "data.train",
                        "data.val", "data.tokenizer", "log.console"})
    if (key == k) return true;
  return false;
}

// Before anything is written: every rank compares a hash of each key's value with every
// other rank's (a maximum of [h, -h] over the ranks is h on both only where all agree), and
// a difference stops every rank naming the keys. Otherwise ranks of another model size would
// fail inside a collective, and another seed or learning rate would train silently.
void check_ranks_agree(const Config& cfg, Distributed& dist) {
  if (dist.world_size() <= 1) return;
  std::vector<std::pair<std::string, std::string>> values;
  for (auto& kv : config_values(cfg))
    if (!rank_may_differ(kv.first)) values.push_back(std::move(kv));
  const auto n = static_cast<int64_t>(values.size());
  torch::Tensor t = torch::empty({2 * (n + 1)}, torch::kInt64);  // [2 (n + 1)]
  int64_t* h = t.data_ptr<int64_t>();
  h[0] = n, h[1] = -n;
  for (int64_t i = 0; i < n; ++i) {
    const auto v = static_cast<int64_t>(std::hash<std::string>{}(values[i].second) >> 2);
    h[2 * i + 2] = v, h[2 * i + 3] = -v;
  }
  dist.all_reduce_max(t);
  if (h[0] != -h[1])
    throw ConfigError("the ranks run different versions of minimind-train (their configs have " +
                      std::to_string(-h[1]) + " to " + std::to_string(h[0]) + " keys)");
  std::vector<std::string> differ;
  for (int64_t i = 0; i < n; ++i)
    if (h[2 * i + 2] != -h[2 * i + 3])
      differ.push_back(values[i].first + " (rank " + std::to_string(dist.rank()) + ": " +
                       values[i].second + ")");
  if (differ.empty()) return;
  std::string shown;
  for (size_t i = 0; i < differ.size() && i < 4; ++i) shown += (i ? ", " : "") + differ[i];
  if (differ.size() > 4) shown += fmt::format(" and {} more", differ.size() - 4);
  throw ConfigError("the ranks' configs differ: " + shown,
                    "give every rank the same config and --set options (only run.threads, "
                    "run.dist_timeout, log.console and the data paths may differ)");
}

// Every rank must split the experts alike and train the same number of shards (each shard
// exchanges over connections of its own): a difference is refused on every rank before
// anything is trained. Then the expert groups are formed.
void set_up_expert_parallel(TrainSession& s, Distributed& dist) {
  const int64_t n = s.plan.expert_parallel;
  const int64_t shards = s.plan.shards;
  if (dist.world_size() > 1) {
    torch::Tensor v = torch::tensor({n, -n, shards, -shards});  // [4]
    dist.all_reduce_max(v);
    const int64_t* m = v.data_ptr<int64_t>();
    if (m[0] != n || -m[1] != n)
      throw ConfigError(
          fmt::format(
              "run.expert_parallel differs between the ranks (from {} to {}; rank {} has {})",
              -m[1], m[0], dist.rank(), n),
          "give every rank the same config and --set options");
    if (n > 1 && (m[2] != shards || -m[3] != shards))
      throw ConfigError(
          fmt::format("with run.expert_parallel the ranks must train the same number of "
                      "micro-batch shards (from {} to {}; rank {} has {})",
                      -m[3], m[2], dist.rank(), shards),
          "give every rank the same run.threads (or LOCAL_WORLD_SIZE)");
  }
  if (n > 1) s.ep = std::make_unique<ExpertParallel>(dist, static_cast<int>(n), s.plan.shards);
  s.parallel = {&dist, s.ep.get()};
}

// The plan's fp32 library, where the plan alone cannot decide it: a resumed run with
// run.matmul auto keeps the library its checkpoint used (a checkpoint moved to another CPU
// keeps its numbers), and every rank of a job takes rank 0's (ranks on hosts of another CPU
// would resolve auto otherwise, and ranks on two libraries would round their products
// differently).
void settle_matmul(TrainSession& s, const Config& cfg, const std::optional<TrainState>& saved,
                   Distributed& dist) {
  if (saved && cfg.run.matmul == MatmulBackend::automatic && saved->fp32_library())
    s.plan =
        with_matmul(s.plan, *saved->fp32_library(), "run.matmul: auto, as before the checkpoint");
  if (dist.world_size() > 1) {
    torch::Tensor choice = torch::tensor({static_cast<int64_t>(s.plan.matmul)});  // [1]
    dist.broadcast_from_main({choice});
    const auto main_choice = static_cast<MatmulBackend>(choice.item<int64_t>());
    if (main_choice != s.plan.matmul) s.plan = with_matmul(s.plan, main_choice, "rank 0's");
  }
}

void set_up(TrainSession& s, const Config& cfg, const std::optional<InitSource>& from,
            Distributed& dist, const StopFlag* stop) {
  const bool main_rank = dist.is_main();
  const std::string& run_dir = s.run.path;
  spdlog::logger& log = *s.log;
  const std::string config_yaml = config_to_yaml(cfg);  // config.yaml and every checkpoint

  int64_t saved_batch_size = 0;  // of the checkpoint's run: converts an older data position
  std::optional<TrainState> saved;
  if (s.run.checkpoint) {
    saved = read_checkpoint_state(*s.run.checkpoint);
    // A run started from train.init_from resumes from its own checkpoint; other weights
    // named now would be ignored, so they are refused.
    const std::string& from = cfg.train.init_from;
    if (!from.empty() && (!saved->init_from || saved->init_from->path != from))
      throw ConfigError(
          "--resume and train.init_from ('" + from +
              "') together: the run resumes from its "
              "checkpoint " +
              *s.run.checkpoint + ", which did not start from those weights",
          "leave out --resume to start a new run from the weights (--overwrite replaces "
          "this one), or leave out train.init_from to resume");
    saved_batch_size = check_resumed_config(cfg, *saved, *s.run.checkpoint, run_dir, log);
  }
  settle_matmul(s, cfg, saved, dist);
  s.compute.emplace(s.plan);
  if (main_rank) log.info("{}", s.plan.describe());
  if (saved && saved->plan)
    for (const auto& d : s.plan.differences(*saved->plan))
      log.info("compute plan changed since the checkpoint: {}", d);
  if (main_rank) write_file_atomic((fs::path(run_dir) / "config.yaml").string(), config_yaml);

  // Data, prepared once and cached by content: rank 0 prepares, the others then find it in
  // the cache. The run directory keeps its own copy of the tokenizer.
  std::optional<PreparedData> prepared;
  // A resumed run keeps its own tokenizer (its copy in the run directory), even when the
  // corpus at data.train has changed since: its weights only know those token ids.
  DataConfig data = cfg.data;
  const std::string own_tokenizer = run_tokenizer_file(run_dir);
  const bool keeps_tokenizer = s.run.checkpoint && data.tokenizer.empty() && !own_tokenizer.empty();
  if (keeps_tokenizer) data.tokenizer = own_tokenizer;
  if (main_rank) prepared = prepare_data(data, cfg.model.vocab_size, s.plan.threads, log, stop);
  dist.barrier();
  if (!main_rank) prepared = prepare_data(data, cfg.model.vocab_size, s.plan.threads, log, stop);
  if (main_rank && !keeps_tokenizer) {
    // One tokenizer per run directory: a .model replaced by a tokenizer.json (or back) on
    // --overwrite leaves no stale one beside it.
    const std::string name = run_tokenizer_name(prepared->tokenizer_path);
    for (const char* other : {"tokenizer.json", "tokenizer.model"})
      if (name != other) fs::remove(fs::path(run_dir) / other);
    // Written whole or not at all: a crash here leaves the previous copy.
    const Tokenizer tok = Tokenizer::from_file(prepared->tokenizer_path);
    write_file_atomic((fs::path(run_dir) / name).string(), tok.model_bytes());
    // A tokenizer.json's pad, bos and eos by name and its chat template, as read (perhaps
    // from a tokenizer_config.json beside the original), so the run's copy reads the same.
    const fs::path names = fs::path(run_dir) / "tokenizer_config.json";
    if (tok.is_hf_json())
      write_file_atomic(names.string(), tok.config_json());
    else
      fs::remove(names);
  }
  s.train_tokens = TokenFile::open(prepared->train_path);
  if (!prepared->val_path.empty() && prepared->val_docs > 0)
    s.val_tokens = TokenFile::open(prepared->val_path);
  else
    log.warn("no validation split (data.val empty and data.val_fraction 0): no evaluation");
  // Rank r draws global batches r, r + world, ...: a global batch of world x batch_size
  // rows per micro-step, the same rows for any split of them over ranks.
  if (cfg.data.mode == "sft") {
    s.train_chat = std::make_shared<const SftIndex>(SftIndex::read(prepared->train_path));
    if (s.val_tokens)
      s.val_chat = std::make_shared<const SftIndex>(SftIndex::read(prepared->val_path));
  }
  SftRowsOptions chat_rows;
  chat_rows.add_system_ratio = cfg.data.add_system_ratio;
  chat_rows.empty_think_ratio = cfg.data.empty_think_ratio;
  chat_rows.packing = cfg.data.sft_packing;
  s.sampler.emplace(s.train_tokens, cfg.data.mode, cfg.train.batch_size, cfg.data.max_seq_len,
                    static_cast<uint64_t>(cfg.run.seed), dist.rank(), dist.world_size(),
                    s.train_chat, chat_rows);

  if (const std::string allocator = allocator_name(); allocator != "tcmalloc" && main_rank)
    log.warn(
        "memory allocator: {}, not the tcmalloc the programs link (docs/performance.md): "
        "steps allocate slower, results are the same",
        allocator);
  const BlasReport blas = check_blas();
  if (!blas.ok)
    log.warn(
        "!!! matmul runs at {:.1f} GFLOP/s (BLAS: {}); expected > {:.0f}. Install an "
        "optimised BLAS (`apt-get install libopenblas0-pthread`; scripts/install-deps.sh "
        "does): training will be ~20x slower.",
        blas.gflops, blas.library, kMinSaneGflops);
  if (const std::string changed = blas_kernels_changed(); !changed.empty() && main_rank)
    log.info(
        "OpenBLAS kernels {} (it does not know this CPU; set OPENBLAS_CORETYPE to choose): "
        "matmul {:.0f} GFLOP/s",
        changed, blas.gflops);

  // Model and optimizer, fresh or from the checkpoint. The seed drives the initial weights
  // (torch's default generator, whose state the checkpoints carry).
  torch::manual_seed(static_cast<uint64_t>(cfg.run.seed));
  // The whole model, then (expert parallelism) this rank's shard of the experts: every rank
  // starts from the same whole-model weights.
  s.model = MiniMindForCausalLM(cfg.model, s.plan.products());
  init_weights(s.model);
  // The whole model, then (expert parallelism) this rank's shard.
  std::optional<UpcyclePlan> upcycled;
  const WeightsSource* init = from ? &from->weights : nullptr;
  if (init && !s.run.checkpoint) upcycled = load_init_weights(s.model, cfg.train, init->weights);
  if (s.ep) apply_expert_parallel(s.model, *s.ep);
  // train.freeze: those groups keep their values; only the others get gradients and AdamW
  // state.
  std::vector<torch::Tensor> trained;
  int64_t frozen = 0, total = 0;
  for (auto& p : s.model->named_parameters()) {
    total += p.value().numel();
    const auto& f = cfg.train.freeze;
    if (std::find(f.begin(), f.end(), param_group(p.key())) == f.end()) {
      trained.push_back(p.value());
    } else {
      p.value().set_requires_grad(false);
      frozen += p.value().numel();
    }
  }
  if (!cfg.train.freeze.empty() && main_rank)
    log.info("training {} of {} parameters ({} frozen: {})", total - frozen, total, frozen,
             fmt::format("{}", fmt::join(cfg.train.freeze, ", ")));
  s.optimizer = make_optimizer(trained, cfg.train);
  if (s.run.checkpoint) s.state = load_checkpoint(*s.run.checkpoint, s.model, *s.optimizer);
  if (init && !s.run.checkpoint) {
    StartFrom r;
    r.path = cfg.train.init_from, r.mode = cfg.train.init_mode;
    r.upcycle_drop = cfg.train.upcycle_drop, r.weights = init->weights, r.step = init->step;
    r.content_key = main_rank ? file_content_key(init->weights, "weights") : std::string();
    // What made the weights, for comparisons at equal compute.
    r.source_tokens = init->trained_tokens, r.source_flops = init->trained_flops;
    // Measured on the model as built (check_init_source): its logits against the dense
    // model's, on a fixed probe.
    const bool preserves = upcycled && from->output_gap <= kUpcycleSameFunction;
    if (upcycled) {
      r.upcycle_scaling = cfg.train.upcycle_scaling, r.granularity = upcycled->granularity;
      r.shared_granularity = upcycled->shared_granularity;
      r.routed_scale = upcycled->routed_scale, r.shared_scale = upcycled->shared_scale;
      r.units_redrawn = from->units_redrawn, r.output_gap = from->output_gap;
      r.preserves_function = preserves;
    }
    s.state.init_from = r;
    if (main_rank) {
      log.info(
          "weights from {} (step {} of its run; {}, content key {}); optimizer, step, data "
          "position and schedule start afresh",
          cfg.train.init_from, init->step, init->weights, r.content_key);
      if (upcycled) {
        const UpcyclePlan& p = *upcycled;
        log.info(
            "upcycled: every expert {} of its layer's dense feed-forward{}{}, routers from "
            "run.seed{}",
            p.granularity == 1 ? "a copy" : fmt::format("a 1/{} slice", p.granularity),
            p.routed_scale != 1.0 ? fmt::format(", down_proj scaled by {:.6g}", p.routed_scale)
                                  : std::string(),
            cfg.train.upcycle_drop > 0
                ? fmt::format(" with {} of its {} intermediate units redrawn (Drop-Upcycling, "
                              "train.upcycle_drop {:g})",
                              from->units_redrawn, cfg.model.expert_ffn_size(),
                              cfg.train.upcycle_drop)
                : std::string(),
            p.granularity > 1 ? " (shared within each group of experts)" : "");
        const std::string measured = fmt::format(
            "measured: logits within {:.2g} of the dense model's, relative", from->output_gap);
        if (preserves) {
          log.info("step 0 computes the dense model's function ({})", measured);
        } else {
          std::string why = p.not_preserved;
          if (from->units_redrawn > 0)
            why += std::string(why.empty() ? "" : "; ") + "Drop-Upcycling redrew units";
          log.info("step 0 computes another function than the dense model ({}){}{}", measured,
                   why.empty() ? "" : ": ", why);
        }
      }
    }
  }
  s.state.config_yaml = config_yaml;
  s.state.plan = s.plan;
  if (s.run.checkpoint) {
    // The position is stored in rows of the global stream: continue at the first row not
    // yet drawn, whatever the rank count and batch size now.
    const int64_t rows_per_batch = cfg.train.batch_size * dist.world_size();
    const int64_t rows =
        s.state.loader_rows >= 0 ? s.state.loader_rows : s.state.loader_batches * saved_batch_size;
    if (rows % rows_per_batch != 0)
      log.warn(
          "the checkpoint's data position ({} rows) is not a multiple of {} rows per "
          "micro-step; {} rows are skipped",
          rows, rows_per_batch, rows_per_batch - rows % rows_per_batch);
    s.sampler->set_position((rows + rows_per_batch - 1) / rows_per_batch);
  }
  // Every rank starts from rank 0's weights (an expert from the first rank holding it).
  if (s.ep) {
    const SplitParameters split = split_parameters(s.model);
    dist.broadcast_from_main(split.replicated);
    s.ep->replicas().broadcast_from_main(split.experts);
  } else {
    dist.broadcast_from_main(s.model->parameters());
  }

  const ParamCount n = count_parameters(s.model);
  const ModelConfig& m = cfg.model;
  const MemoryEstimate mem =
      memory_estimate(m, /*training=*/true, cfg.train.batch_size, cfg.data.max_seq_len);
  log.info(
      "model: {} layers, hidden {}, {}: {:.3f} M parameters ({:.3f} M active); "
      "memory estimate {:.3g} GB (weights and optimizer {:.3g}, activations {:.3g}{}); "
      "BLAS {:.0f} GFLOP/s{}",
      m.num_hidden_layers, m.hidden_size,
      m.use_moe ? fmt::format("MoE {} experts top-{}", m.num_experts, m.num_experts_per_tok)
                : std::string("dense"),
      n.total / 1e6, n.active / 1e6, mem.total() / 1e9, mem.weights / 1e9, mem.activations / 1e9,
      mem.routing > 0 ? fmt::format(", routing tables {:.3g}", mem.routing / 1e9) : std::string(),
      blas.gflops,
      s.ep ? fmt::format("; experts spread over {} ranks per group ({} of {} per rank)",
                         s.ep->size(), m.num_experts / s.ep->size(), m.num_experts)
           : std::string());
}

}  // namespace

std::unique_ptr<TrainSession> open_session(const Config& cfg, const std::string& run_dir,
                                           bool resume, bool overwrite, Distributed& dist,
                                           const StopFlag* stop) {
  auto s = std::make_unique<TrainSession>();
  // Before --overwrite empties the run directory: what can be known wrong now.
  check_data_paths(cfg);
  check_model_fits_memory(cfg.model, /*training=*/true, cfg.train.batch_size, cfg.data.max_seq_len);
  check_ranks_agree(cfg, dist);  // refusals here leave the run directory alone
  Config run_cfg = cfg;          // with the tokenizer of train.init_from's run
  std::optional<InitSource> init;
  // A resumed run reads only its own checkpoint (and tokenizer copy): the weights it started
  // from may be gone by now.
  if (!cfg.train.init_from.empty() && !resume) init = check_init_source(run_cfg, run_dir);
  s->plan =
      plan_compute(cfg, this_machine(),
                   {true, cfg.train.batch_size, dist.world_size(), dist.env().local_world_size});
  set_up_expert_parallel(*s, dist);
  s->run = open_run_directory(run_dir, resume, overwrite, dist,
                              {cfg.data.train, cfg.data.val, cfg.data.tokenizer});
  make_run_loggers(*s, run_dir, resume, dist.rank());
  try {
    set_up(*s, run_cfg, init, dist, stop);
  } catch (const std::exception& e) {
    log_failure(*s, e);
    throw;
  }
  return s;
}

void log_failure(const TrainSession& s, const std::exception& e) {
  if (s.file_log) s.file_log->error("{}", e.what());
}

}  // namespace minimind
