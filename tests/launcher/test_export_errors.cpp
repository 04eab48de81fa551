// What the export side must refuse, and say why: safetensors files that are truncated, malformed
// or inconsistent (each message naming the file and the tensor), Hugging Face checkpoints that do
// not fit the configured model (naming the tensor, its shape and the [model] key to change), and
// model.init_from doing both inside a training job.
#include "launcher/config/config_loader.h"
#include "launcher/export/hf_checkpoint.h"
#include "launcher/export/hf_layout.h"
#include "launcher/export/safetensors.h"
#include "launcher/job.h"
#include "base/user_error.h"
#include "models/decoder.h"
#include "tests/support/run_binary.h"
#include "tests/support/temp_dir.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

namespace ht::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A file of the format by hand: header length, header, data.
std::string write_raw(const TempDir& dir, const std::string& name, const std::string& header, const std::string& data) {
  std::string bytes(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  std::ofstream(dir.path(name), std::ios::binary) << bytes << header << data;
  return dir.path(name);
}

// The UserError reading `path` gives, or "" if it reads.
std::string read_error(const std::string& path) {
  try {
    SafetensorsFile file(path);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, AWellFormedFileReadsBackItsTensorsAndMetadata) {
  TempDir dir;
  const at::Tensor a = at::arange(6, at::kFloat).view({2, 3}), b = at::arange(4, at::kLong);
  write_safetensors(dir.path("ok.safetensors"), {{"a", {2, 3}, [&] { return a; }}, {"b", {4}, [&] { return b; }}},
                    at::kFloat, {{"format", "pt"}});
  const SafetensorsFile file(dir.path("ok.safetensors"));
  EXPECT_TRUE(file.read("a").equal(a));
  EXPECT_TRUE(file.read("b").equal(b.to(at::kFloat))) << "written in the file's one dtype";
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_FALSE(std::filesystem::exists(dir.path("ok.safetensors.tmp"))) << "renamed into place";
}

TEST(Safetensors, BadFilesAreRefusedNamingTheFileTheTensorAndWhatWasExpected) {
  TempDir dir;
  const std::string data(16, '\0');
  struct Case {
    const char* name;
    std::string header, data, expected;
  };
  const std::vector<Case> cases = {
      {"bad_json", "{\"w\": {\"dtype\": \"F32\",", data, "the header is not valid JSON"},
      {"past_end", R"({"w": {"dtype": "F32", "shape": [100], "data_offsets": [0, 400]}})", data,
       "tensor w: data_offsets [0,400] reach past the end of the data (16 bytes"},
      {"span", R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 8]}})", data,
       "tensor w: shape [2, 2] of F32 needs 16 bytes, but data_offsets [0,8] span 8"},
      {"dtype", R"({"w": {"dtype": "F7", "shape": [4], "data_offsets": [0, 16]}})", data,
       "tensor w: dtype \"F7\" is not one this reader knows"},
      {"overlap", R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                      "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})", data, "tensors a [0, 16) and b [8, 16) overlap"},
      {"fields", R"({"w": {"dtype": "F32", "shape": [4]}})", data, "tensor w: its header entry must be an object with dtype, shape and data_offsets"},
  };
  for (const Case& c : cases) {
    const std::string path = write_raw(dir, std::string(c.name) + ".safetensors", c.header, c.data);
    EXPECT_THAT(read_error(path), AllOf(HasSubstr(path), HasSubstr(c.expected))) << c.name;
  }
  // Truncated: a valid file missing its last bytes.
  write_safetensors(dir.path("whole.safetensors"), {{"w", {4}, [] { return at::ones({4}); }}}, at::kFloat, {});
  std::string bytes = read_file(dir.path("whole.safetensors"));
  std::ofstream(dir.path("cut.safetensors"), std::ios::binary) << bytes.substr(0, bytes.size() - 3);
  EXPECT_THAT(read_error(dir.path("cut.safetensors")), AllOf(HasSubstr("tensor w"), HasSubstr("reach past the end")));
  std::ofstream(dir.path("tiny.safetensors"), std::ios::binary) << bytes.substr(0, 5);
  EXPECT_THAT(read_error(dir.path("tiny.safetensors")), HasSubstr("too short for a safetensors file"));
  std::ofstream(dir.path("header.safetensors"), std::ios::binary) << bytes.substr(0, 20);
  EXPECT_THAT(read_error(dir.path("header.safetensors")), HasSubstr("the header length says"));
  EXPECT_THAT(read_error(dir.path("absent.safetensors")), HasSubstr("no such file"));
}

DecoderOptions gpt2_of_width(int64_t width) { return DecoderOptions::gpt2(29, 16, 2, 4, width, 0.0); }

// The UserError importing `path` into a decoder of shape `o` gives, or "".
std::string import_error(const std::string& path, const DecoderOptions& o) {
  Decoder model(o);
  try {
    import_hf(model, o, HfCheckpoint::open(path), "model.init_from");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(Export, ACheckpointOfAnotherShapeIsRefusedNamingTheTensorItsShapeAndTheKey) {
  TempDir dir;
  const DecoderOptions wide = gpt2_of_width(32);
  export_hf(Decoder(wide), wide, dir.path("wide"), at::kFloat);
  // With config.json beside the weights, the keys come from it.
  EXPECT_THAT(import_error(dir.path("wide"), gpt2_of_width(16)),
              AllOf(HasSubstr("transformer.wte.weight is [29, 32] there but [29, 16] in the configured model"),
                    HasSubstr("model.n_embd = 32"), HasSubstr("model.init_from")));
  // The weights file alone: a key from the tensor's name.
  EXPECT_THAT(import_error(dir.path("wide/model.safetensors"), gpt2_of_width(16)),
              AllOf(HasSubstr("transformer.wte.weight is [29, 32]"), HasSubstr("model.vocab_size (its rows) or model.n_embd")));
  DecoderOptions deeper = wide;
  deeper.n_layer = 3;
  EXPECT_THAT(import_error(dir.path("wide/model.safetensors"), deeper),
              AllOf(HasSubstr("no tensor transformer.h.2.ln_1.weight"), HasSubstr("model.n_layer")));
  DecoderOptions llama = DecoderOptions::llama(29, 16, 2, 4, 0, 32);
  EXPECT_THAT(import_error(dir.path("wide"), llama), HasSubstr("set model.name = \"gpt\""));
}

TEST(Export, ACheckpointMissingATensorIsRefusedNamingIt) {
  TempDir dir;
  const DecoderOptions o = gpt2_of_width(16);
  export_hf(Decoder(o), o, dir.path("hf"), at::kFloat);
  const SafetensorsFile whole(dir.path("hf/model.safetensors"));
  std::vector<SafetensorsOutput> kept;
  for (const SafetensorsEntry& e : whole.entries()) {
    if (e.name != "transformer.h.1.mlp.c_fc.bias") kept.push_back({e.name, e.shape, [&whole, e] { return whole.read(e); }});
  }
  write_safetensors(dir.path("partial.safetensors"), kept, at::kFloat, {});
  EXPECT_THAT(import_error(dir.path("partial.safetensors"), o),
              AllOf(HasSubstr("partial.safetensors"), HasSubstr("no tensor transformer.h.1.mlp.c_fc.bias")));
  // An untied Llama needs lm_head.weight; a tied checkpoint has none.
  DecoderOptions tied = DecoderOptions::llama(29, 16, 1, 4, 2, 32);
  tied.tie_embeddings = true;
  export_hf(Decoder(tied), tied, dir.path("tied"), at::kFloat);
  DecoderOptions untied = tied;
  untied.tie_embeddings = false;
  EXPECT_THAT(import_error(dir.path("tied/model.safetensors"), untied), HasSubstr("set model.tie_embeddings = true"));
}

const char* kTinyGpt = R"([model]
name = "gpt"
n_layer = 1
n_head = 2
n_embd = 16
block_size = 8
vocab_size = 32
[data]
dataset = "synthetic"
synthetic_samples = 64
synthetic_eval_samples = 16
synthetic_classes = 32
[training]
steps = 1
global_batch_size = 4
optimizer = "adamw"
threads = 1
)";

TEST(Export, InitFromStartsTrainingFromTheCheckpointsWeights) {
  TempDir dir;
  const Config c = config_for(dir, kTinyGpt, {"--job.output_dir=" + dir.path("run"), "--training.lr=0"});
  const DecoderOptions o = DecoderOptions::gpt2(32, 8, 1, 2, 16, 0.0);
  at::manual_seed(7);
  Decoder source(o);
  export_hf(source, o, dir.path("hf"), at::kFloat);
  Config with = c;
  with.model.init_from = dir.path("hf");
  const JobOutcome outcome = run_job(with, /*quiet=*/true);
  std::map<std::string, at::Tensor> trained;
  for (const auto& p : outcome.model->named_parameters()) trained[p.key()] = p.value();
  for (const auto& p : source.named_parameters()) EXPECT_TRUE(p.value().equal(trained.at(p.key()))) << p.key();
}

TEST(Export, InitFromWithAnotherShapeIsRefusedNamingTheKeyBeforeAnythingIsWritten) {
  TempDir dir;
  const DecoderOptions wide = DecoderOptions::gpt2(32, 8, 1, 2, 32, 0.0);
  export_hf(Decoder(wide), wide, dir.path("hf"), at::kFloat);
  const ProcessResult r = run_binary(dir.write("job.toml", kTinyGpt) + " --job.output_dir=" + dir.path("run") +
                                     " --model.init_from=" + dir.path("hf"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, AllOf(HasSubstr("model.init_from = \"" + dir.path("hf") + "\""),
                              HasSubstr("transformer.wte.weight is [32, 32] there but [32, 16]"), HasSubstr("model.n_embd = 32")));
  EXPECT_FALSE(std::filesystem::exists(dir.path("run"))) << "nothing written";
  const ProcessResult missing = run_binary(dir.path("job.toml") + " --model.init_from=" + dir.path("nowhere"));
  EXPECT_EQ(missing.status, 2);
  EXPECT_THAT(missing.output, HasSubstr("no such file or folder"));
}

}  // namespace
}  // namespace ht::test
