#include "launcher/report/html_report.h"

#include "base/user_error.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ht {
namespace {

namespace fs = std::filesystem;

std::string read_whole(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::string write_html_report(const std::string& run_dir) {
  const fs::path dir(run_dir);
  const fs::path metrics = dir / "metrics.jsonl";
  if (!fs::is_regular_file(metrics)) {
    throw UserError(run_dir + ": no metrics.jsonl there, so no run to report on; give the job.output_dir of a run, "
                    "e.g. hybrid_train report runs/quickstart");
  }
  std::string trace, note;
  const fs::path trace_path = dir / "memory_trace.json";
  if (fs::is_regular_file(trace_path)) {
    const auto bytes = static_cast<int64_t>(fs::file_size(trace_path));
    if (bytes <= kReportTraceLimitBytes) {
      trace = read_whole(trace_path);
    } else {
      note = "memory_trace.json is " + std::to_string(bytes >> 20) + " MiB, more than this page inlines (" +
             std::to_string(kReportTraceLimitBytes >> 20) + " MiB): open it in Perfetto, or trace fewer steps "
             "(memory.trace_steps)";
    }
  }
  const std::string page = report_page(dir.filename().string(), read_whole(metrics), read_whole(dir / "summary.json"),
                                       read_whole(dir / "config.resolved.toml"), trace, note);
  const fs::path out = dir / "report.html", tmp = dir / ".report.html.tmp";
  {
    std::ofstream file(tmp, std::ios::binary);
    file << page;
    file.flush();
    if (!file) {
      std::error_code ignored;
      fs::remove(tmp, ignored);
      throw UserError(out.string() + ": could not write the report (" + std::to_string(page.size()) +
                      " bytes); is the disk full?");
    }
  }
  fs::rename(tmp, out);
  return out.string();
}

}  // namespace ht
