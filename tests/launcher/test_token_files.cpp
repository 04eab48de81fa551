// Token files as a dataset: every format read back exactly, shards and globs, windows that never
// cross a shard, the sampler's order and ranks over them, a resumed run continuing the same
// stream, and every kind of bad file refused naming the file and the byte.
#include "launcher/config/config_loader.h"
#include "launcher/data/dataset.h"
#include "launcher/data/file_glob.h"
#include "training/sampler.h"
#include "launcher/data/token_files.h"
#include "launcher/job.h"
#include "launcher/tokenize/token_writer.h"
#include "tests/support/temp_dir.h"

#include <gmock/gmock.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <numeric>

namespace ht::test {
namespace {

using ::testing::HasSubstr;

// Raw bytes: a header of 256 int32 (when magic != 0) and the tokens as T.
template <typename T>
std::string raw_tokens(const std::vector<int64_t>& ids, int32_t magic = 0, int32_t version = 0, int64_t count = -1) {
  std::string bytes;
  if (magic != 0) {
    std::array<int32_t, 256> header{};
    header[0] = magic;
    header[1] = version;
    header[2] = static_cast<int32_t>(count >= 0 ? count : static_cast<int64_t>(ids.size()));
    bytes.append(reinterpret_cast<const char*>(header.data()), sizeof(header));
  }
  for (int64_t id : ids) {
    const T v = static_cast<T>(id);
    bytes.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  return bytes;
}

std::string put(const TempDir& dir, const std::string& name, const std::string& bytes) {
  std::ofstream(dir.path(name), std::ios::binary) << bytes;
  return dir.path(name);
}

std::vector<int64_t> read_all(const TokenShard& s) {
  std::vector<int64_t> out(static_cast<size_t>(s.tokens()));
  s.read(0, s.tokens(), out.data());
  return out;
}

// Shard s holds s * 1000 + i at token i: any window shows where its tokens came from.
std::vector<int64_t> numbered(int64_t shard, int64_t n) {
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = shard * 1000 + i;
  return ids;
}

std::vector<int> as_int(const std::vector<int64_t>& ids) { return std::vector<int>(ids.begin(), ids.end()); }

const char* kGpt = "[model]\nname = \"gpt\"\nn_layer = 1\nn_head = 2\nn_embd = 8\nblock_size = 4\n"
                   "[data]\ndataset = \"tokens\"\n";

std::string data_error(const TempDir& dir, const std::vector<std::string>& args) {
  try {
    make_datasets(config_for(dir, kGpt, args));
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(TokenFiles, EachFormatReadsBackExactly) {
  TempDir dir;
  const std::vector<int64_t> gpt2{0, 1, 50256, 7, 65535 % 50257}, llama{0, 128255, 70000, 3};
  write_token_file(dir.path("gpt2.bin"), as_int(gpt2), 50257);
  write_token_file(dir.path("llama.bin"), as_int(llama), 128256);
  const TokenShard a(dir.path("gpt2.bin"), TokenDtype::kHeader), b(dir.path("llama.bin"), TokenDtype::kHeader);
  EXPECT_EQ(a.format().magic, kGpt2TokensMagic);
  EXPECT_EQ(a.format().token_bytes, 2);
  EXPECT_EQ(a.format().vocab_size, 50257);
  EXPECT_EQ(read_all(a), gpt2);
  EXPECT_EQ(b.format().magic, kLlama3TokensMagic);
  EXPECT_EQ(b.format().token_bytes, 4);
  EXPECT_EQ(b.format().vocab_size, 128256);
  EXPECT_EQ(read_all(b), llama);
  EXPECT_EQ(std::filesystem::file_size(dir.path("gpt2.bin")), 1024u + 2 * gpt2.size());
  write_token_file(dir.path("small.bin"), {1, 2, 4095}, 4096);  // a tokenizer's: its size in header[3]
  const TokenShard small(dir.path("small.bin"), TokenDtype::kHeader);
  EXPECT_EQ(small.format().magic, kGpt2TokensMagic);
  EXPECT_EQ(small.format().vocab_size, 4096);
  EXPECT_TRUE(small.format().vocab_stated);

  const std::vector<int64_t> ids{5, 65535, 0, 12};
  const TokenShard u16(put(dir, "u16.bin", raw_tokens<uint16_t>(ids)), TokenDtype::kUint16);
  const TokenShard u32(put(dir, "u32.bin", raw_tokens<uint32_t>({5, 4000000000ll, 0})), TokenDtype::kUint32);
  EXPECT_EQ(read_all(u16), ids);
  EXPECT_EQ(read_all(u32), (std::vector<int64_t>{5, 4000000000ll, 0}));
  EXPECT_EQ(u16.format().magic, 0);
}

TEST(TokenFiles, WindowsAreShiftedByOneAndNeverCrossAShard) {
  TempDir dir;
  std::vector<TokenShard> shards;
  shards.emplace_back(put(dir, "a.bin", raw_tokens<uint16_t>(numbered(1, 25))), TokenDtype::kUint16);
  shards.emplace_back(put(dir, "b.bin", raw_tokens<uint16_t>(numbered(2, 17))), TokenDtype::kUint16);
  const TokenCorpus corpus(std::move(shards), 4);
  EXPECT_EQ(corpus.windows(), (25 - 1) / 4 + (17 - 1) / 4);  // 6 + 4: the remainders are dropped
  EXPECT_EQ(corpus.locate(5), std::make_pair(int64_t{0}, int64_t{20}));
  EXPECT_EQ(corpus.locate(6), std::make_pair(int64_t{1}, int64_t{0}));
  for (int64_t w = 0; w < corpus.windows(); ++w) {
    std::array<int64_t, 4> in{}, target{};
    corpus.read_window(w, in.data(), target.data());
    const int64_t shard = in[0] / 1000;
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(target[k], in[k] + 1) << "window " << w;
      EXPECT_EQ(target[k] / 1000, shard) << "window " << w << " crosses a shard";
    }
    EXPECT_EQ(in[0] % 1000 % 4, 0) << "windows step by block_size";
  }
}

TEST(TokenFiles, AGlobOpensShardsInOrderAndTheTailOrEvalPathIsHeldOut) {
  TempDir dir;
  for (int s : {3, 1, 2}) write_token_file(dir.path("shard_00" + std::to_string(s) + ".bin"), as_int(numbered(s, 41)), 50257);
  write_token_file(dir.path("val.bin"), as_int(numbered(9, 21)), 50257);
  DataSplits tail = make_datasets(config_for(dir, kGpt, {"--data.path=" + dir.path("shard_*.bin"), "--data.eval_fraction=0.2"}));
  EXPECT_EQ(tail.train->size() + tail.eval->size(), 30);  // 3 shards of 10 windows
  EXPECT_EQ(tail.eval->size(), 6);
  EXPECT_EQ(tail.info.classes, 50257);
  EXPECT_EQ(tail.info.task, Task::kLanguageModel);
  EXPECT_EQ(tail.info.sample_shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(tail.train->slice(0, 1).input[0][0].item<int64_t>(), 1000) << "shard_001 first";
  EXPECT_EQ(tail.train->slice(23, 1).input[0][0].item<int64_t>(), 3012) << "sorted: shard_003 last";
  EXPECT_EQ(tail.eval->slice(0, 1).input[0][0].item<int64_t>(), 3016) << "eval: the last windows";
  EXPECT_THAT(tail.info.description, HasSubstr("3 files"));

  DataSplits held = make_datasets(config_for(
      dir, kGpt, {"--data.path=" + dir.path("shard_*.bin"), "--data.eval_path=" + dir.path("val.bin")}));
  EXPECT_EQ(held.train->size(), 30);
  EXPECT_EQ(held.eval->size(), 5);
  EXPECT_EQ(held.eval->slice(4, 1).target[0][3].item<int64_t>(), 9020);
}

TEST(TokenFiles, SamplerOrderIsSequentialOrShuffledAndRanksTakeTheirSlices) {
  TempDir dir;
  write_token_file(dir.path("t.bin"), as_int(numbered(0, 4 * 64 + 1)), 50257);
  DataSplits d = make_datasets(config_for(dir, kGpt, {"--data.path=" + dir.path("t.bin"), "--data.eval_fraction=0.25"}));
  ASSERT_EQ(d.train->size(), 48);
  Sampler in_order(d.train->size(), 8, 1, false);
  for (int b = 0; b < 6; ++b) {
    const Batch batch = d.train->batch(in_order.next());
    EXPECT_TRUE(batch.input.select(1, 0).equal(at::arange(b * 8, b * 8 + 8, at::kLong) * 4)) << "batch " << b;
  }
  Sampler single(48, 8, 5, true), r0(48, 8, 5, true, 0, 2), r1(48, 8, 5, true, 1, 2);
  at::Tensor seen = at::zeros({48}, at::kLong);
  for (int b = 0; b < 6; ++b) {
    const Batch whole = d.train->batch(single.next());
    const Batch a = d.train->batch(r0.next()), c = d.train->batch(r1.next());
    EXPECT_TRUE(at::cat({a.input, c.input}).equal(whole.input)) << "ranks split the same global batch";
    EXPECT_TRUE(at::cat({a.target, c.target}).equal(whole.target));
    seen.index_add_(0, whole.input.select(1, 0).div(4, "floor"), at::ones({8}, at::kLong));
  }
  EXPECT_TRUE(seen.eq(1).all().item<bool>()) << "an epoch visits every window once";
}

TEST(TokenFiles, AResumedRunContinuesTheSameStream) {
  TempDir dir;
  std::vector<int> ids(2000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>((i * 7 + i / 13) % 61);
  write_token_file(dir.path("t.bin"), ids, 61);
  const std::string toml = std::string(kGpt) + "path = \"" + dir.path("t.bin") +
                           "\"\nvocab_size = 61\n[training]\nsteps = 5\nwarmup_steps = 2\nglobal_batch_size = 16\noptimizer = \"adamw\"\n"
                           "lr = 0.01\n[memory]\ncheck_fit = false\n";
  const JobOutcome whole = run_job(config_for(dir, toml, {"--job.output_dir=" + dir.path("whole")}), true);
  const std::string out = "--job.output_dir=" + dir.path("parts");
  run_job(config_for(dir, toml, {out, "--training.steps=3", "--checkpoint.interval=3"}), true);
  const JobOutcome resumed = run_job(config_for(dir, toml, {out, "--checkpoint.resume=latest"}), true);
  EXPECT_EQ(resumed.result.resumed_from_step, 3);
  const auto a = whole.model->parameters(), b = resumed.model->parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equal(b[i])) << "parameter " << i;
  EXPECT_EQ(whole.result.final_loss, resumed.result.final_loss);
}

TEST(TokenFiles, EveryBadFileIsRefusedNamingTheFileAndTheByte) {
  TempDir dir;
  const std::vector<int64_t> ids = numbered(0, 40);
  auto error_for = [&](const std::string& name, const std::string& bytes, std::vector<std::string> more = {}) {
    more.push_back("--data.path=" + put(dir, name, bytes));
    return data_error(dir, more);
  };
  EXPECT_THAT(error_for("magic.bin", raw_tokens<uint16_t>(ids, 12345, 1)),
              HasSubstr("magic.bin: byte 0: magic number 12345, expected 20240520"));
  EXPECT_THAT(error_for("version.bin", raw_tokens<uint16_t>(ids, kGpt2TokensMagic, 3)),
              HasSubstr("version.bin: byte 4: version 3 for magic 20240520, expected 1"));
  std::string cut = raw_tokens<uint16_t>(ids, kGpt2TokensMagic, 1);
  cut.resize(cut.size() - 3);
  EXPECT_THAT(error_for("cut.bin", cut), HasSubstr("cut.bin: byte 8: the header counts 40 tokens of 2 bytes, so the "
                                                   "file should have 1104 bytes, and it has 1101: truncated"));
  EXPECT_THAT(error_for("odd.bin", raw_tokens<uint16_t>(ids) + "x", {"--data.token_dtype=uint16", "--data.vocab_size=100"}),
              HasSubstr("odd.bin: byte 80: the file's 81 bytes are not a multiple of 2"));
  EXPECT_THAT(error_for("short.bin", raw_tokens<uint16_t>(numbered(0, 4), kGpt2TokensMagic, 1)),
              HasSubstr("short.bin: byte 1032: the file ends after 4 tokens, fewer than one window of "
                        "model.block_size + 1 = 5"));
  std::vector<int64_t> bad = ids;
  bad[17] = 50257;
  EXPECT_THAT(error_for("id.bin", raw_tokens<uint16_t>(bad, kGpt2TokensMagic, 1)),
              HasSubstr("id.bin: byte 1058 (token 17): id 50257 is not below the vocabulary size 50257 (the header's "
                        "magic 20240520); set data.vocab_size to at least 50258"));
  EXPECT_THAT(error_for("header.bin", raw_tokens<uint16_t>(ids, kGpt2TokensMagic, 1),
                        {"--data.token_dtype=uint16", "--data.vocab_size=50257"}),
              HasSubstr("header.bin: byte 0: this file starts with llm.c's header"));
  EXPECT_THAT(error_for("id.bin", raw_tokens<uint16_t>(bad, kGpt2TokensMagic, 1), {"--data.vocab_size=1000"}),
              HasSubstr("id.bin: byte 1058 (token 17): id 50257 is not below the vocabulary size 1000 (data.vocab_size)"));
  EXPECT_THAT(data_error(dir, {"--data.path=" + dir.path("none_*.bin")}), HasSubstr("no file matches this pattern"));
  EXPECT_THAT(data_error(dir, {"--data.path=" + dir.path("cut.bin")}), HasSubstr("job.toml: data.path = \""));
  // A folder is named as one, with the glob that would read it (issue 64: "no such file").
  std::filesystem::create_directories(dir.path("shards"));
  EXPECT_THAT(data_error(dir, {"--data.path=" + dir.path("shards")}),
              HasSubstr("a folder, and token files are named one by one or by a glob: give e.g. \"" + dir.path("shards") + "/*.bin\""));
}

TEST(TokenFiles, ABadIdPastTheFirstChunkIsFoundAtItsOffset) {
  TempDir dir;
  const size_t n = (size_t{1} << 24) + 100, bad = (size_t{1} << 24) + 42;  // past the scan's first chunk
  std::vector<uint16_t> ids(n, 7);
  ids[bad] = 60000;
  const TokenShard s(put(dir, "big.bin", std::string(reinterpret_cast<const char*>(ids.data()), 2 * n)),
                     TokenDtype::kUint16);
  int64_t last = 0;
  EXPECT_EQ(s.first_id_at_least(50257, [&](int64_t done) { last = done; }), static_cast<int64_t>(bad));
  EXPECT_EQ(last, s.bytes());
  EXPECT_EQ(s.first_id_at_least(60001, nullptr), -1);
}

TEST(TokenFiles, ConfigRulesNameTheKey) {
  TempDir dir;
  const std::string mlp = "[model]\nname = \"mlp\"\n[data]\ndataset = \"tokens\"\npath = \"x.bin\"\n";
  EXPECT_THAT(load_error(dir.write("a.toml", mlp)), HasSubstr("data.dataset = \"tokens\" gives tokens"));
  EXPECT_THAT(load_error(dir.write("b.toml", kGpt)), HasSubstr("data.path is required with data.dataset = \"tokens\""));
  EXPECT_THAT(load_error(dir.write("c.toml", std::string(kGpt) + "path = \"x.bin\"\ntoken_dtype = \"uint32\"\n")),
              HasSubstr("set data.vocab_size too"));
  EXPECT_THAT(load_error(dir.write("d.toml", std::string(kGpt) + "path = \"x.bin\"\ntoken_dtype = \"int8\"\n")),
              HasSubstr("data.token_dtype"));
}

TEST(FileGlob, StarsStayInAFolderAndDoubleStarsCrossFolders) {
  TempDir dir;
  std::filesystem::create_directories(dir.path("a/b/c"));
  for (const char* f : {"a/x.txt", "a/b/y.txt", "a/b/c/z.txt", "a/b/c/w.md", "a/v1.bin", "a/v2.bin"}) dir.write(f, "t");
  EXPECT_EQ(match_files(dir.path("a/*.txt")), (std::vector<std::string>{dir.path("a/x.txt")}));
  EXPECT_EQ(match_files(dir.path("a/**/*.txt")),
            (std::vector<std::string>{dir.path("a/b/c/z.txt"), dir.path("a/b/y.txt"), dir.path("a/x.txt")}));
  EXPECT_EQ(match_files(dir.path("a/v[12].bin")), (std::vector<std::string>{dir.path("a/v1.bin"), dir.path("a/v2.bin")}));
  EXPECT_EQ(match_files(dir.path("a/b")), std::vector<std::string>{}) << "a folder, only when asked";
  EXPECT_EQ(match_files(dir.path("a/b"), true).size(), 3u);
  EXPECT_EQ(match_files(dir.path("a/none*")), std::vector<std::string>{});
}

}  // namespace
}  // namespace ht::test
