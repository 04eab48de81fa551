// `hybrid_train report` and the report every run writes: one self-contained report.html (no
// network: data and script inline) that a real browser renders with its charts and no script
// error. The browser test opens it in headless Chromium and keeps a screenshot
// (build/test_artifacts/report.png).
#include "launcher/report/html_report.h"
#include "base/user_error.h"
#include "tests/support/mpi_job.h"
#include "tests/support/run_binary.h"
#include "tests/support/temp_dir.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

namespace ht::test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The quick start's ConvNet on synthetic images, under host swap at a budget under its peak, with
// a memory trace: every section of the page has data (evictions and copies included).
const char* kReportJob = R"([model]
name = "convnet"
channels = [32, 64]
fc_hidden = 128
[data]
dataset = "synthetic"
synthetic_samples = 1024
synthetic_eval_samples = 128
synthetic_shape = [1, 28, 28]
synthetic_classes = 10
[training]
steps = 8
global_batch_size = 64
eval_interval = 4
threads = 1
[memory]
trace = true
[metrics]
log_interval = 1
)";

std::string traced_run(TempDir& dir) {
  const std::string out = dir.path("run");
  const ProcessResult r = run_binary(dir.write("job.toml", kReportJob) + " --memory.policy=hybrid --memory.budget=36000000 " +
                                     "--memory.check_fit=false --job.output_dir=" + out);
  EXPECT_EQ(r.status, 0) << r.output;
  return out;
}

TEST(Report, EveryRunWritesOneSelfContainedPage) {
  TempDir dir;
  const std::string out = traced_run(dir);
  const std::string page = read_file(out + "/report.html");
  ASSERT_FALSE(page.empty());
  EXPECT_THAT(page, HasSubstr("<script type=\"application/json\" id=\"run-data\">"));
  EXPECT_THAT(page, Not(HasSubstr("<script src"))) << "no script from elsewhere";
  EXPECT_THAT(page, Not(HasSubstr("<link"))) << "no style sheet from elsewhere";
  // The only URL is SVG's namespace, a name, not a fetch.
  for (size_t at = page.find("http"); at != std::string::npos; at = page.find("http", at + 1)) {
    const std::string rest = page.substr(at, 32);
    if (rest.rfind("http://", 0) != 0 && rest.rfind("https://", 0) != 0) continue;
    EXPECT_EQ(rest.substr(0, 26), "http://www.w3.org/2000/svg") << rest;
  }
  EXPECT_THAT(page, HasSubstr("\\\"event\\\": \\\"train\\\"")) << "the metrics inline";
  EXPECT_THAT(page, HasSubstr("traceEvents")) << "the memory trace inline";
  // `hybrid_train report` writes the same page again from the folder.
  std::filesystem::remove(out + "/report.html");
  const ProcessResult again = run_binary("report " + out);
  EXPECT_EQ(again.status, 0) << again.output;
  EXPECT_EQ(read_file(out + "/report.html"), page);
}

TEST(Report, AFolderThatIsNoRunIsRefusedByName) {
  TempDir dir;
  EXPECT_THROW(write_html_report(dir.path("nothing")), UserError);
  const ProcessResult r = run_binary("report " + dir.path("nothing"));
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.output, HasSubstr(dir.path("nothing") + ": no metrics.jsonl there, so no run to report on; give the "
                                  "job.output_dir of a run, e.g. hybrid_train report runs/quickstart"));
  const ProcessResult none = run_binary("report");
  EXPECT_EQ(none.status, 2);
  EXPECT_THAT(none.output, HasSubstr("usage: hybrid_train report RUN_DIR"));
  EXPECT_FALSE(std::filesystem::exists(dir.path("nothing/report.html")));
}

std::string chromium() {
  for (const char* path : {"/usr/bin/chromium", "/usr/bin/chromium-browser"})
    if (std::filesystem::exists(path)) return path;
  return "";
}

TEST(Report, HeadlessChromiumRendersEveryChartWithoutAScriptError) {
  const std::string browser = chromium();
  if (browser.empty()) GTEST_SKIP() << "no Chromium here: bash scripts/install-deps.sh --tests installs it";
  TempDir dir;
  const std::string out = traced_run(dir);
  const std::string flags = " --headless=new --no-sandbox --disable-gpu --hide-scrollbars ";
  const std::string url = "file://" + out + "/report.html";
  const std::string dom_file = dir.path("dom.html");
  ASSERT_EQ(std::system((browser + flags + "--dump-dom " + url + " > " + dom_file + " 2>/dev/null").c_str()), 0);
  const std::string dom = read_file(dom_file);
  EXPECT_THAT(dom, HasSubstr("data-rendered=\"true\"")) << "the script ran to its end";
  EXPECT_THAT(dom, Not(HasSubstr("class=\"script-error\""))) << dom.substr(0, 2000);
  // Found by search, not std::regex: libstdc++'s regex recurses once per character it skips, and a
  // page of this size overflows the stack (it did under ASan).
  for (const char* chart : {"Loss", "Evaluation", "Where each step went", "Step time", "Device memory",
                            "Moved and regenerated", "Bytes in use over the traced steps"}) {
    const size_t at = dom.find(std::string("data-title=\"") + chart + "\"");
    ASSERT_NE(at, std::string::npos) << "chart \"" << chart << "\"";
    const size_t end = dom.find("</svg>", at);
    EXPECT_NE(dom.substr(at, end - at).find("class=\"series\""), std::string::npos)
        << "chart \"" << chart << "\" with a drawn series";
  }
  EXPECT_THAT(dom, HasSubstr("class=\"mark\"")) << "the trace's evictions, copies or waits marked";
  EXPECT_THAT(dom, HasSubstr("peak device memory per rank")) << "the prediction beside the run";
  const std::filesystem::path artifacts(HT_ARTIFACT_DIR);
  std::filesystem::create_directories(artifacts);
  const std::string png = (artifacts / "report.png").string();
  std::filesystem::remove(png);
  EXPECT_EQ(std::system((browser + flags + "--window-size=1200,2600 --screenshot=" + png + " " + url +
                         " > /dev/null 2>&1").c_str()), 0);
  EXPECT_GT(std::filesystem::exists(png) ? std::filesystem::file_size(png) : 0, 10000u) << "a screenshot of the page";
}

// Under mpirun, the page has each data-parallel rank's step (compute, waiting for the all-reduce,
// the optimizer) and memory peak, from the records' rank_* arrays.
TEST(Report, ADataParallelRunShowsEachRanksStep) {
  const std::string browser = chromium();
  if (browser.empty()) GTEST_SKIP() << "no Chromium here: bash scripts/install-deps.sh --tests installs it";
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string out = dir.path("run");
  ASSERT_EQ(run(mpirun(2) + HT_BINARY + " " + dir.write("job.toml", kReportJob) + " --memory.trace=false --job.output_dir=" + out), 0);
  const std::string dom_file = dir.path("dom.html");
  ASSERT_EQ(std::system((browser + " --headless=new --no-sandbox --disable-gpu --dump-dom file://" + out +
                         "/report.html > " + dom_file + " 2>/dev/null").c_str()), 0);
  const std::string dom = read_file(dom_file);
  EXPECT_THAT(dom, HasSubstr("data-rendered=\"true\""));
  EXPECT_THAT(dom, Not(HasSubstr("class=\"script-error\""))) << dom.substr(0, 2000);
  EXPECT_THAT(dom, HasSubstr("Per data-parallel rank"));
  for (const char* chart : {"Where each rank", "Memory peak per rank"}) {
    const size_t at = dom.find(std::string("data-title=\"") + chart);
    ASSERT_NE(at, std::string::npos) << "chart \"" << chart << "\"";
    const size_t end = dom.find("</svg>", at);
    EXPECT_NE(dom.substr(at, end - at).find("class=\"series\""), std::string::npos) << "chart \"" << chart << "\" drawn";
  }
}

}  // namespace
}  // namespace ht::test
