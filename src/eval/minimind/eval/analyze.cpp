#include "minimind/eval/analyze.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "minimind/data/jsonl.h"
#include "minimind/model/weights_io.h"
#include "minimind/util/stopwatch.h"

namespace minimind {
namespace {

// Rows of at most max_len tokens, padded with 0 into a batch; each row remembers its domain.
class RowBatch {
 public:
  RowBatch(int64_t max_len, int64_t batch) : max_len_(max_len), batch_(batch) {}
  // Splits a document into windows of max_len tokens: every token is routed once (a last
  // window of one token too, so that the counts cover the whole corpus). A document of one
  // token has no neighbour and is left out (documents are [bos] text [eos]).
  template <class Fn>
  void add_document(size_t domain, const std::vector<int64_t>& doc, Fn&& on_full) {
    if (doc.size() < 2) return;
    for (size_t at = 0; at < doc.size(); at += static_cast<size_t>(max_len_)) {
      const size_t n = std::min(doc.size() - at, static_cast<size_t>(max_len_));
      rows_.emplace_back(doc.begin() + static_cast<long>(at),
                         doc.begin() + static_cast<long>(at + n));
      domains_.push_back(domain);
      if (static_cast<int64_t>(rows_.size()) == batch_) flush(on_full);
    }
  }
  template <class Fn>
  void flush(Fn&& on_full) {
    if (rows_.empty()) return;
    on_full(rows_, domains_);
    rows_.clear(), domains_.clear();
  }

 private:
  int64_t max_len_, batch_;
  std::vector<std::vector<int64_t>> rows_;
  std::vector<size_t> domains_;
};

// [B, T] ids, right-padded with 0 (padding is left out of every count).
torch::Tensor pad_rows(const std::vector<std::vector<int64_t>>& rows) {
  size_t T = 0;
  for (const auto& r : rows) T = std::max(T, r.size());
  torch::Tensor ids =
      torch::zeros({static_cast<int64_t>(rows.size()), static_cast<int64_t>(T)}, torch::kLong);
  for (size_t b = 0; b < rows.size(); ++b)
    std::copy(rows[b].begin(), rows[b].end(), ids[static_cast<int64_t>(b)].data_ptr<int64_t>());
  return ids;
}

// One routing-only forward over padded rows: the output, and per MoE layer a pointer to
// each row's choices (its real tokens' [T_b * k] are the first of them).
struct RoutedRows {
  ForwardOutput out;
  std::vector<torch::Tensor> index;  // per MoE layer [B * T, k], contiguous
  int64_t stride = 0;                // T * k: from one row's choices to the next
  // row_choices(b)[l]: row b's choices in layer l
  std::vector<const int64_t*> row_choices(size_t b) const {
    std::vector<const int64_t*> p;
    for (const auto& t : index)
      p.push_back(t.data_ptr<int64_t>() + static_cast<int64_t>(b) * stride);
    return p;
  }
};

RoutedRows route_rows(MiniMindForCausalLM& model, const std::vector<std::vector<int64_t>>& rows) {
  const torch::Tensor ids = pad_rows(rows);  // [B, T]
  RoutedRows r;
  ForwardOptions blocks_only;
  blocks_only.head = false;
  r.out = model->forward(ids, {}, blocks_only);
  for (const auto& t : r.out.per_layer(&MoEStats::index)) r.index.push_back(t.contiguous());
  r.stride = r.index.empty() ? 0 : ids.size(1) * r.index[0].size(1);
  return r;
}

// Per MoE layer, the choices [T * k] of each row's real tokens, concatenated over rows.
std::vector<std::vector<int64_t>> choices_of(MiniMindForCausalLM& model,
                                             const std::vector<std::vector<int64_t>>& rows) {
  const RoutedRows r = route_rows(model, rows);
  std::vector<std::vector<int64_t>> per_layer(r.index.size());
  for (size_t b = 0; b < rows.size(); ++b) {
    const std::vector<const int64_t*> row = r.row_choices(b);
    for (size_t l = 0; l < row.size(); ++l) {
      const int64_t n = static_cast<int64_t>(rows[b].size()) * r.index[l].size(1);
      per_layer[l].insert(per_layer[l].end(), row[l], row[l] + n);
    }
  }
  return per_layer;
}

std::string readable_piece(const Tokenizer* tok, int64_t id) {
  if (!tok) return "#" + std::to_string(id);
  std::string p = tok->piece(static_cast<int32_t>(id));
  // sentencepiece marks a leading space with U+2581; show it as a visible space.
  std::string out;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p.compare(i, 3, "\xE2\x96\x81") == 0) {
      out += "\xE2\x90\xA3";  // ␣
      i += 2;
    } else if (p[i] == '\n') {
      out += "\\n";
    } else {
      out += p[i];
    }
  }
  return out;
}

}  // namespace

RoutingAnalysis analyze_routing(EvalModel& m, const AnalyzeOptions& o) {
  const ModelConfig& mc = m.config.model;
  if (!mc.use_moe)
    throw ConfigError("nothing to analyse: '" + m.weights +
                      "' is a dense model (model.use_moe = false); --analyze looks at how a MoE "
                      "routes tokens");
  MiniMindForCausalLM& model = m.model;
  // Back to the caller's mode however this returns (a bad document throws).
  struct ModeGuard {
    MiniMindForCausalLM& model;
    bool was_training;
    ~ModeGuard() { model->train(was_training); }
  } mode{model, model->is_training()};
  model->eval();
  torch::NoGradGuard no_grad;
  const int64_t max_len = m.config.data.max_seq_len;
  std::vector<std::string> names;
  for (const auto& s : o.sources) names.push_back(s.name);
  const auto moe_layers = static_cast<int64_t>(mc.num_hidden_layers);
  ProbeCounts counts(moe_layers, mc.num_experts, mc.num_experts_per_tok, mc.vocab_size, names);
  if (mc.learned_router())
    counts.counts.router.assign(static_cast<size_t>(moe_layers),
                                RouterSums(static_cast<size_t>(mc.num_experts) + 3, 0.0));

  std::vector<std::vector<int64_t>> kept_rows;  // the first probe rows: saturation
  int64_t kept_tokens = 0;
  std::vector<std::vector<int64_t>> passages;  // the first rows: the token view
  const Tokenizer* tok = m.tokenizer ? &*m.tokenizer : nullptr;
  RowBatch batch(max_len, o.batch_size);
  int64_t documents = 0;
  const Stopwatch clock;
  double last_report = 0;
  auto run_batch = [&](const std::vector<std::vector<int64_t>>& rows,
                       const std::vector<size_t>& domains) {
    const RoutedRows routed = route_rows(model, rows);
    counts.counts.add_router(routed.out.per_layer(&MoEStats::router_sums));
    for (size_t b = 0; b < rows.size(); ++b) {
      const std::vector<const int64_t*> choices = routed.row_choices(b);
      counts.add_sequence(domains[b], rows[b].data(), static_cast<int64_t>(rows[b].size()),
                          choices);
      if (kept_tokens < o.saturation_tokens) {
        kept_rows.push_back(rows[b]);
        kept_tokens += static_cast<int64_t>(rows[b].size());
      }
      if (static_cast<int64_t>(passages.size()) < o.passages)
        passages.emplace_back(
            rows[b].begin(),
            rows[b].begin() + std::min<long>(static_cast<long>(rows[b].size()), o.passage_tokens));
    }
  };

  for (size_t d = 0; d < o.sources.size(); ++d) {
    const ProbeSource& src = o.sources[d];
    const int64_t before = counts.tokens();
    auto report = [&](const std::string& where) {
      if (!o.progress || clock.seconds() - last_report < 2.0) return;
      last_report = clock.seconds();
      const double tok_s = static_cast<double>(counts.tokens()) / std::max(1e-9, clock.seconds());
      o.progress(fmt::format("analyse {}: {} | {} documents, {:.2f} M tokens, {:.0f} tokens/s",
                             src.name, where, documents, counts.tokens() / 1e6, tok_s));
    };
    if (!src.jsonl.empty()) {
      if (!tok)
        throw TokenizerError(
            "--analyze with --data needs a tokenizer: pass --tokenizer FILE (a .model or "
            "tokenizer.json)");
      std::error_code ec;  // read_corpus says what is wrong with a path that has no size
      const double size = static_cast<double>(std::filesystem::file_size(src.jsonl, ec));
      double read = 0;
      int64_t n = 0;
      read_corpus(src.jsonl, {}, [&](std::string_view text, int64_t) {
        if (o.max_docs >= 0 && n >= o.max_docs) return;
        ++n, ++documents;
        read += static_cast<double>(text.size()) + 12;  // + the JSON around it, roughly
        const std::vector<int32_t> ids = tok->encode_document(text);
        batch.add_document(d, std::vector<int64_t>(ids.begin(), ids.end()), run_batch);
        report(fmt::format("{:.0f} of {:.0f} MB ({:.0f} %)", read / 1e6, size / 1e6,
                           std::min(100.0, 100 * read / size)));
      });
    } else {
      const TokenFile& tf = *src.tokens;
      const auto n = static_cast<int64_t>(tf.num_docs());
      const int64_t stop = o.max_docs >= 0 ? std::min(n, o.max_docs) : n;
      for (int64_t doc = 0; doc < stop; ++doc) {
        std::vector<int64_t> ids(tf.doc_length(static_cast<uint64_t>(doc)));
        tf.copy(tf.doc_start(static_cast<uint64_t>(doc)), ids.size(), ids.data());
        ++documents;
        batch.add_document(d, ids, run_batch);
        report(fmt::format("document {} of {}", doc + 1, stop));
      }
    }
    batch.flush(run_batch);
    if (counts.tokens() == before)
      throw DataError("probe corpus '" + (src.jsonl.empty() ? src.tokens->path() : src.jsonl) +
                      "' gave no usable document (each needs at least 2 tokens)");
  }
  if (o.progress) o.progress("");

  RoutingAnalysis a = analyze_counts(counts, [&](int64_t id) { return readable_piece(tok, id); });
  a.weights = m.weights, a.step = m.step, a.documents = documents;

  // The token view: per passage, per layer, each token's top-1 expert and probabilities.
  for (const auto& row : passages) {
    const RoutedRows routed = route_rows(model, {row});
    TokenView v;
    for (int64_t id : row) v.pieces.push_back(readable_piece(tok, id));
    for (const MoEStats& layer : routed.out.moe) {
      // The top-1 expert: the highest-probability choice (a hash or random router's first).
      torch::Tensor top1 = layer.index.select(1, 0);  // [T]
      if (layer.probs.defined()) {
        const torch::Tensor& p = layer.probs;  // [T, E]
        top1 = layer.index.gather(1, p.gather(1, layer.index).argmax(1, true)).squeeze(1);
        std::vector<std::vector<double>> probs;
        const torch::Tensor pd = p.to(torch::kFloat64).contiguous();
        for (int64_t t = 0; t < pd.size(0); ++t)
          probs.emplace_back(pd[t].data_ptr<double>(), pd[t].data_ptr<double>() + pd.size(1));
        v.probs.push_back(std::move(probs));
      }
      const torch::Tensor t1 = top1.contiguous();
      v.top1.emplace_back(t1.data_ptr<int64_t>(), t1.data_ptr<int64_t>() + t1.numel());
    }
    a.passages.push_back(std::move(v));
  }

  // Router saturation over the kept checkpoints before the analysed one: the same probe
  // tokens through each, against the analysed (final) model's choices.
  std::vector<std::pair<int64_t, std::string>> earlier;
  for (const auto& c : o.checkpoints)
    if (c.first < m.step && c.second + "/model.pth" != m.weights) earlier.push_back(c);
  if (!earlier.empty()) {
    std::vector<int64_t> steps;
    std::vector<std::vector<std::vector<int64_t>>> topk;
    MiniMindForCausalLM other(mc, m.model->products());
    other->eval();
    for (const auto& [step, dir] : earlier) {
      if (o.progress) o.progress(fmt::format("saturation: checkpoint step {}", step));
      load_weights(other, dir + "/model.pth");
      steps.push_back(step);
      topk.push_back(choices_of(other, kept_rows));
    }
    steps.push_back(m.step);
    topk.push_back(choices_of(model, kept_rows));
    if (o.progress) o.progress("");
    a.saturation = saturation(steps, topk, mc.num_experts_per_tok);
    if (steps.size() < 4)
      a.saturation_note = fmt::format(
          "only {} checkpoints: for a fuller curve, raise train.keep_checkpoints (now {}) or "
          "lower train.checkpoint_interval (now {})",
          steps.size(), o.keep_checkpoints, o.checkpoint_interval);
  } else if (o.in_run) {
    a.saturation_note = fmt::format(
        "no saturation curve: the run kept no checkpoint before step {}; raise "
        "train.keep_checkpoints (now {}) or lower train.checkpoint_interval (now {})",
        m.step, o.keep_checkpoints, o.checkpoint_interval);
  } else {
    a.saturation_note =
        "no saturation curve: a bare weights file has no earlier checkpoints; analyse a run "
        "directory to compare its kept checkpoints";
  }
  return a;
}

}  // namespace minimind
