// The routing analysis as HTML: the sections report.html shows when the run directory holds
// analysis.json, and the page minimind-eval --analyze writes. Self-contained like the
// report (inline SVG and CSS, tooltips as title attributes, no scripts).
#pragma once

#include <string>

#include "minimind/run/routing_analysis.h"

namespace minimind {

// Per-layer summary, token view, heatmaps (co-activation, layer flow, domain x expert),
// saturation curve and each expert's top tokens.
std::string analysis_sections(const RoutingAnalysis& a);

// A whole page: the sections under a title naming the checkpoint.
std::string render_analysis_page(const RoutingAnalysis& a);

// analysis.json of a run directory, if it has one (written at the end of training).
std::optional<RoutingAnalysis> read_analysis(const std::string& run_dir);

}  // namespace minimind
