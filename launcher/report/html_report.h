#pragma once
// `hybrid_train report RUN_DIR` (and the end of every run): RUN_DIR/report.html, one file that
// opens without a network (data, script and styles inline) and shows how the run went: loss and
// evaluation curves, each step's time split (compute, recomputation, swap waits, all-reduce,
// optimizer, the rest), memory per step against the budget and the planner's prediction, the
// memory trace's timeline (bytes in use, evictions, recomputations, swaps) when the run kept one,
// per-stage times under pipelines, and the resolved config beside the predicted and measured
// numbers. The charts are SVG drawn by the page's own script (report_page.cpp), no library.

#include <cstdint>
#include <string>

namespace ht {

// Reads RUN_DIR's metrics.jsonl, summary.json, config.resolved.toml and memory_trace.json (each
// optional but the metrics) and writes RUN_DIR/report.html, whole or not at all (a temporary
// file renamed). Returns its path. Throws UserError naming the folder when it holds no
// metrics.jsonl (not a run's output folder).
std::string write_html_report(const std::string& run_dir);

// A trace above this is left out of the page (it says so): the browser parses what is inlined.
constexpr int64_t kReportTraceLimitBytes = int64_t{24} << 20;

// The page around its data (report_page.cpp): each argument is inlined as the text of a
// <script type="application/json"> element.
std::string report_page(const std::string& title, const std::string& metrics_jsonl, const std::string& summary_json,
                        const std::string& config_toml, const std::string& trace_json, const std::string& trace_note);

}  // namespace ht
