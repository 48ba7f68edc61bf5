#include "minimind/run/optimizer_state.h"

#include <map>

#include "minimind/error.h"
#include "minimind/model/weights_io.h"

namespace minimind {
namespace {

// AdamW keys its per-parameter state by the parameter's TensorImpl address, as a string.
std::string state_key(const torch::Tensor& p) {
  return c10::guts::to_string(p.unsafeGetTensorImpl());
}

const std::vector<torch::Tensor>& parameters(torch::optim::AdamW& optimizer) {
  if (optimizer.param_groups().size() != 1)
    throw CheckpointError("internal: the optimizer should hold one parameter group");
  return optimizer.param_groups()[0].params();
}

std::string damaged(const std::string& file, const std::string& what) {
  return "optimizer state '" + file + "' " + what;
}

}  // namespace

std::vector<ParamState> optimizer_states(torch::optim::AdamW& optimizer) {
  const auto& params = parameters(optimizer);
  std::vector<ParamState> out(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto it = optimizer.state().find(state_key(params[i]));
    if (it == optimizer.state().end()) continue;
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    out[i] = {s.step(), s.exp_avg(), s.exp_avg_sq()};
  }
  return out;
}

std::vector<char> optimizer_state_bytes(const std::vector<ParamState>& states) {
  c10::Dict<std::string, torch::Tensor> dict;
  for (size_t i = 0; i < states.size(); ++i) {
    const ParamState& s = states[i];
    if (s.step < 0) continue;
    const std::string prefix = std::to_string(i) + ".";
    dict.insert(prefix + "step", torch::tensor(s.step, torch::kInt64));
    dict.insert(prefix + "exp_avg", s.exp_avg.contiguous());
    dict.insert(prefix + "exp_avg_sq", s.exp_avg_sq.contiguous());
  }
  return torch::pickle_save(c10::IValue(dict));
}

std::vector<char> optimizer_state_bytes(torch::optim::AdamW& optimizer) {
  return optimizer_state_bytes(optimizer_states(optimizer));
}

void load_optimizer_state(torch::optim::AdamW& optimizer, const std::string& file,
                          int format_version, const std::vector<int64_t>& whole_index,
                          int64_t whole_count) {
  const char* hint = "the checkpoint is damaged; delete it to resume from the one before";
  if (format_version == 1) {
    try {
      torch::load(optimizer, file);
    } catch (const std::exception& e) {
      throw CheckpointError(damaged(file, "is unreadable: " + first_line(e.what(), 200)), hint);
    }
    return;
  }
  std::map<std::string, torch::Tensor> entries;
  for (auto& [name, t] : read_tensor_dict(file)) entries[name] = t;

  // Check everything before touching the optimizer: a damaged file changes nothing.
  const auto& params = parameters(optimizer);
  std::vector<std::unique_ptr<torch::optim::AdamWParamState>> states(params.size());
  if (!whole_index.empty() && whole_index.size() != params.size())
    throw CheckpointError("internal: a whole-model index per optimizer parameter expected");
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t at = whole_index.empty() ? static_cast<int64_t>(i) : whole_index[i];
    const std::string prefix = std::to_string(at) + ".";
    const auto step = entries.find(prefix + "step");
    if (step == entries.end()) continue;  // no state yet for this parameter
    const torch::Tensor& s = step->second;
    if (s.dim() != 0 || s.scalar_type() != torch::kInt64 || s.item<int64_t>() < 0)
      throw CheckpointError(damaged(file, "entry '" + prefix + "step' is not a step count"), hint);
    // Takes a moment's entry out of `entries`, checked against the parameter.
    auto moment = [&](const std::string& name) {
      const auto it = entries.find(prefix + name);
      if (it == entries.end())
        throw CheckpointError(damaged(file, "has no entry '" + prefix + name + "'"), hint);
      if (it->second.sizes() != params[i].sizes() ||
          it->second.scalar_type() != params[i].scalar_type())
        throw CheckpointError(
            damaged(file,
                    "entry '" + prefix + name + "' has shape " + c10::str(it->second.sizes()) +
                        " " + c10::toString(it->second.scalar_type()) + "; the parameter is " +
                        c10::str(params[i].sizes()) + " " + c10::toString(params[i].scalar_type())),
            hint);
      // A copy of its own: the pickle's storage is shared by every tensor read from it.
      torch::Tensor value = it->second.clone();
      entries.erase(it);
      return value;
    };
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->step(s.item<int64_t>());
    state->exp_avg(moment("exp_avg"));
    state->exp_avg_sq(moment("exp_avg_sq"));
    entries.erase(step);
    states[i] = std::move(state);
  }
  // Other ranks' experts: entries of whole-model indices this optimizer does not hold.
  if (!whole_index.empty())
    for (auto it = entries.begin(); it != entries.end();) {
      const std::string& name = it->first;
      const size_t dot = name.find('.');
      const std::string index = name.substr(0, dot);
      const bool number = !index.empty() && index.size() < 18 &&
                          index.find_first_not_of("0123456789") == std::string::npos;
      if (number && std::stoll(index) < whole_count) {
        it = entries.erase(it);
      } else {
        ++it;
      }
    }
  if (!entries.empty())
    throw CheckpointError(damaged(file, "has entry '" + entries.begin()->first +
                                            "', which fits no parameter of this model"),
                          hint);

  optimizer.state().clear();
  for (size_t i = 0; i < params.size(); ++i)
    if (states[i]) optimizer.state()[state_key(params[i])] = std::move(states[i]);
}

}  // namespace minimind
