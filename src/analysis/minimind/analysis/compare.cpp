#include "minimind/analysis/compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "minimind/analysis/charts.h"
#include "minimind/analysis/report.h"
#include "minimind/error.h"
#include "minimind/util/atomic_file.h"

namespace minimind {
namespace {

std::string run_name(const std::string& dir) {
  std::filesystem::path p(dir);
  if (!p.has_filename()) p = p.parent_path();  // "runs/a/"
  return p.filename().string();
}

// The runs' names and colours, as an HTML legend (the charts have too many lines for one).
std::string run_legend(const std::vector<RunSummary>& runs) {
  std::string html = "<p class=\"runs\">";
  for (size_t i = 0; i < runs.size(); ++i)
    html += fmt::format(
        "<span><svg width=\"14\" height=\"4\"><rect width=\"14\" height=\"4\" "
        "fill=\"{}\"/></svg> {}</span> ",
        series_color(i), esc(runs[i].name));
  return html + "</p>\n";
}

std::string fixed(const std::optional<double>& v, const char* format) {
  return v ? fmt::format(fmt::runtime(format), *v) : "—";
}

std::string table(const std::vector<RunSummary>& runs, size_t layers) {
  std::string html = "<table><tr><th>run</th><th>steps</th><th>val loss</th><th>ppl</th>";
  for (size_t l = 0; l < layers; ++l)
    html += fmt::format("<th>MaxVio<sub>global</sub> L{}</th>", l);
  html +=
      "<th>dead experts (per layer)</th><th>MI (per layer)</th><th>dropped</th>"
      "<th>tokens/s</th></tr>";
  for (const RunSummary& r : runs) {
    html += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td>", esc(r.name), r.steps,
                        fixed(r.val_loss, "{:.4f}"), fixed(r.val_ppl, "{:.1f}"));
    for (size_t l = 0; l < layers; ++l)
      html += "<td>" +
              (l < r.max_vio_global.size() ? fmt::format("{:.3f}", r.max_vio_global[l])
                                           : std::string("—")) +
              "</td>";
    std::string dead;
    for (int64_t d : r.dead) dead += (dead.empty() ? "" : " / ") + std::to_string(d);
    // Routing information: "—" for routers without probabilities and runs logged before it.
    std::string mi;
    for (const auto& v : r.mi) mi += (mi.empty() ? "" : " / ") + fixed(v, "{:.3f}");
    html +=
        fmt::format("<td>{}</td><td>{}</td><td>{}</td><td>{:.0f}</td><td>{}</td><td>{}</td></tr>",
                    dead.empty() ? "—" : dead, mi.empty() ? "—" : mi,
                    r.dropped ? fmt::format("{:.1f} %", 100 * *r.dropped) : "—", r.tok_per_s,
                    r.tokens, fixed(r.flops, "{:.3g}"));
  }
  return html + "</table>\n";
}

}  // namespace

RunSummary summarize_run(const RunLogs& logs) {
  RunSummary s;
  s.name = run_name(logs.run_dir);
  s.steps = logs.last_step();
  if (!logs.eval.empty())
    s.val_loss = logs.eval.back().val_loss, s.val_ppl = logs.eval.back().val_ppl;
  for (const auto& [layer, records] : logs.eval_load) {
    if (records.empty()) continue;
    s.max_vio_global.push_back(records.back().max_vio);
    s.dead.push_back(records.back().dead);
    s.mi.push_back(records.back().mi);
  }
  if (!logs.train.empty()) {
    const TrainRecord& last = logs.train.back();
    s.dropped = last.dropped;
    if (last.elapsed > 0) s.tok_per_s = static_cast<double>(last.tokens) / last.elapsed;
  }
  if (!logs.eval.empty()) {
    const Upstream up = upstream_of(logs);
    s.tokens = up.tokens + logs.eval.back().tokens;
    if (logs.eval.back().flops) s.flops = up.flops + *logs.eval.back().flops;
  }
  return s;
}

Upstream upstream_of(const RunLogs& logs) {
  Upstream u;
  if (logs.init) {
    u.tokens = logs.init->source_tokens.value_or(0);
    u.flops = logs.init->source_flops.value_or(0);
  }
  return u;
}

std::vector<std::string> run_labels(const std::vector<std::string>& run_dirs) {
  // Each path as its components, from the leaf up (absolute, so "runs/a" and "./runs/a/"
  // are the same run).
  std::vector<std::vector<std::string>> parts;
  for (const std::string& dir : run_dirs) {
    std::filesystem::path p = std::filesystem::absolute(dir).lexically_normal();
    if (!p.has_filename()) p = p.parent_path();
    std::vector<std::string> up;
    for (; p.has_filename(); p = p.parent_path()) up.push_back(p.filename().string());
    parts.push_back(up);
  }
  auto suffix = [&](size_t i, size_t k) {
    std::string s;
    for (size_t c = std::min(k, parts[i].size()); c-- > 0;) s += parts[i][c] + (c > 0 ? "/" : "");
    return s;
  };
  std::vector<std::string> labels;
  for (size_t i = 0; i < parts.size(); ++i) {
    size_t k = 1;
    for (; k < parts[i].size(); ++k) {
      bool distinct = true;
      for (size_t j = 0; j < parts.size() && distinct; ++j)
        distinct = j == i || parts[j] == parts[i] || suffix(i, k) != suffix(j, k);
      if (distinct) break;
    }
    labels.push_back(suffix(i, k));
  }
  // The same directory given twice keeps its name, numbered.
  for (size_t i = 0; i < labels.size(); ++i)
    for (size_t j = i + 1; j < labels.size(); ++j)
      if (labels[j] == labels[i]) labels[j] += " (" + std::to_string(j + 1) + ")";
  return labels;
}

std::string render_compare(const std::vector<RunLogs>& runs) {
  if (runs.size() < 2) throw DataError("--compare needs at least two run directories");
  std::vector<std::string> dirs;
  for (const RunLogs& r : runs) dirs.push_back(r.run_dir);
  const std::vector<std::string> labels = run_labels(dirs);
  std::vector<RunSummary> summaries;
  int64_t last_step = 0;
  size_t layers = 0;
  for (const RunLogs& r : runs) {
    summaries.push_back(summarize_run(r));
    summaries.back().name = labels[summaries.size() - 1];
    last_step = std::max(last_step, r.last_step());
    layers = std::max(layers, r.train_load.size());
  }
  const StepAxis axis(static_cast<double>(last_step));

  std::string html = page_head("minimind-cpp: " + std::to_string(runs.size()) + " runs compared");
  html += fmt::format("<h1>{} runs compared</h1>\n", runs.size());
  html += run_legend(summaries);
  html += "<h2>Final figures</h2><div class=\"scroll\">" + table(summaries, layers) +
          "</div><p class=\"note\">val loss and ppl: the last evaluation of the held-out split; "
          "MaxVio<sub>global</sub> and dead experts: that evaluation's expert counts over the "
          "whole split; dropped: the last log interval; tokens/s: training throughput over the "
          "run (evaluations excluded).</p>\n";

  std::vector<Series> val, train;
  for (size_t i = 0; i < runs.size(); ++i) {
    Series v{summaries[i].name, series_color(i), {}}, t{summaries[i].name, series_color(i), {}};
    for (const auto& e : runs[i].eval) v.points.emplace_back(e.step, e.val_loss);
    for (const auto& p : runs[i].train) t.points.emplace_back(p.step, p.lm_loss);
    val.push_back(std::move(v));
    train.push_back(std::move(t));
  }
  html +=
      "<h2>Loss</h2><div class=\"grid\">" + line_chart("Validation loss", val, {}, axis, false) +
      line_chart("Training LM loss (interval mean, without aux and z)", train, {}, axis, false) +
      "</div>\n";

  // At equal data and equal compute: each run's x counts the training of the weights it
  // started from (train.init_from) too, so a run continued from another lines up after it.
  std::vector<Series> by_tokens, by_flops;
  double max_tokens = 0, max_flops = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const Upstream up = upstream_of(runs[i]);
    Series t{summaries[i].name, series_color(i), {}}, f{summaries[i].name, series_color(i), {}};
    for (const auto& e : runs[i].eval) {
      const double tokens = static_cast<double>(up.tokens + e.tokens);
      t.points.emplace_back(tokens, e.val_loss);
      max_tokens = std::max(max_tokens, tokens);
      if (!e.flops) continue;
      f.points.emplace_back(up.flops + *e.flops, e.val_loss);
      max_flops = std::max(max_flops, up.flops + *e.flops);
    }
    by_tokens.push_back(std::move(t));
    if (!f.points.empty()) by_flops.push_back(std::move(f));
  }
  html += "<h2>Loss at equal data and compute</h2><div class=\"grid\">" +
          line_chart("Validation loss against training tokens", by_tokens, {},
                     StepAxis(max_tokens, "tokens"), false);
  if (!by_flops.empty())
    html += line_chart("Validation loss against training FLOPs", by_flops, {},
                       StepAxis(max_flops, "FLOPs"), false);
  html +=
      "</div><p class=\"note\">A run started from another's weights (train.init_from) counts "
      "the tokens and FLOPs that trained them. FLOPs: 6 per weight a token passes through "
      "and the attention products (docs/upcycling.md).</p>\n";

  for (size_t layer = 0; layer < layers; ++layer) {
    std::vector<Series> maxvio, entropy;
    for (size_t i = 0; i < runs.size(); ++i) {
      const auto it = runs[i].train_load.find(static_cast<int64_t>(layer));
      if (it == runs[i].train_load.end()) continue;
      maxvio.push_back(load_series(
          it->second, [](const LoadRecord& r) { return std::optional<double>(r.max_vio); },
          summaries[i].name, series_color(i)));
      entropy.push_back(load_series(
          it->second, [](const LoadRecord& r) { return std::optional<double>(r.entropy); },
          summaries[i].name, series_color(i)));
    }
    html += fmt::format("<h2>MoE layer {}</h2><div class=\"grid\">", layer) +
            line_chart(fmt::format("Layer {}: MaxVio per step (0 = balanced)", layer), maxvio, {},
                       axis, false) +
            line_chart(fmt::format("Layer {}: normalised routing entropy (1 = balanced)", layer),
                       entropy, {}, axis, false) +
            "</div>\n";
  }
  return html + "</body></html>\n";
}

void write_compare(const std::vector<std::string>& run_dirs, const std::string& out_path) {
  std::vector<RunLogs> runs;
  for (const auto& dir : run_dirs) runs.push_back(read_run_logs(dir));
  write_file_atomic(out_path, render_compare(runs));
}

}  // namespace minimind
