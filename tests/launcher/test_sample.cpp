// `hybrid_train sample` and `hybrid_train export` on a real run folder, as a user runs them: a
// tiny character-level GPT trained for a few steps with a checkpoint, then text from its weights
// (greedy: the same every time; sampled: the same for the same seed) and its Hugging Face
// checkpoint; a run on SentencePiece tokens samples through its tokenizer; and the arguments and
// folders each command refuses (exit 2, naming them).
#include "base/remove_tree.h"
#include "launcher/export/safetensors.h"
#include "launcher/tokenize/tokenizer.h"
#include "tests/support/run_binary.h"
#include "tests/support/temp_dir.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>

namespace ht::test {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A run folder with a checkpoint of a 1-layer model of `name` ("gpt" or "llama") trained on the
// characters of a short text; empty if training failed.
std::string trained_run(const TempDir& dir, const std::string& name) {
  std::string text;
  for (int i = 0; i < 120; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  const std::string corpus = dir.write("corpus.txt", text);
  const std::string run = dir.path("run_" + name);
  const std::string toml = "[model]\nname = \"" + name + "\"\nn_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 16\n" +
                           (name == "llama" ? "multiple_of = 16\n" : "") +
                           "[data]\ndataset = \"text\"\npath = \"" + corpus + "\"\n"
                           "[training]\nsteps = 4\nglobal_batch_size = 8\noptimizer = \"adamw\"\nlr = 0.01\nthreads = 1\n"
                           "[checkpoint]\ninterval = 4\n";
  const ProcessResult r = run_binary(dir.write(name + ".toml", toml) + " --job.output_dir=" + run);
  EXPECT_EQ(r.status, 0) << r.output;
  return r.status == 0 ? run : "";
}

TEST(Sample, GreedyIsDeterministicAndASeedReproducesItsText) {
  TempDir dir;
  const std::string run = trained_run(dir, "gpt");
  ASSERT_FALSE(run.empty());
  const ProcessResult greedy = run_binary("sample " + run + " --prompt 'the quick' --tokens 30 --greedy");
  ASSERT_EQ(greedy.status, 0) << greedy.output;
  EXPECT_THAT(greedy.output, StartsWith("the quick"));
  EXPECT_EQ(greedy.output.size(), std::string("the quick").size() + 30 + 1) << "30 characters and a newline";
  EXPECT_EQ(run_binary("sample " + run + " --prompt 'the quick' --tokens 30 --greedy").output, greedy.output);
  const std::string seeded = "sample " + run + " --prompt 'the' --tokens 40 --temperature 1.5 --top-k 10 --seed 11";
  const ProcessResult a = run_binary(seeded), b = run_binary(seeded);
  ASSERT_EQ(a.status, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
}

TEST(Sample, ALlamaRunSamplesToo) {
  TempDir dir;
  const std::string run = trained_run(dir, "llama");
  ASSERT_FALSE(run.empty());
  const ProcessResult r = run_binary("sample " + run + " --prompt 'the lazy' --tokens 20 --seed 3");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, StartsWith("the lazy"));
}

TEST(Sample, ARunOnSentencePieceTokensSamplesThroughItsTokenizer) {
  if (!tokenizer_built()) GTEST_SKIP() << "built without SentencePiece";
  TempDir dir;
  const ProcessResult tokenizer = run_binary("tokenize --input /usr/share/common-licenses/GPL-3 --model-prefix " +
                                             dir.path("sp") + " --vocab-size 400");
  ASSERT_EQ(tokenizer.status, 0) << tokenizer.output;
  const std::string toml = "[model]\nname = \"gpt\"\nn_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 16\n"
                           "[data]\ndataset = \"text\"\npath = \"/usr/share/common-licenses/GPL-3\"\ntokenizer = \"" +
                           dir.path("sp.model") + "\"\n[training]\nsteps = 2\nglobal_batch_size = 8\nthreads = 1\n"
                           "[checkpoint]\ninterval = 2\n";
  const ProcessResult train = run_binary(dir.write("sp.toml", toml) + " --job.output_dir=" + dir.path("run"));
  ASSERT_EQ(train.status, 0) << train.output;
  const std::string command = "sample " + dir.path("run") + " --prompt 'This License' --tokens 12 --seed 5";
  const ProcessResult a = run_binary(command), b = run_binary(command);
  ASSERT_EQ(a.status, 0) << a.output;
  EXPECT_THAT(a.output, StartsWith("This License"));
  EXPECT_EQ(a.output, b.output);
}

TEST(Sample, BadArgumentsAndFoldersExitWithStatus2NamingThem) {
  TempDir dir;
  const std::string run = trained_run(dir, "gpt");
  ASSERT_FALSE(run.empty());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"sample", "no run folder given"},
      {"sample " + run, "--prompt: empty"},
      {"sample " + run + " --prompt the --tokens 0", "--tokens 0"},
      {"sample " + run + " --prompt the --temperature 0", "--temperature"},
      {"sample " + run + " --prompt the --top-k -1", "--top-k -1"},
      {"sample " + run + " --prompt the --tokens many", "--tokens"},
      {"sample " + run + " --prompt 'the ZEBRA'", "'Z' (byte 0x5a) is not in the run's vocabulary"},
      {"sample " + dir.path("nothing") + " --prompt the", "no config.resolved.toml there"},
      {"sample " + run + " --prompt the --device cuda:99", "--device cuda:99"},
      {"export", "no run folder given"},
      {"export " + run + " --dtype float16", "--dtype float16: use float32 or bfloat16"},
  };
  for (const auto& [args, expected] : cases) {
    const ProcessResult r = run_binary(args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr(expected)) << args;
  }
  remove_tree(run + "/checkpoints");
  const ProcessResult none = run_binary("export " + run);
  EXPECT_EQ(none.status, 2);
  EXPECT_THAT(none.output, HasSubstr("no checkpoint in"));
  EXPECT_THAT(none.output, HasSubstr("checkpoint.interval > 0"));
}

TEST(Sample, ExportWritesAHuggingFaceCheckpointOfTheRun) {
  TempDir dir;
  for (const std::string name : {"gpt", "llama"}) {
    const std::string run = trained_run(dir, name);
    ASSERT_FALSE(run.empty());
    const ProcessResult r = run_binary("export " + run);
    ASSERT_EQ(r.status, 0) << r.output;
    const nlohmann::json config = nlohmann::json::parse(read_file(run + "/hf/config.json"));
    EXPECT_EQ(config["model_type"], name == "gpt" ? "gpt2" : "llama");
    const SafetensorsFile weights(run + "/hf/model.safetensors");
    EXPECT_EQ(weights.entries().size(), name == "gpt" ? 16u : 12u) << "GPT-2: 2 + 12 + 2; Llama: 1 + 9 + norm + head";
    const ProcessResult bf16 = run_binary("export " + run + " --output " + dir.path(name + "_bf16") + " --dtype bfloat16");
    ASSERT_EQ(bf16.status, 0) << bf16.output;
    EXPECT_EQ(SafetensorsFile(dir.path(name + "_bf16/model.safetensors")).entries().front().dtype_name, "BF16");
  }
}

}  // namespace
}  // namespace ht::test
