// The tokenizer and `hybrid_train tokenize`: text round-trips through a trained SentencePiece
// model and an llm.c token file; the command writes the model, the tokens and the held-out tail
// atomically; data.tokenizer trains on a text file's tokens; bad arguments exit 2.
#include "launcher/config/config_loader.h"
#include "launcher/data/dataset.h"
#include "launcher/data/token_files.h"
#include "launcher/tokenize/token_writer.h"
#include "launcher/tokenize/tokenize_command.h"
#include "launcher/tokenize/tokenizer.h"
#include "tests/support/run_binary.h"
#include "tests/support/temp_dir.h"

#include <gmock/gmock.h>

namespace ht::test {
namespace {

using ::testing::HasSubstr;

// English with what a round trip must keep: runs of spaces, tabs, blank lines, UTF-8 beyond ASCII.
std::string sample_text() {
  std::string text = read_file("/usr/share/common-licenses/GPL-3");
  if (text.empty()) {
    for (int i = 0; i < 400; ++i) text += "Line " + std::to_string(i) + ": the quick brown fox jumps over the lazy dog.\n";
  }
  return text + "\n\n  indented\twith a tab,   spaces;  caf\xc3\xa9, na\xc3\xafve, \xe2\x82\xac 5, \xf0\x9f\x98\x80\nno newline at the end";
}

std::vector<int> read_ids(const std::string& path) {
  const TokenShard shard(path, TokenDtype::kHeader);
  std::vector<int64_t> ids(static_cast<size_t>(shard.tokens()));
  shard.read(0, shard.tokens(), ids.data());
  return std::vector<int>(ids.begin(), ids.end());
}

class Tokenize : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!tokenizer_built()) GTEST_SKIP() << "this build has no SentencePiece (install libsentencepiece-dev)";
  }
  TempDir dir_;
};

// The message run_tokenize_command gives, or "".
std::string tokenize_error(const TokenizeArgs& args) {
  try {
    run_tokenize_command(args);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST_F(Tokenize, TextRoundTripsThroughATrainedModelAndATokenFile) {
  const std::string text = sample_text();
  TokenizerTraining training;
  training.files = {dir_.write("text.txt", text)};
  training.vocab_size = 500;
  const Tokenizer trained = Tokenizer::train(training);
  EXPECT_EQ(trained.vocab_size(), 500);
  trained.save(dir_.path("m"));
  const Tokenizer tokenizer = Tokenizer::load(dir_.path("m.model"));
  EXPECT_THAT(read_file(dir_.path("m.vocab")), HasSubstr("<0x0A>\t"));  // byte fallback's pieces
  const std::vector<int> ids = tokenizer.encode(text);
  EXPECT_EQ(ids, trained.encode(text)) << "the saved model is the trained one";
  EXPECT_LT(ids.size(), text.size() / 2) << "subwords, not bytes";
  write_token_file(dir_.path("t.bin"), ids, tokenizer.vocab_size());
  const std::vector<int> back = read_ids(dir_.path("t.bin"));
  EXPECT_EQ(back, ids);
  EXPECT_EQ(tokenizer.decode(back), text);
  EXPECT_THROW(tokenizer.decode({500}), UserError);
}

TEST_F(Tokenize, UnigramRoundTripsToo) {
  const std::string text = sample_text();
  TokenizerTraining training;
  training.files = {dir_.write("text.txt", text)};
  training.vocab_size = 400;
  training.model = TokenizerModel::kUnigram;
  const Tokenizer tokenizer = Tokenizer::train(training);
  EXPECT_EQ(tokenizer.decode(tokenizer.encode(text)), text);
}

TEST_F(Tokenize, TheCommandWritesModelTokensAndTheHeldOutTail) {
  const std::string a = sample_text(), b = "a second document\nwith two lines\n";
  TokenizeArgs args;
  args.inputs = {dir_.path("in")};  // a folder: every file below it, sorted
  std::filesystem::create_directories(dir_.path("in"));
  dir_.write("in/1.txt", a);
  dir_.write("in/2.txt", b);
  args.model_prefix = dir_.path("tok");
  args.output = dir_.path("out.bin");
  args.vocab_size = 400;
  args.eval_fraction = 0.1;
  ASSERT_EQ(run_tokenize_command(args), 0);
  const Tokenizer tokenizer = Tokenizer::load(dir_.path("tok.model"));
  const std::vector<int> train = read_ids(dir_.path("out.bin")), eval = read_ids(dir_.path("out_val.bin"));
  const std::string head = tokenizer.decode(train), tail = tokenizer.decode(eval);
  EXPECT_EQ(head + tail, a + b) << "the end-of-document tokens decode to nothing";
  EXPECT_NEAR(static_cast<double>(tail.size()), 0.1 * static_cast<double>((a + b).size()), 200);
  EXPECT_EQ(head.back(), '\n') << "the split falls at a line's end";
  EXPECT_EQ(std::count(train.begin(), train.end(), tokenizer.eos_id()) +
                std::count(eval.begin(), eval.end(), tokenizer.eos_id()), 2) << "one per input file";
  for (const auto& f : std::filesystem::directory_iterator(dir_.path())) {
    EXPECT_EQ(f.path().string().find(".tmp"), std::string::npos) << "left behind: " << f.path();
  }
  // Again into the same files: a run may have trained with them, so nothing is replaced without
  // --overwrite (issue 64: the tokenizer a run used was overwritten without a word).
  const std::string model_bytes = read_file(dir_.path("tok.model"));
  EXPECT_THAT(tokenize_error(args), HasSubstr("--model-prefix " + args.model_prefix + ": " + args.model_prefix +
                                              ".model exists, and a run trained with that tokenizer reads its token ids "
                                              "from it"));
  EXPECT_EQ(read_file(dir_.path("tok.model")), model_bytes) << "refused before training";
  TokenizeArgs other_output = args;
  other_output.model_prefix.clear();
  other_output.model = dir_.path("tok.model");
  EXPECT_THAT(tokenize_error(other_output), HasSubstr("--output " + args.output + ": " + args.output + " exists"));
  other_output.output = dir_.path("fresh.bin");
  std::filesystem::copy_file(dir_.path("out_val.bin"), dir_.path("fresh_val.bin"));
  EXPECT_THAT(tokenize_error(other_output), HasSubstr(dir_.path("fresh_val.bin") + " exists")) << "the held-out file too";
  std::filesystem::remove(dir_.path("fresh_val.bin"));
  TokenizeArgs replaced = args;
  replaced.overwrite = true;
  ASSERT_EQ(run_tokenize_command(replaced), 0);
  EXPECT_EQ(read_ids(dir_.path("out.bin")), train) << "the same text and settings: the same tokens";
  // The model again, on its own: the same tokens.
  TokenizeArgs again = args;
  again.model_prefix.clear();
  again.model = dir_.path("tok.model");
  again.output = dir_.path("again.bin");
  again.eval_fraction = 0;
  ASSERT_EQ(run_tokenize_command(again), 0);
  std::vector<int> joined = train;
  joined.insert(joined.end(), eval.begin(), eval.end());
  EXPECT_EQ(read_ids(dir_.path("again.bin")), joined);
}

// The header carries the bytes of text its tokens encode, so a token run's loss reads in bits per
// byte; token files name their tokenizer for `sample`, which must have the files' vocabulary.
TEST_F(Tokenize, TokenFilesKnowTheirTextsBytesAndTheirTokenizer) {
  const std::string text = sample_text();
  TokenizeArgs args;
  args.inputs = {dir_.write("in.txt", text)};
  args.model_prefix = dir_.path("tok");
  args.output = dir_.path("out.bin");
  args.vocab_size = 400;
  args.eval_fraction = 0.1;
  ASSERT_EQ(run_tokenize_command(args), 0);
  const TokenShard train(dir_.path("out.bin"), TokenDtype::kHeader), eval(dir_.path("out_val.bin"), TokenDtype::kHeader);
  EXPECT_EQ(train.format().text_bytes + eval.format().text_bytes, static_cast<int64_t>(text.size()));
  const std::string toml = "[model]\nname = \"llama\"\nblock_size = 16\nn_layer = 1\nn_embd = 32\nn_head = 2\n"
                           "[data]\ndataset = \"tokens\"\npath = \"" + dir_.path("out.bin") + "\"\neval_path = \"" +
                           dir_.path("out_val.bin") + "\"\ntokenizer = \"" + dir_.path("tok.model") + "\"\n";
  const DataSplits d = make_datasets(config_for(dir_, toml, {}));
  EXPECT_DOUBLE_EQ(d.info.eval_bytes_per_token,
                   static_cast<double>(eval.format().text_bytes) / static_cast<double>(eval.tokens()));
  TokenizerTraining other;
  other.files = {dir_.path("in.txt")};
  other.vocab_size = 500;
  Tokenizer::train(other).save(dir_.path("other"));
  try {
    make_datasets(config_for(dir_, toml, {"--data.tokenizer=" + dir_.path("other.model")}));
    FAIL() << "a tokenizer of another vocabulary";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("has 500 ids, but the token files' vocabulary is 400"));
  }
}

TEST_F(Tokenize, DataTokenizerTrainsOnATextFilesTokens) {
  const std::string text = sample_text();
  TokenizerTraining training;
  training.files = {dir_.write("text.txt", text)};
  training.vocab_size = 400;
  const Tokenizer tokenizer = Tokenizer::train(training);
  tokenizer.save(dir_.path("m"));
  const std::string toml = "[model]\nname = \"gpt\"\nblock_size = 16\n[data]\ndataset = \"text\"\npath = \"" +
                           dir_.path("text.txt") + "\"\ntokenizer = \"" + dir_.path("m.model") + "\"\n";
  const DataSplits d = make_datasets(config_for(dir_, toml, {}));
  EXPECT_EQ(d.info.classes, 400);
  const std::vector<int> ids = tokenizer.encode(text);
  const int64_t tokens = static_cast<int64_t>(ids.size());
  EXPECT_EQ(d.train->size() + d.eval->size(), (tokens - tokens / 10 - 1) / 16 + (tokens / 10 - 1) / 16);
  const Batch b = d.train->slice(0, 1);
  const std::vector<int> first(b.input[0].data_ptr<int64_t>(), b.input[0].data_ptr<int64_t>() + 16);
  EXPECT_EQ(first, std::vector<int>(ids.begin(), ids.begin() + 16));
  EXPECT_THAT(d.info.description, HasSubstr("SentencePiece tokens of"));
  try {
    make_datasets(config_for(dir_, toml, {"--data.tokenizer=" + dir_.path("text.txt")}));
    FAIL() << "a text file is not a model";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("data.tokenizer = \"" + dir_.path("text.txt") + "\": " + dir_.path("text.txt") +
                                    ": not a SentencePiece model"));
  }
}

TEST(TokenizeCommand, BadArgumentsExitTwoNamingTheArgument) {
  TempDir dir;
  auto refused = [&](const std::string& args, const std::string& message) {
    const ProcessResult r = run_binary("tokenize " + args);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_THAT(r.output, HasSubstr(message));
  };
  const std::string text = dir.write("t.txt", "some text\n");
  refused("--input " + dir.path("none_*.txt") + " --model-prefix " + dir.path("m"),
          "hybrid_train: error: --input " + dir.path("none_*.txt") + ": no file matches this pattern");
  refused("--input " + text + " --model-prefix " + dir.path("m") + " --vocab-size many", "--vocab-size");
  if (tokenizer_built()) {
    refused("--input " + text + " --model-prefix " + dir.path("m") + " --vocab-size 100000", "--vocab-size 100000: "
            "SentencePiece could not train a model: the text fills at most ");
    // Too small a vocabulary for the text's characters asks for a larger one (issue 64: it
    // advised a smaller one).
    refused("--input " + text + " --model-prefix " + dir.path("m") + " --vocab-size 5",
            "--vocab-size 5: SentencePiece could not train a model: the text's characters and the special pieces need ");
  }
  // An empty input is the input's fault, not the vocabulary's (issue 64), whatever is built.
  const std::string empty = dir.write("empty.txt", "");
  refused("--input " + empty + " --model-prefix " + dir.path("m"),
          "hybrid_train: error: --input " + empty + ": 1 file(s), all empty: no text to tokenize");
  std::filesystem::remove(empty);
  TokenizeArgs a;
  a.inputs = {text};
  EXPECT_THAT(tokenize_error(a), HasSubstr("give --model-prefix PREFIX"));
  a.model = dir.path("no.model");
  a.output = dir.path("o.bin");
  if (tokenizer_built()) {
    EXPECT_THAT(tokenize_error(a), HasSubstr("--model " + a.model + ": " + a.model + ": cannot read this file"));
  }
  a.model_prefix = dir.path("m");
  EXPECT_THAT(tokenize_error(a), HasSubstr("--model and --model-prefix both given"));
  a.model.clear();
  a.model_prefix = dir.path("nowhere/m");
  EXPECT_THAT(tokenize_error(a), HasSubstr("--model-prefix " + dir.path("nowhere/m") + ".model: the folder " +
                                           dir.path("nowhere") + " does not exist"));
  // A folder that exists but takes no file (issue 64): refused before the tokenizer trains, so
  // neither its model nor its vocabulary is left behind.
  a.model_prefix = dir.path("m");
  a.output = "/proc/m7.bin";
  EXPECT_THAT(tokenize_error(a), HasSubstr("--output /proc/m7.bin: cannot write in the folder /proc"));
  refused("--input " + text + " --model-prefix " + dir.path("m") + " --vocab-size 40 --output /proc/m7.bin",
          "hybrid_train: error: --output /proc/m7.bin: cannot write in the folder /proc");
  a.output.clear();
  a.eval_fraction = 0.1;
  EXPECT_THAT(tokenize_error(a), HasSubstr("--eval-fraction needs --output"));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1) << "nothing written but t.txt";
}

}  // namespace
}  // namespace ht::test
