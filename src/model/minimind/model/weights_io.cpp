#include "minimind/model/weights_io.h"

#include <caffe2/serialize/inline_container.h>
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
    dict.insert(name, t.detach().to(dtype).contiguous().clone());
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
  explicit BoundedBytes(std::vector<char> bytes) : bytes_(std::move(bytes)) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<uint64_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  std::vector<char> bytes_;
};

}  // namespace

c10::IValue read_pickle(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw WeightsError("cannot read '" + path + "' (missing file?)");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // LibTorch's reader does not check the entries' CRCs: a damaged block would load as
  // whatever its bytes read as (NaN weights, say).
  if (const std::string damage = zip_damage(std::string_view(bytes.data(), bytes.size()));
      !damage.empty())
    throw WeightsError("'" + path + "' is damaged: " + damage,
                       "restore it from a copy, or use the checkpoint before it");
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

// Loads the file's tensors into the model, each model tensor from the file's tensor
// `source_of(name)` names ("" : it keeps its value); the names and shapes are checked first
// and the first mismatches listed. `unused_ok(file_name)`: a file tensor no model tensor
// reads that is not an error.
void load_mapped(MiniMindForCausalLM& model, const std::string& path,
                 const std::function<std::string(const std::string&)>& source_of,
                 const std::function<bool(const std::string&)>& unused_ok,
                 const std::string& hint) {
  std::map<std::string, torch::Tensor> file;
  for (auto& [name, t] : read_tensor_dict(path)) file[name] = t;

  std::vector<std::string> problems;
  std::map<std::string, torch::Tensor> expected;
  for (const auto& [name, t] : state_dict(model)) expected[name] = t;
  std::set<std::string> read;
  for (const auto& [name, t] : expected) {
    const std::string from = source_of(name);
    if (from.empty()) continue;
    read.insert(from);
    const std::string shown = from == name ? name : name + " (from " + from + ")";
    auto it = file.find(from);
    if (it == file.end()) {
      problems.push_back("missing " + from + " " + c10::str(t.sizes()) +
                         (from == name ? "" : " for " + name));
    } else if (it->second.sizes() != t.sizes()) {
      problems.push_back("shape of " + shown + ": file " + c10::str(it->second.sizes()) +
                         ", model " + c10::str(t.sizes()));
    } else if (!it->second.is_floating_point()) {
      problems.push_back(from + " is not a floating-point tensor");
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
  for (auto& item : model->named_parameters())
    if (const std::string from = source_of(item.key()); !from.empty())
      item.value().copy_(file.at(from).to(item.value().scalar_type()));
  for (auto& item : model->named_buffers())
    if (const std::string from = source_of(item.key()); !from.empty())
      item.value().copy_(file.at(from).to(item.value().scalar_type()));
}

}  // namespace

void load_weights(MiniMindForCausalLM& model, const std::string& path) {
  std::set<std::string> elsewhere;  // other ranks' experts: in the file, not loaded here
  for (const ParamSlot& p : full_parameters(model))
    if (!p.local.defined()) elsewhere.insert(p.name);
  load_mapped(
      model, path, [](const std::string& name) { return name; },
      [&](const std::string& name) { return elsewhere.count(name) > 0; },
      "check model.hidden_size, num_hidden_layers, use_moe, num_experts, n_shared_experts, "
      "router and router_bias_update_rate against the checkpoint's config.");
}

void load_weights_upcycled(MiniMindForCausalLM& model, const std::string& path) {
  for (const auto& [name, t] : read_tensor_dict(path))
    if (name.find(".mlp.experts.") != std::string::npos)
      throw WeightsError("weights in '" + path + "' hold experts (" + name +
                             "): upcycling starts from a dense model",
                         "train.init_mode: upcycle takes a dense run's weights; to start an MoE "
                         "from an MoE, use train.init_mode: copy");
  // model.layers.i.mlp.experts.j.X and model.layers.i.mlp.shared_experts.j.X read
  // model.layers.i.mlp.X; the router (mlp.gate) and its bias keep their initial values.
  static const std::regex expert(R"(^(model\.layers\.\d+\.mlp\.)(shared_)?experts\.\d+\.(.+)$)");
  static const std::regex router(
      R"(^model\.layers\.\d+\.mlp\.(gate\.weight|e_score_correction_bias)$)");
  load_mapped(
      model, path,
      [](const std::string& name) -> std::string {
        std::smatch m;
        if (std::regex_match(name, m, expert)) return m[1].str() + m[3].str();
        return std::regex_match(name, router) ? "" : name;
      },
      [](const std::string&) { return false; },
      "upcycling needs the dense model of the same size: the same hidden_size, "
      "num_hidden_layers, vocab_size and heads, and moe_intermediate_size equal to its "
      "intermediate_size (fine-grained experts are not partitioned)");
}

void drop_upcycle(MiniMindForCausalLM& model, double ratio) {
  // The experts' matrices by "model.layers.L.mlp.experts.E.".
  static const std::regex expert(R"(^(model\.layers\.\d+\.mlp\.experts\.\d+\.)(\w+)\.weight$)");
  std::map<std::string, std::map<std::string, torch::Tensor>> experts;
  for (auto& item : model->named_parameters()) {
    std::smatch m;
    if (std::regex_match(item.key(), m, expert)) experts[m[1].str()][m[2].str()] = item.value();
  }
  torch::NoGradGuard no_grad;
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
    if (k == 0) continue;
    const torch::Tensor idx = torch::randperm(I, torch::kLong).narrow(0, 0, k);  // [k]
    redraw(gate, 0, idx);
    redraw(up, 0, idx);
    redraw(down, 1, idx);
  }
}

}  // namespace minimind
