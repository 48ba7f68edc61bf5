#include "minimind/model/weights_io.h"

#include <ATen/CPUGeneratorImpl.h>
#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <torch/csrc/jit/serialization/import_read.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "minimind/util/atomic_file.h"
#include "minimind/util/input_file.h"
#include "minimind/util/zip_check.h"

namespace minimind {

NamedTensors state_dict(const MiniMindForCausalLM& model) {
  NamedTensors out;
  for (const auto& item : model->named_parameters()) out.emplace_back(item.key(), item.value());
  // Buffers that are state: the routers' selection bias (aux-loss-free balancing).
  for (const auto& item : model->named_buffers()) out.emplace_back(item.key(), item.value());
  if (model->config().tie_word_embeddings)
    out.emplace_back("lm_head.weight", model->model->embed_tokens->weight);
  return out;
}

void save_weights(const MiniMindForCausalLM& model, const std::string& path, torch::Dtype dtype) {
  save_weights(state_dict(model), path, dtype);
}

void save_weights(const NamedTensors& tensors, const std::string& path, torch::Dtype dtype) {
  c10::Dict<std::string, torch::Tensor> dict;
  for (const auto& [name, t] : tensors)
    // dtype is the weights'; a table of ids (a hash layer's tid2eid) stays integral.
    dict.insert(name,
                (t.is_floating_point() ? t.detach().to(dtype) : t.detach()).contiguous().clone());
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  write_file_atomic(path, std::string_view(bytes.data(), bytes.size()));
}

namespace {

// torch::pickle_load reads through LibTorch's VectorReader, which copies whatever range the
// zip reader asks for without a bounds check: a damaged .pth whose central directory points
// past the end makes it read (and crash on) foreign memory (found by fuzz_weights). This
// adapter serves the same bytes but answers a read past the end with a short count, which
// the zip reader reports as a corrupt archive.
class BoundedBytes final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BoundedBytes(std::string bytes) : bytes_(std::move(bytes)) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<uint64_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  std::string bytes_;
};

// A file's first bytes for a message: up to 16, each shown as itself or as \xNN.
std::string printable_head(const std::string& bytes) {
  std::string out = "\"";
  for (size_t i = 0; i < bytes.size() && i < 16; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    out += c >= 0x20 && c < 0x7f && c != '"' && c != '\\' ? std::string(1, static_cast<char>(c))
                                                          : fmt::format("\\x{:02X}", c);
  }
  return out + (bytes.size() > 16 ? "...\"" : "\"");
}

}  // namespace

bool is_hash_table(const std::string& name) {
  static const std::string suffix = ".gate.tid2eid";
  return name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

c10::IValue read_pickle(const std::string& path) {
  std::string bytes =
      open_input<WeightsError>(path, "weights file", "a file written by torch.save").read_all();
  // torch.save writes a zip archive (PyTorch 1.6 and later), which begins with a local header.
  if (bytes.rfind("PK\x03\x04", 0) != 0)
    throw WeightsError("'" + path +
                           "' is not a file written by torch.save: it does not begin as a zip "
                           "archive (" +
                           (bytes.empty() ? std::string("it is empty")
                                          : "its first bytes are " + printable_head(bytes)) +
                           ")",
                       "give a .pth file written by torch.save (PyTorch 1.6 or later), a run "
                       "directory or one of its checkpoints/step_N directories");
  // LibTorch's reader does not check the entries' CRCs: a damaged block would load as
  // whatever its bytes read as (NaN weights, say).
  if (const std::string damage = zip_damage(std::string_view(bytes.data(), bytes.size()));
      !damage.empty())
    throw WeightsError("'" + path + "' is damaged: " + damage,
                       "restore it from a copy (in a run directory, an earlier checkpoint under "
                       "checkpoints/ may be whole)");
  try {
    // What torch::pickle_load does, with the bounds-checked reader above.
    caffe2::serialize::PyTorchStreamReader reader(std::make_shared<BoundedBytes>(std::move(bytes)));
    return torch::jit::readArchiveAndTensors("data", /*pickle_prefix=*/"", /*tensor_prefix=*/"",
                                             c10::nullopt, c10::nullopt, c10::nullopt, reader);
  } catch (const std::exception& e) {
    throw WeightsError("'" + path +
                       "' is not a file written by torch.save (corrupt or "
                       "truncated?): " +
                       first_line(e.what()));
  }
}

NamedTensors read_tensor_dict(const std::string& path) {
  c10::IValue value = read_pickle(path);
  if (!value.isGenericDict())
    throw WeightsError("'" + path + "' does not hold a {name: tensor} dict");
  NamedTensors out;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor())
      throw WeightsError("'" + path + "' holds a non-tensor entry; expected {name: tensor}");
    out.emplace_back(entry.key().toStringRef(), entry.value().toTensor());
  }
  return out;
}

namespace {

// Where a model tensor's value comes from: the file tensor `name` ("": it keeps its value),
// optionally the slice [start, start + length) of its dimension `dim` (length 0: whole),
// times `scale`.
struct SourceSlice {
  std::string name;
  int64_t dim = 0;
  int64_t start = 0;
  int64_t length = 0;
  double scale = 1.0;
};

// Loads the file's tensors into the model, each model tensor from `source_of(its name)`;
// the names and shapes are checked first and the first mismatches listed. `unused_ok(file
// name)`: a file tensor no model tensor reads that is not an error.
void load_mapped(MiniMindForCausalLM& model, const std::map<std::string, torch::Tensor>& file,
                 const std::string& path,
                 const std::function<SourceSlice(const std::string&)>& source_of,
                 const std::function<bool(const std::string&)>& unused_ok,
                 const std::string& hint) {
  auto sliced = [&](const SourceSlice& s) {
    const torch::Tensor& t = file.at(s.name);
    return s.length > 0 ? t.narrow(s.dim, s.start, s.length) : t;
  };
  std::vector<std::string> problems;
  std::map<std::string, torch::Tensor> expected;
  for (const auto& [name, t] : state_dict(model)) expected[name] = t;
  std::set<std::string> read;
  for (const auto& [name, t] : expected) {
    const SourceSlice from = source_of(name);
    if (from.name.empty()) continue;
    read.insert(from.name);
    const std::string shown = from.name == name ? name : name + " (from " + from.name + ")";
    auto it = file.find(from.name);
    if (it == file.end()) {
      problems.push_back("missing " + from.name + " " + c10::str(t.sizes()) +
                         (from.name == name ? "" : " for " + name));
    } else if (sliced(from).sizes() != t.sizes()) {
      problems.push_back("shape of " + shown + ": file " + c10::str(sliced(from).sizes()) +
                         ", model " + c10::str(t.sizes()));
    } else if (it->second.is_floating_point() != t.is_floating_point()) {
      problems.push_back(from.name + (t.is_floating_point() ? " is not a floating-point tensor"
                                                            : " is not an integer tensor"));
    } else if (is_hash_table(name) && it->second.numel() > 0) {
      // A hash layer's table of expert ids: an id outside the experts would index past them.
      const int64_t lo = it->second.min().item<int64_t>(), hi = it->second.max().item<int64_t>();
      const int64_t E = model->config().num_experts;
      if (lo < 0 || hi >= E)
        problems.push_back(from.name + " holds expert id " + std::to_string(lo < 0 ? lo : hi) +
                           ", outside the model's " + std::to_string(E) + " experts (0-" +
                           std::to_string(E - 1) + ")");
    }
  }
  for (const auto& [name, t] : file)
    if (!read.count(name) && !unused_ok(name))
      problems.push_back("unexpected " + name + " " + c10::str(t.sizes()));

  if (!problems.empty()) {
    std::ostringstream msg;
    msg << "weights in '" << path << "' do not match the model config (" << problems.size()
        << " mismatch" << (problems.size() > 1 ? "es" : "") << "):";
    for (size_t i = 0; i < problems.size() && i < 8; ++i) msg << "\n  " << problems[i];
    if (problems.size() > 8) msg << "\n  ...";
    msg << "\nhint: " << hint;
    throw WeightsError(msg.str());
  }

  torch::NoGradGuard no_grad;
  auto copy_in = [&](const std::string& name, torch::Tensor& value) {
    const SourceSlice from = source_of(name);
    if (from.name.empty()) return;
    // Scaled in float64 so the product rounds once; unscaled tensors are copied as they are
    // (a whole model's weights need no float64 copy).
    const torch::Tensor v =
        from.scale != 1.0 ? sliced(from).to(torch::kFloat64) * from.scale : sliced(from);
    value.copy_(v.to(value.scalar_type()));
  };
  for (auto& item : model->named_parameters()) copy_in(item.key(), item.value());
  for (auto& item : model->named_buffers()) copy_in(item.key(), item.value());
}

std::map<std::string, torch::Tensor> read_tensor_map(const std::string& path) {
  std::map<std::string, torch::Tensor> file;
  for (auto& [name, t] : read_tensor_dict(path)) file[name] = t;
  return file;
}

}  // namespace

void load_weights(MiniMindForCausalLM& model, const std::string& path) {
  std::set<std::string> elsewhere;  // other ranks' experts: in the file, not loaded here
  for (const ParamSlot& p : full_parameters(model))
    if (!p.local.defined()) elsewhere.insert(p.name);
  load_mapped(
      model, read_tensor_map(path), path, [](const std::string& name) { return SourceSlice{name}; },
      [&](const std::string& name) { return elsewhere.count(name) > 0; },
      "check model.hidden_size, num_hidden_layers, use_moe, num_experts, n_shared_experts, "
      "router, router_bias_update_rate, router_bias_rule and hash_layers against the "
      "checkpoint's config.");
}

UpcyclePlan load_weights_upcycled(MiniMindForCausalLM& model, const std::string& path,
                                  bool scaling) {
  const std::map<std::string, torch::Tensor> file = read_tensor_map(path);
  for (const auto& [name, t] : file)
    if (name.find(".mlp.experts.") != std::string::npos)
      throw WeightsError("weights in '" + path + "' hold experts (" + name +
                             "): upcycling starts from a dense model",
                         "train.init_mode: upcycle takes a dense run's weights; to start an MoE "
                         "from an MoE, use train.init_mode: copy");
  const ModelConfig& c = model->config();
  const auto dense = file.find("model.layers.0.mlp.gate_proj.weight");
  const int64_t I =
      dense != file.end() && dense->second.dim() == 2 ? dense->second.size(0) : c.ffn_size();
  // Fine-grained experts take slices of the dense feed-forward: G = I / width of them.
  auto granularity = [&](int64_t width, const char* key) {
    if (width > I || I % width != 0)
      throw WeightsError(fmt::format("model.{} is {}, which does not divide the dense model's "
                                     "intermediate_size {}",
                                     key, width, I),
                         fmt::format("upcycling gives each expert the whole dense feed-forward "
                                     "({0}) or a 1/G slice of it: set model.{1} to {0} divided "
                                     "by a whole number",
                                     I, key));
    return I / width;
  };
  UpcyclePlan plan;
  const int64_t E = c.num_experts, k = c.num_experts_per_tok, n_s = c.n_shared_experts;
  plan.granularity = granularity(c.expert_ffn_size(), "moe_intermediate_size");
  const int64_t G = plan.granularity;
  if (E % G != 0)
    throw WeightsError(
        fmt::format("model.num_experts ({}) is not a multiple of the {} slices the dense "
                    "feed-forward is cut into (intermediate_size {} / moe_intermediate_size {})",
                    E, G, I, c.expert_ffn_size()),
        "each group of experts holds every slice once: use num_experts = a multiple of " +
            std::to_string(G));
  plan.shared_granularity =
      n_s > 0 ? granularity(c.shared_ffn_size(), "shared_expert_intermediate_size") : 1;
  // Each chosen expert's weight when the router's scores all tie (its weights zero).
  const bool renormalised = c.norm_topk_prob || c.router == RouterKind::random;
  const int64_t k_eff = c.router == RouterKind::hash ? 1 : k;
  const double tie_score = c.scoring_func == ScoringFunc::sigmoid        ? 0.5  // sigmoid(0)
                           : c.scoring_func == ScoringFunc::sqrtsoftplus ? std::sqrt(std::log(2.0))
                                                                         : 1.0 / E;
  const double tie_weight = (renormalised                   ? 1.0 / k_eff
                             : c.router == RouterKind::hash ? 1.0
                                                            : tie_score) *
                            (c.learned_router() ? c.routed_scaling_factor : 1.0);
  if (scaling) {
    // He et al. 2024: scale so that k chosen experts (k/G whole groups) at tied scores give
    // the dense output; the shared experts (n_s / G_s dense copies) and the routed mixture
    // then each give an equal share of it.
    const double paths =
        1.0 + static_cast<double>(n_s) / static_cast<double>(plan.shared_granularity);
    plan.routed_scale = static_cast<double>(G) / (static_cast<double>(k_eff) * tie_weight) / paths;
    plan.shared_scale = 1.0 / paths;
  }
  // Whether step 0 computes the dense function whatever the router's values.
  std::vector<std::string> why;
  if (!renormalised && !(c.router == RouterKind::hash && G == 1))
    why.push_back(
        "the chosen experts' weights are not renormalised (model.norm_topk_prob: false), so "
        "each token's feed-forward output is scaled by its router scores");
  if (G > 1 && (c.router != RouterKind::learned || k_eff % G != 0))
    why.push_back(
        fmt::format("a token must choose whole groups of {} slices (a learned router "
                    "and num_experts_per_tok a multiple of {})",
                    G, G));
  if (G > 1 && c.hash_layers > 0)
    why.push_back(
        fmt::format("the {} hash-routed layers choose experts by token id, not whole "
                    "groups of {} slices",
                    c.hash_layers, G));
  if (!scaling && (G > 1 || n_s > 0))
    why.push_back(G > 1 ? "sliced experts need train.upcycle_scaling to add up to the dense "
                          "output"
                        : "the shared experts add to the routed ones (train.upcycle_scaling "
                          "shares the output between them)");
  if (scaling && n_s % plan.shared_granularity != 0)
    why.push_back("model.n_shared_experts is not a multiple of the shared experts' slices");
  for (size_t i = 0; i < why.size(); ++i) plan.not_preserved += (i ? "; " : "") + why[i];

  // model.layers.i.mlp.experts.j.X and model.layers.i.mlp.shared_experts.j.X read
  // model.layers.i.mlp.X (expert j: slice j mod G); the router (mlp.gate) and its bias keep
  // their initial values.
  static const std::regex expert(
      R"(^(model\.layers\.\d+\.mlp\.)(shared_)?experts\.(\d+)\.(\w+)\.weight$)");
  static const std::regex router(
      R"(^model\.layers\.\d+\.mlp\.gate\.(weight|e_score_correction_bias|tid2eid)$)");
  load_mapped(
      model, file, path,
      [&](const std::string& name) -> SourceSlice {
        std::smatch m;
        if (!std::regex_match(name, m, expert))
          return SourceSlice{std::regex_match(name, router) ? "" : name};
        const bool shared = m[2].matched;
        const int64_t g = shared ? plan.shared_granularity : G;
        const int64_t width = I / g, slice = std::stoll(m[3].str()) % g;
        const std::string matrix = m[4].str();
        SourceSlice s{m[1].str() + matrix + ".weight"};
        if (g > 1) {  // gate/up [I, H]: rows; down [H, I]: columns
          s.dim = matrix == "down_proj" ? 1 : 0;
          s.start = slice * width;
          s.length = width;
        }
        if (matrix == "down_proj") s.scale = shared ? plan.shared_scale : plan.routed_scale;
        return s;
      },
      [](const std::string&) { return false; },
      "upcycling needs the dense model of the same size: the same hidden_size, "
      "num_hidden_layers, vocab_size and heads");

  // Virtual groups (He et al. 2024): experts jG .. jG+G-1 hold the G slices and share one
  // router row, so a token choosing k = a multiple of G experts chooses whole groups.
  if (G > 1) {
    torch::NoGradGuard no_grad;
    static const std::regex gate(R"(^model\.layers\.\d+\.mlp\.gate\.weight$)");
    for (auto& item : model->named_parameters())
      if (std::regex_match(item.key(), gate))
        for (int64_t e = 0; e < E; ++e)
          if (e % G != 0) item.value()[e].copy_(item.value()[e - e % G]);  // [E, H]
  }
  return plan;
}

double upcycled_output_gap(MiniMindForCausalLM& moe, const std::string& dense_path) {
  // The dense twin: the same sizes without experts (its feed-forward is intermediate_size
  // wide, the width the upcycled experts were cut from).
  ModelConfig dense_cfg = moe->config();
  const ModelConfig defaults;
  dense_cfg.use_moe = false;
  dense_cfg.router = defaults.router;
  dense_cfg.hash_layers = 0;
  dense_cfg.hash_table = defaults.hash_table;
  MiniMindForCausalLM dense(dense_cfg, moe->products());
  load_weights(dense, dense_path);

  torch::NoGradGuard no_grad;
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  torch::Tensor state;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    state = generator.get_state();
  }
  at::Generator probe_gen = at::detail::createCPUGenerator(20240917);
  const int64_t T = std::min<int64_t>(32, dense_cfg.max_position_embeddings);
  // Ids from 3 up: pad (0) would leave tokens out of the routers' counts, not their outputs.
  const torch::Tensor ids =
      torch::randint(std::min<int64_t>(3, dense_cfg.vocab_size - 1), dense_cfg.vocab_size, {4, T},
                     probe_gen, torch::kLong);  // [4, T]
  const bool was_training = moe->is_training();
  moe->eval();
  dense->eval();
  const torch::Tensor a = moe->forward(ids).logits;    // [4, T, V]
  const torch::Tensor b = dense->forward(ids).logits;  // [4, T, V]
  if (was_training) moe->train();
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  }
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-30);
}

int64_t drop_upcycle(MiniMindForCausalLM& model, double ratio) {
  // The experts' matrices by "model.layers.L.mlp.experts.E.".
  static const std::regex expert(R"(^(model\.layers\.\d+\.mlp\.experts\.\d+\.)(\w+)\.weight$)");
  std::map<std::string, std::map<std::string, torch::Tensor>> experts;
  for (auto& item : model->named_parameters()) {
    std::smatch m;
    if (std::regex_match(item.key(), m, expert)) experts[m[1].str()][m[2].str()] = item.value();
  }
  torch::NoGradGuard no_grad;
  int64_t redrawn = 0;
  auto redraw = [](torch::Tensor w, int64_t dim, const torch::Tensor& idx) {
    std::vector<int64_t> shape = w.sizes().vec();
    shape[static_cast<size_t>(dim)] = idx.size(0);
    const double mean = w.mean().item<double>(), std = w.std().item<double>();
    w.index_copy_(dim, idx, torch::randn(shape, w.options()) * std + mean);
  };
  for (auto& [prefix, m] : experts) {
    torch::Tensor gate = m.at("gate_proj"), up = m.at("up_proj"), down = m.at("down_proj");
    const int64_t I = gate.size(0);  // gate/up [I, H], down [H, I]
    const auto k = static_cast<int64_t>(std::llround(ratio * static_cast<double>(I)));
    redrawn = k;
    if (k == 0) continue;
    const torch::Tensor idx = torch::randperm(I, torch::kLong).narrow(0, 0, k);  // [k]
    redraw(gate, 0, idx);
    redraw(up, 0, idx);
    redraw(down, 1, idx);
  }
  return redrawn;
}

}  // namespace minimind
