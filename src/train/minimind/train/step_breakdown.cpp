#include "minimind/train/step_breakdown.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <array>
#include <map>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include "minimind/util/step_part.h"

namespace minimind {

namespace {

// The rows, in the order printed. The first kStepParts follow StepPart (step's row is
// "other ops": ops inside the step and no other part).
enum Row : int {
  kBookkeeping = kStepParts,
  kAllocation,
  kBetweenOps,
  kIdle,
  kRows,
};
constexpr std::array<const char*, kRows> kRowNames = {"other ops",
                                                      "products forward",
                                                      "products backward, by input",
                                                      "products backward, by weight",
                                                      "attention",
                                                      "norms",
                                                      "activations",
                                                      "RoPE",
                                                      "routing",
                                                      "dispatch",
                                                      "embedding",
                                                      "loss",
                                                      "optimizer",
                                                      "bf16 casts",
                                                      "waiting",
                                                      "autograd bookkeeping",
                                                      "allocation",
                                                      "between ops",
                                                      "idle cores"};
// The printed order: products first, the overheads last.
constexpr std::array<int, kRows> kOrder = {int(StepPart::product_forward),
                                           int(StepPart::product_grad_input),
                                           int(StepPart::product_grad_weight),
                                           int(StepPart::attention),
                                           int(StepPart::norm),
                                           int(StepPart::activation),
                                           int(StepPart::rope),
                                           int(StepPart::routing),
                                           int(StepPart::dispatch),
                                           int(StepPart::embedding),
                                           int(StepPart::loss),
                                           int(StepPart::optimizer),
                                           int(StepPart::cast),
                                           kBookkeeping,
                                           kAllocation,
                                           int(StepPart::step),
                                           kBetweenOps,
                                           int(StepPart::wait),
                                           kIdle};

// A StepScope's part from its name, or -1.
int part_of_scope(const std::string& name) {
  for (int p = 0; p < kStepParts; ++p)
    if (name == step_part_scope(static_cast<StepPart>(p))) return p;
  return -1;
}

bool is_allocation(const std::string& name) {
  return name == "aten::empty" || name == "aten::empty_strided" || name == "aten::empty_like" ||
         name == "aten::resize_";
}

// ATen's products: inside a product's backward node (MmBackward0: by the input first, then by
// the weight) the first is by the input, the next by the weight.
bool is_product_op(const std::string& name) {
  return name == "aten::mm" || name == "aten::bmm" || name == "aten::addmm" ||
         name == "aten::matmul";
}

bool is_engine_wrapper(const std::string& name) {
  return name.rfind("autograd::engine::evaluate_function", 0) == 0;
}

}  // namespace

StepBreakdown break_down_step(const std::vector<ProfiledSpan>& spans, int cores) {
  // The step: the longest "minimind::step" scope; its thread is the step's own.
  const ProfiledSpan* step = nullptr;
  for (const auto& s : spans)
    if (s.user_scope && s.name == step_part_scope(StepPart::step) &&
        (!step || s.end_us - s.start_us > step->end_us - step->start_us))
      step = &s;
  if (!step) throw std::runtime_error("break_down_step: no minimind::step scope was recorded");
  const double t0 = step->start_us, t1 = step->end_us, wall = t1 - t0;

  // Spans inside the step's window, by start (the outer of two that start together first);
  // forward ops come before the backward nodes they made.
  std::vector<const ProfiledSpan*> order;
  for (const auto& s : spans)
    if (s.start_us >= t0 && s.end_us <= t1) order.push_back(&s);
  std::stable_sort(order.begin(), order.end(), [](const ProfiledSpan* a, const ProfiledSpan* b) {
    return a->start_us != b->start_us ? a->start_us < b->start_us : a->end_us > b->end_us;
  });

  struct Open {
    const ProfiledSpan* span;
    int context;       // the row an op inside it goes to
    int self_row;      // the row its own exclusive time goes to
    double covered;    // time of the spans directly inside it
    int products = 0;  // a product's backward node: the products seen directly inside
  };
  std::unordered_map<uint64_t, std::vector<Open>> stacks;  // per thread
  std::map<std::pair<int64_t, uint64_t>, int> made_by;     // (seq, thread) -> forward op's row
  std::array<double, kRows> us{};
  double busy = 0;  // core time in some root span
  auto close = [&](std::vector<Open>& stack) {
    const Open o = stack.back();
    stack.pop_back();
    const double d = o.span->end_us - o.span->start_us;
    us[static_cast<size_t>(o.self_row)] += std::max(0.0, d - o.covered);
    if (stack.empty())
      busy += d;
    else
      stack.back().covered += d;
  };
  for (const ProfiledSpan* s : order) {
    auto& stack = stacks[s->thread];
    while (!stack.empty() && stack.back().span->end_us <= s->start_us) close(stack);
    const int outer = stack.empty() ? int(StepPart::step) : stack.back().context;
    int context = outer, self_row = outer;
    if (s->user_scope) {
      const int part = part_of_scope(s->name);
      context = part >= 0 ? part : outer;
      // The step's own time outside ops (and a helper thread's, in an inherited step).
      self_row = context == int(StepPart::step) ? kBetweenOps : context;
    } else if (s->backward_node) {
      if (s->name == "torch::autograd::AccumulateGrad") {
        context = kBookkeeping;
      } else {
        const auto it = made_by.find({s->seq, s->fwd_thread});
        if (it != made_by.end()) context = it->second;
        if (context == int(StepPart::product_forward)) context = int(StepPart::product_grad_input);
      }
      self_row = kBookkeeping;
    } else if (is_engine_wrapper(s->name)) {
      self_row = kBookkeeping;
    } else {
      if (s->seq >= 0) made_by.emplace(std::make_pair(s->seq, s->thread), outer);
      Open* node = stack.empty() ? nullptr : &stack.back();
      if (node && node->span->backward_node && node->context == int(StepPart::product_grad_input) &&
          is_product_op(s->name) && node->products++ > 0)
        context = self_row = int(StepPart::product_grad_weight);
      if (is_allocation(s->name)) self_row = kAllocation;
    }
    stack.push_back({s, context, self_row, 0.0});
  }
  for (auto& [thread, stack] : stacks)
    while (!stack.empty()) close(stack);

  StepBreakdown b;
  b.step_ms = wall / 1e3;
  b.cores = std::max(1, cores);
  us[kIdle] = std::max(0.0, b.cores * wall - busy);
  for (const int r : kOrder)
    b.rows.emplace_back(kRowNames[static_cast<size_t>(r)],
                        us[static_cast<size_t>(r)] / 1e3 / b.cores);
  return b;
}

StepBreakdown mean_breakdown(const std::vector<StepBreakdown>& steps) {
  if (steps.empty()) throw std::invalid_argument("mean_breakdown: no steps");
  StepBreakdown m = steps[0];
  for (size_t i = 1; i < steps.size(); ++i) {
    m.step_ms += steps[i].step_ms;
    for (size_t r = 0; r < m.rows.size(); ++r) m.rows[r].second += steps[i].rows.at(r).second;
  }
  const double n = static_cast<double>(steps.size());
  m.step_ms /= n;
  for (auto& row : m.rows) row.second /= n;
  return m;
}

StepRecorder::StepRecorder() {
  using torch::profiler::impl::ProfilerConfig;
  using torch::profiler::impl::ProfilerState;
  torch::autograd::profiler::enableProfilerLegacy(ProfilerConfig(ProfilerState::CPU));
  on_ = true;
}

StepRecorder::~StepRecorder() {
  if (on_) torch::autograd::profiler::disableProfilerLegacy();
}

std::vector<ProfiledSpan> StepRecorder::finish() {
  using torch::autograd::profiler::EventKind;
  using torch::autograd::profiler::LegacyEvent;
  if (!on_) throw std::logic_error("StepRecorder::finish: called twice");
  const auto lists = torch::autograd::profiler::disableProfilerLegacy();
  on_ = false;
  // A range is a push and a pop with the same handle (not always on the same list).
  std::unordered_map<uint64_t, const LegacyEvent*> pushed;
  for (const auto& list : lists)
    for (const auto& e : list)
      if (e.kind() == EventKind::PushRange) pushed[e.handle()] = &e;
  std::vector<ProfiledSpan> spans;
  for (const auto& list : lists)
    for (const auto& e : list) {
      if (e.kind() != EventKind::PopRange) continue;
      const auto it = pushed.find(e.handle());
      if (it == pushed.end()) continue;
      const LegacyEvent& p = *it->second;
      ProfiledSpan s;
      s.name = p.name();
      s.thread = p.threadId();
      s.start_us = p.cpuUs();
      s.end_us = e.cpuUs();
      s.seq = p.sequenceNr();
      s.fwd_thread = p.fwdThreadId();
      s.backward_node = p.scope() == static_cast<uint8_t>(at::RecordScope::BACKWARD_FUNCTION);
      s.user_scope = p.scope() == static_cast<uint8_t>(at::RecordScope::USER_SCOPE);
      spans.push_back(std::move(s));
    }
  return spans;
}

std::string format_breakdown(const StepBreakdown& b) {
  std::string out =
      fmt::format("| part of the step ({:.1f} ms, {} core{}) | ms | share |\n|---|---:|---:|\n",
                  b.step_ms, b.cores, b.cores == 1 ? "" : "s");
  double sum = 0;
  for (const auto& [name, ms] : b.rows) {
    out += fmt::format("| {} | {:.2f} | {:.1f} % |\n", name, ms, 100 * ms / b.step_ms);
    sum += ms;
  }
  out += fmt::format("| **sum** | {:.2f} | {:.1f} % |\n", sum, 100 * sum / b.step_ms);
  return out;
}

nlohmann::json breakdown_json(const StepBreakdown& b) {
  nlohmann::json rows = nlohmann::json::object();
  for (const auto& [name, ms] : b.rows) rows[name] = ms;
  return {{"step_ms", b.step_ms}, {"cores", b.cores}, {"ms", rows}};
}

double ProductsAlone::alone_ms() const {
  double sum = 0;
  for (const Row& r : rows) sum += r.alone_ms;
  return sum;
}

double ProductsAlone::gflop() const {
  double sum = 0;
  for (const Row& r : rows) sum += r.gflop;
  return sum;
}

double ProductsAlone::step_ms_at_lone_speed(const StepBreakdown& b) const {
  double saved = 0;
  for (const Row& r : rows)
    if (r.step_ms >= 0) saved += r.step_ms - r.alone_ms;
  return b.step_ms - saved;
}

ProductsAlone time_products_alone(const std::map<ProductShape, ProductTally>& tallies, int steps,
                                  const StepBreakdown& b) {
  if (steps < 1) throw std::invalid_argument("time_products_alone: steps >= 1");
  ProductsAlone p;
  p.cores = b.cores;
  auto step_row = [&](const char* name) {
    for (const auto& [row, ms] : b.rows)
      if (row == name) return ms;
    return -1.0;
  };
  // The breakdown's product rows, attention's products (its row also holds the softmax),
  // and products in any other part.
  p.rows = {{"forward", step_row(kRowNames[static_cast<size_t>(StepPart::product_forward)])},
            {"backward, by input",
             step_row(kRowNames[static_cast<size_t>(StepPart::product_grad_input)])},
            {"backward, by weight",
             step_row(kRowNames[static_cast<size_t>(StepPart::product_grad_weight)])},
            {"attention's (in its row)", -1},
            {"elsewhere", -1}};
  std::map<std::tuple<StepPart, Precision, char, char, int64_t, int64_t>, size_t> family_of;
  for (const auto& [shape, tally] : tallies) {
    if (tally.count < 1) continue;
    const size_t row = shape.part == StepPart::product_forward       ? 0
                       : shape.part == StepPart::product_grad_input  ? 1
                       : shape.part == StepPart::product_grad_weight ? 2
                       : shape.part == StepPart::attention           ? 3
                                                                     : 4;
    const double per_step = static_cast<double>(tally.count) / steps;
    const double alone_ms = 1e3 * time_product_alone(shape) * per_step / p.cores;
    p.rows[row].alone_ms += alone_ms;
    p.rows[row].gflop += shape.flops() * per_step / 1e9;
    // The dimensions a family shares: all but the tokens' (none in attention's blocks).
    const auto fixed = row < 2    ? std::pair(shape.n, shape.k)
                       : row == 2 ? std::pair(shape.m, shape.n)
                                  : std::pair(int64_t{-1}, int64_t{-1});
    const auto key =
        std::tuple(shape.part, shape.precision, shape.ta, shape.tb, fixed.first, fixed.second);
    const auto [at, fresh] = family_of.try_emplace(key, p.families.size());
    if (fresh) {
      ProductsAlone::Family f;
      f.row = p.rows[row].name, f.precision = shape.precision, f.ta = shape.ta, f.tb = shape.tb;
      f.m = {shape.m, shape.m}, f.n = {shape.n, shape.n}, f.k = {shape.k, shape.k};
      p.families.push_back(f);
    }
    ProductsAlone::Family& f = p.families[at->second];
    for (const auto& [range, v] : {std::pair(&f.m, shape.m), {&f.n, shape.n}, {&f.k, shape.k}})
      (*range)[0] = std::min((*range)[0], v), (*range)[1] = std::max((*range)[1], v);
    f.per_step += per_step;
    f.step_ms += 1e3 * tally.seconds / steps / p.cores;
    f.alone_ms += alone_ms;
  }
  if (p.rows.back().gflop == 0) p.rows.pop_back();
  std::stable_sort(p.families.begin(), p.families.end(),
                   [](const auto& x, const auto& y) { return x.lost_ms() > y.lost_ms(); });
  return p;
}

std::string format_products_alone(const ProductsAlone& p, double peak_gflops) {
  auto per_core = [&](double gflop, double ms) {
    return ms > 0 ? gflop / (ms * p.cores / 1e3) : 0;
  };
  std::string out =
      "| products | in the step, ms | alone, ms | alone, GFLOP/s per core | of the peak |\n"
      "|---|---:|---:|---:|---:|\n";
  for (const auto& r : p.rows) {
    const double rate = per_core(r.gflop, r.alone_ms);
    out += fmt::format("| {} | {} | {:.2f} | {:.0f} | {:.1f} % |\n", r.name,
                       r.step_ms >= 0 ? fmt::format("{:.2f}", r.step_ms) : std::string("-"),
                       r.alone_ms, rate, 100 * rate / peak_gflops);
  }
  const double rate = per_core(p.gflop(), p.alone_ms());
  out += fmt::format("| **all** | | {:.2f} | {:.0f} | {:.1f} % |\n", p.alone_ms(), rate,
                     100 * rate / peak_gflops);
  return out;
}

std::string format_product_families(const ProductsAlone& p, size_t top) {
  auto dim = [](const std::array<int64_t, 2>& r) {
    return r[0] == r[1] ? std::to_string(r[0]) : fmt::format("{}-{}", r[0], r[1]);
  };
  // One call's mean time, in microseconds, from a family's ms a step.
  auto per_call = [&](const ProductsAlone::Family& f, double ms) {
    return f.per_step > 0 ? 1e3 * ms * p.cores / f.per_step : 0.0;
  };
  std::string out =
      "| product | op(a) @ op(b) | calls a step | in the step, us | alone, us | lost, ms a step "
      "|\n|---|---|---:|---:|---:|---:|\n";
  for (size_t i = 0; i < std::min(top, p.families.size()); ++i) {
    const ProductsAlone::Family& f = p.families[i];
    out +=
        fmt::format("| {} ({}) | [{}, {}]{} @ [{}, {}]{} | {:.1f} | {:.1f} | {:.1f} | {:.2f} |\n",
                    f.row, name_of(f.precision), dim(f.m), dim(f.k), f.ta == 'T' ? "^T" : "",
                    dim(f.k), dim(f.n), f.tb == 'T' ? "^T" : "", f.per_step, per_call(f, f.step_ms),
                    per_call(f, f.alone_ms), f.lost_ms());
  }
  return out;
}

nlohmann::json products_alone_json(const ProductsAlone& p) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : p.rows)
    rows.push_back({{"name", r.name},
                    {"step_ms", r.step_ms >= 0 ? nlohmann::json(r.step_ms) : nlohmann::json()},
                    {"alone_ms", r.alone_ms},
                    {"gflop", r.gflop}});
  nlohmann::json families = nlohmann::json::array();
  for (const auto& f : p.families)
    families.push_back({{"row", f.row},
                        {"precision", name_of(f.precision)},
                        {"ta", std::string(1, f.ta)},
                        {"tb", std::string(1, f.tb)},
                        {"m", f.m},
                        {"n", f.n},
                        {"k", f.k},
                        {"per_step", f.per_step},
                        {"step_ms", f.step_ms},
                        {"alone_ms", f.alone_ms},
                        {"lost_ms", f.lost_ms()}});
  return {{"cores", p.cores},
          {"alone_ms", p.alone_ms()},
          {"gflop", p.gflop()},
          {"rows", rows},
          {"families", families}};
}

}  // namespace minimind
