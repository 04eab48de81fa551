// The command line: overrides, help, version; and hybrid_train run as a process on bad input:
// exit status 2, one error line, nothing written.
#include "launcher/cli.h"
#include "tests/support/run_binary.h"
#include "tests/support/temp_dir.h"

#include <gmock/gmock.h>

#include <array>
#include <cstdio>
#include <sys/wait.h>

namespace ht::test {
namespace {

using ::testing::HasSubstr;

CommandLine parse(std::vector<const char*> args) {
  args.insert(args.begin(), "hybrid_train");
  return parse_command_line(static_cast<int>(args.size()), args.data());
}

TEST(CommandLine, ConfigAndOverridesInBothForms) {
  const CommandLine cl = parse({"job.toml", "--training.steps=20", "--model.name", "resnet"});
  EXPECT_EQ(cl.exit_code, -1);
  EXPECT_EQ(cl.config_path, "job.toml");
  ASSERT_EQ(cl.overrides.size(), 2u);
  EXPECT_EQ(cl.overrides[0].path, "training.steps");
  EXPECT_EQ(cl.overrides[0].value, "20");
  EXPECT_EQ(cl.overrides[1].path, "model.name");
  EXPECT_EQ(cl.overrides[1].value, "resnet");
}

TEST(CommandLine, BadArguments) {
  EXPECT_THROW(parse({}), UserError);                                   // no config
  EXPECT_THROW(parse({"job.toml", "--training.steps"}), UserError);    // no value
  EXPECT_THROW(parse({"job.toml", "stray"}), UserError);                // stray positional
}

TEST(CommandLine, HelpAndVersionExitZero) {
  testing::internal::CaptureStdout();
  EXPECT_EQ(parse({"--help"}).exit_code, 0);
  const std::string help = testing::internal::GetCapturedStdout();
  EXPECT_THAT(help, HasSubstr("[training]"));
  EXPECT_THAT(help, HasSubstr("global_batch_size (integer: >= 1, default 64)"));
  testing::internal::CaptureStdout();
  EXPECT_EQ(parse({"--version"}).exit_code, 0);
  EXPECT_THAT(testing::internal::GetCapturedStdout(), HasSubstr("hybrid_train "));
}

class BadInputProcess : public ::testing::Test {
 protected:
  void expect_refused(const std::string& toml, const std::string& args, const std::string& message) {
    const std::string out = dir_.path("out");
    const ProcessResult r = run_binary(dir_.write("job.toml", toml) + " --job.output_dir=" + out + " " + args);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_THAT(r.output, ::testing::StartsWith("hybrid_train: error: "));
    EXPECT_THAT(r.output, HasSubstr(message));
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << "one line: " << r.output;
    EXPECT_FALSE(std::filesystem::exists(out)) << "nothing may be written";
  }
  TempDir dir_;
};

const char* kCliMlp = "[model]\nname = \"mlp\"\n[data]\ndataset = \"synthetic\"\n";

TEST_F(BadInputProcess, EachKindExitsTwoWritingNothing) {
  expect_refused(std::string(kCliMlp) + "[trainig]\n", "", "job.toml:5:2: unknown section [trainig]");
  expect_refused(kCliMlp, "--training.stpes=3", "argument --training.stpes=3: unknown key");
  expect_refused(kCliMlp, "--training.steps=-1", "argument --training.steps=-1: training.steps: -1 is out of range");
  expect_refused(kCliMlp, "--training.steps=x", "argument --training.steps=x: training.steps: expected an integer");
  expect_refused("[data]\ndataset = \"synthetic\"\n", "", "job.toml: model.name is required");
  expect_refused(kCliMlp, "--model.name=vgg", "argument --model.name=vgg: model.name: \"vgg\" is not allowed");
  expect_refused("[model\n", "", "job.toml:1:7: TOML syntax error");
  expect_refused("[model]\nname = \"mlp\"\n[data]\ndataset = \"fashion_mnist\"\npath = \"/nonexistent\"\n", "",
                 "job.toml: data.path = \"/nonexistent\": no train-images-idx3-ubyte[.gz] in this folder");
  expect_refused("[model]\nname = \"gpt\"\n[data]\ndataset = \"text\"\npath = \"/nonexistent.txt\"\n", "",
                 "job.toml: data.path = \"/nonexistent.txt\": cannot read /nonexistent.txt");
  // A folder without files (issue 64: an internal error, "basic_filebuf::underflow").
  std::filesystem::create_directories(dir_.path("no_text"));
  expect_refused("[model]\nname = \"gpt\"\n[data]\ndataset = \"text\"\npath = \"" + dir_.path("no_text") + "\"\n", "",
                 "data.path = \"" + dir_.path("no_text") + "\": a folder with no files in it");
  expect_refused(kCliMlp, "--checkpoint.resume=/nonexistent/step_1", "checkpoint.resume = \"/nonexistent/step_1\"");
  expect_refused(kCliMlp, "--data.synthetic_samples=8 --training.global_batch_size=16",
                 "data: 8 training samples are fewer than training.global_batch_size = 16");
}

TEST_F(BadInputProcess, ImpossibleBudgetsExitTwoWritingNothing) {
  expect_refused(kCliMlp, "--memory.budget=lots", "argument --memory.budget=lots: memory.budget = \"lots\" is not a "
                 "memory size");
  // The MLP's 855,050 parameters take 3.26 MiB; with gradients and momentum 9.79 MiB.
  expect_refused(kCliMlp, "--memory.policy=dtr --memory.budget=1MiB",
                 "job.toml: memory.budget = \"1MiB\" (1.00 MiB) cannot hold the model's parameters, gradients and "
                 "sgd state (9.79 MiB)");
  expect_refused(kCliMlp, "--memory.budget=5MiB", "(5.00 MiB) cannot hold the model's parameters, gradients and sgd");
  // The state fits in 11 MiB, the step's working set (13.6 MiB predicted) does not, at any
  // micro-batch size (the first layer's weight gradient alone takes 3 MiB): refused before the
  // first step. (tests/launcher/test_planning.cpp: a refusal that names plans that fit.)
  // Without eviction the predicted peak's terms; with it, why eviction cannot run the step.
  expect_refused(kCliMlp, "--memory.budget=11MiB --memory.policy=none",
                 "job.toml: predicted peak 13.6 MiB per rank (model state ");
  expect_refused(kCliMlp, "--memory.budget=11MiB --memory.policy=none",
                 "does not fit memory.budget = \"11MiB\" (11.0 MiB); no micro-batch size, precision or memory "
                 "policy fits at 1 rank(s)");
  expect_refused(kCliMlp, "--memory.budget=11MiB --memory.policy=dtr",
                 "job.toml: memory.policy = \"dtr\" cannot train in memory.budget = \"11MiB\" (11.0 MiB): eviction "
                 "cannot run it: kernel ");
  expect_refused(kCliMlp, "--memory.budget=11MiB --memory.policy=dtr",
                 ", more than the budget's 11.0 MiB (11534336 bytes); no micro-batch size, precision or memory policy "
                 "fits at 1 rank(s)");
  // Told to go on anyway, the run stops at its first out-of-memory, and removes what it had begun.
  for (const char* policy : {"none", "dtr"}) {
    const std::string out = dir_.path(std::string("out_") + policy);
    const ProcessResult r = run_binary(dir_.write("job.toml", kCliMlp) + " --job.output_dir=" + out +
                                       " --memory.budget=10MiB --memory.check_fit=false --memory.trace=true "
                                       "--memory.policy=" + policy);
    EXPECT_EQ(r.status, 2) << r.output;
    const std::string last_line = r.output.substr(r.output.rfind('\n', r.output.size() - 2) + 1);
    EXPECT_THAT(last_line, ::testing::StartsWith(
                               "hybrid_train: error: " + dir_.path("job.toml") + ": memory.budget = \"10MiB\" (10.0 MiB) "
                               "is too small for model mlp at micro-batch 64: in step 1 an allocation of "));
    // Either too little room at all (with the floor no budget below works) or room in pieces.
    EXPECT_THAT(last_line, ::testing::AnyOf(HasSubstr(", more than the budget; no budget below "),
                                            HasSubstr(": fragmentation")));
    EXPECT_FALSE(std::filesystem::exists(out)) << "nothing may be left: " << out;
  }
}

TEST_F(BadInputProcess, MissingConfigFile) {
  const ProcessResult r = run_binary(dir_.path("nope.toml"));
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.output, HasSubstr("nope.toml: cannot read the config file"));
}

}  // namespace
}  // namespace ht::test
