#include "minimind/analysis/routing_page.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "minimind/analysis/charts.h"
#include "minimind/error.h"
#include "minimind/util/input_file.h"

namespace minimind {
namespace {

// White (0) to dark blue (vmax).
std::string blue(double v, double vmax) {
  const double t = std::clamp(vmax > 0 ? v / vmax : 0.0, 0.0, 1.0);
  auto mix = [&](double a, double b) { return static_cast<int>(std::lround(a + (b - a) * t)); };
  return fmt::format("rgb({},{},{})", mix(247, 8), mix(251, 69), mix(255, 148));
}

// A matrix as a heatmap with the value in each cell; rows and columns labelled.
std::string matrix_heatmap(const std::string& title, const std::string& row_axis,
                           const std::string& col_axis, const std::vector<std::string>& rows,
                           const std::vector<std::string>& cols,
                           const std::vector<std::vector<double>>& v, double vmax) {
  const double cell = std::clamp(320.0 / std::max<size_t>(cols.size(), 1), 14.0, 48.0);
  const double L = 80, T = 44, W = L + cell * cols.size() + 16, H = T + cell * rows.size() + 30;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
      "class=\"matrix\"><text x=\"4\" y=\"16\" class=\"title\">{}</text>"
      "<text x=\"{:.0f}\" y=\"34\" class=\"tick\">{} →</text>",
      std::max(W, 8.0 * static_cast<double>(title.size()) + 8), H, esc(title), L, esc(col_axis));
  const bool labels = cell >= 36;  // room for "0.00" at 10 px
  for (size_t r = 0; r < rows.size(); ++r) {
    svg +=
        fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\" class=\"tick\" text-anchor=\"end\">{}</text>",
                    L - 4, T + (r + 0.65) * cell, esc(rows[r]));
    for (size_t c = 0; c < cols.size() && c < v[r].size(); ++c) {
      svg += fmt::format(
          "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\" "
          "stroke=\"#fff\"><title>{} {}, {} {}: {:.3f}</title></rect>",
          L + c * cell, T + r * cell, cell, cell, blue(v[r][c], vmax), esc(row_axis), esc(rows[r]),
          esc(col_axis), esc(cols[c]), v[r][c]);
      if (labels)
        svg += fmt::format(
            "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"cell\" text-anchor=\"middle\" fill=\"{}\">"
            "{:.2f}</text>",
            L + (c + 0.5) * cell, T + (r + 0.62) * cell, v[r][c] > 0.55 * vmax ? "#fff" : "#222",
            v[r][c]);
    }
  }
  for (size_t c = 0; c < cols.size(); ++c)
    svg += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"tick\" text-anchor=\"middle\">{}</text>",
        L + (c + 0.5) * cell, T + rows.size() * cell + 14, esc(cols[c]));
  svg += fmt::format("<text x=\"4\" y=\"{:.0f}\" class=\"tick\">{} ↓</text>", T - 2, esc(row_axis));
  return svg + "</svg>";
}

std::vector<std::string> expert_labels(int64_t E) {
  std::vector<std::string> out;
  for (int64_t e = 0; e < E; ++e) out.push_back("e" + std::to_string(e));
  return out;
}

std::string opt(const std::optional<double>& v, const char* unset = "too few tokens") {
  return v ? fmt::format("{:.3f}", *v) : std::string("<i>") + unset + "</i>";
}

std::string summary_table(const RoutingAnalysis& a) {
  std::string h = fmt::format(
      "<table><tr><th>layer</th><th>MI</th><th>H̄</th><th>H<sub>m</sub></th><th>confidence</th>"
      "<th>vocabulary specialisation</th><th>token ids counted (≥ {} times)</th>"
      "<th>repeat rate</th><th>chance</th></tr>",
      kMinOccurrences);
  for (const auto& l : a.layer) {
    const bool router = l.router.tokens > 0;
    h += fmt::format(
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{:.3f}</td><td>{:.3f}</td></tr>",
        l.layer, router ? fmt::format("{:.3f}", l.router.mi) : "–",
        router ? fmt::format("{:.3f}", l.router.token_entropy) : "–",
        router ? fmt::format("{:.3f}", l.router.marginal_entropy) : "–",
        router ? fmt::format("{:.3f}", l.router.confidence) : "–", opt(l.vocab_specialisation),
        l.vocab_counted, l.repeat_rate, l.repeat_chance);
  }
  h += "</table>";
  h += fmt::format(
      "<p class=\"note\">A router that ignores the token gives vocabulary specialisation ≈ k/E "
      "= {:.3f}, confidence k/E, MI 0 and a repeat rate at chance. {} tokens of {} documents"
      "{}.</p>",
      a.uniform, a.tokens, a.documents,
      a.domains.size() > 1 ? fmt::format(" in {} domains", a.domains.size()) : "");
  return h;
}

// Each token coloured by its top-1 expert, one row per layer; the probabilities in the
// tooltip.
std::string token_view(const RoutingAnalysis& a) {
  if (a.passages.empty()) return "";
  std::string h =
      "<h3>Token view</h3><p class=\"note\">Each token coloured by its top-1 expert, one row "
      "per layer (hover a token for the router's probabilities). Legend: ";
  for (int64_t e = 0; e < a.experts; ++e)
    h += fmt::format("<span class=\"tok\" style=\"background:{}\">e{}</span> ",
                     series_color(static_cast<size_t>(e)), e);
  if (a.experts > 12) h += "(colours repeat after 12 experts)";
  h += "</p>";
  for (size_t p = 0; p < a.passages.size(); ++p) {
    const TokenView& v = a.passages[p];
    h += "<div class=\"passage\">";
    for (size_t l = 0; l < v.top1.size(); ++l) {
      h += fmt::format("<div class=\"tokrow\"><span class=\"lname\">L{}</span>", l);
      for (size_t t = 0; t < v.pieces.size() && t < v.top1[l].size(); ++t) {
        const int64_t e = v.top1[l][t];
        std::string tip = fmt::format("layer {}: top-1 e{}", l, e);
        if (l < v.probs.size() && t < v.probs[l].size()) {
          tip += " |";
          for (size_t x = 0; x < v.probs[l][t].size(); ++x)
            tip += fmt::format(" e{} {:.2f}", x, v.probs[l][t][x]);
        }
        h += fmt::format("<span class=\"tok\" style=\"background:{}\" title=\"{}\">{}</span>",
                         series_color(static_cast<size_t>(e)), esc(tip), esc(v.pieces[t]));
      }
      h += "</div>";
    }
    h += "</div>";
  }
  return h;
}

std::string heatmaps(const RoutingAnalysis& a) {
  const std::vector<std::string> ex = expert_labels(a.experts);
  std::string h;
  for (const auto& l : a.layer) {
    if (!l.coactivation.empty())
      h += matrix_heatmap(fmt::format("Layer {}: co-activation P(b | a)", l.layer), "a", "b", ex,
                          ex, l.coactivation, 1.0);
    if (!l.flow.empty())
      h += matrix_heatmap(fmt::format("Layer {} → {}: top-1 flow", l.layer, l.layer + 1),
                          fmt::format("L{}", l.layer), fmt::format("L{}", l.layer + 1), ex, ex,
                          l.flow, 1.0);
  }
  std::string d;
  if (a.domains.size() > 1) {
    for (const auto& l : a.layer) {
      std::vector<std::vector<double>> m(a.domains.size());
      double vmax = a.uniform * 2;
      for (size_t di = 0; di < a.domains.size(); ++di)
        for (const auto& e : l.experts) {
          m[di].push_back(di < e.domain_share.size() ? e.domain_share[di] : 0.0);
          vmax = std::max(vmax, m[di].back());
        }
      d += matrix_heatmap(fmt::format("Layer {}: share of each domain's tokens (uniform {:.2f})",
                                      l.layer, a.uniform),
                          "domain", "expert", a.domains, ex, m, vmax);
    }
  }
  std::string out;
  if (!h.empty())
    out += std::string("<h3>") + (a.top_k >= 2 ? "Co-activation" : "Layer-to-layer flow") +
           "</h3><div class=\"grid\">" + h + "</div>";
  if (!d.empty()) out += "<h3>Domain × expert</h3><div class=\"grid\">" + d + "</div>";
  return out;
}

std::string saturation_chart(const RoutingAnalysis& a) {
  std::string h = "<h3>Router saturation over the run's checkpoints</h3>";
  if (!a.saturation) return h + "<p class=\"note\">" + esc(a.saturation_note) + "</p>";
  const Saturation& s = *a.saturation;
  Series sat{"saturation (vs final)", "#1f77b4", {}},
      flip{"flip rate (vs previous)", "#d62728", {}};
  for (size_t i = 0; i < s.steps.size(); ++i) {
    sat.points.emplace_back(s.steps[i], s.saturation[i]);
    if (i > 0) flip.points.emplace_back(s.steps[i], s.flip[i]);
  }
  const StepAxis axis(static_cast<double>(s.steps.back()));
  h += "<div class=\"grid\">" +
       line_chart(fmt::format("Saturation and flip rate on {} probe tokens", s.tokens), {sat, flip},
                  {}, axis) +
       "</div>";
  if (!a.saturation_note.empty()) h += "<p class=\"note\">" + esc(a.saturation_note) + "</p>";
  return h;
}

std::string top_tokens(const RoutingAnalysis& a) {
  std::string h =
      "<h3>What each expert sees</h3><p class=\"note\">Per expert: its share of the "
      "assignments, its specialisation (mean over the token ids it gets most often of the "
      "fraction of their occurrences it gets) and the tokens routed to it most often, with "
      "the fraction of each token's occurrences that went there.</p>";
  for (const auto& l : a.layer) {
    h += fmt::format(
        "<details{}><summary>Layer {}</summary><table><tr><th>expert</th><th>load</th>"
        "<th>specialisation</th><th>top tokens</th></tr>",
        l.layer == 0 ? " open" : "", l.layer);
    for (const auto& e : l.experts) {
      std::string toks;
      for (const auto& t : e.top_tokens)
        toks += fmt::format(
            "<span class=\"tt\" title=\"id {}: {} times, {:.0f} % of its "
            "occurrences\">{}</span> ",
            t.id, t.count, 100 * t.share, esc(t.text));
      h += fmt::format(
          "<tr><td style=\"color:{}\"><b>e{}</b></td><td>{:.3f}</td><td>{}</td><td>{}</td></tr>",
          series_color(static_cast<size_t>(e.expert)), e.expert, e.load,
          opt(e.specialisation, "no token id of its own"), toks);
    }
    h += "</table></details>";
  }
  return h;
}

const char* kStyle =
    "<style>.tok{display:inline-block;padding:1px 2px;margin:1px 0;font-family:monospace;"
    "font-size:12px;color:#fff;border-radius:2px;white-space:pre}"
    ".tokrow{white-space:nowrap;overflow-x:auto}.lname{display:inline-block;width:28px;"
    "font-size:11px;color:#555}.passage{margin:6px 0 12px;padding:4px;border:1px solid #eee}"
    ".tt{font-family:monospace;background:#f3f3f3;padding:0 3px;white-space:pre}"
    ".cell{font-size:10px}h3{font-size:14px;margin:14px 0 4px}</style>";

}  // namespace

std::string analysis_sections(const RoutingAnalysis& a) {
  return std::string(kStyle) + "<h2>What did the experts learn?</h2>" + summary_table(a) +
         token_view(a) + heatmaps(a) + saturation_chart(a) + top_tokens(a) + "\n";
}

std::string render_analysis_page(const RoutingAnalysis& a) {
  std::string html = page_head("minimind-cpp routing analysis: " + a.weights);
  html +=
      fmt::format("<h1>Routing analysis of {} (step {}; {} MoE layers, {} experts, top-{})</h1>\n",
                  esc(a.weights), a.step, a.layers, a.experts, a.top_k);
  return html + analysis_sections(a) + "</body></html>\n";
}

std::optional<RoutingAnalysis> read_analysis(const std::string& run_dir) {
  const std::string path = run_dir + "/analysis.json";
  if (!std::filesystem::exists(path)) return std::nullopt;
  const std::string text = open_input<DataError>(path, "routing analysis").read_all();
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw DataError("'" + path + "' is not valid JSON");
  try {
    return j.get<RoutingAnalysis>();
  } catch (const nlohmann::json::exception& e) {
    throw DataError("'" + path + "': " + e.what());
  }
}

}  // namespace minimind
