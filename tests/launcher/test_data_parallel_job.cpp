// `mpirun -np N hybrid_train`: N ranks with global batch B end with the parameters of one rank
// with global batch B, within fp32 reduction order; rank 0 alone writes the outputs.
#include "launcher/config/config_text.h"
#include "tests/support/temp_dir.h"

#include <torch/serialize/input-archive.h>

#include <cstdlib>
#include <fstream>
#include <map>

namespace ht::test {
namespace {

using ::testing::HasSubstr;

// No batch norm and no dropout: their statistics and masks are per rank by design (README).
const char* kMlp = R"([model]
name = "mlp"
hidden = [32, 32]
[data]
dataset = "synthetic"
synthetic_samples = 256
synthetic_eval_samples = 64
synthetic_shape = [3, 8, 8]
synthetic_classes = 4
[training]
steps = 6
global_batch_size = 32
lr = 0.1
warmup_steps = 2
threads = 1
[checkpoint]
interval = 6
)";

std::map<std::string, at::Tensor> read_model(const std::string& path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  std::map<std::string, at::Tensor> tensors;
  for (const std::string& key : archive.keys()) {
    at::Tensor t;
    if (archive.try_read(key, t) || archive.try_read(key, t, true)) tensors[key] = t;
  }
  return tensors;
}

int run(const std::string& command) { return std::system((command + " > /dev/null 2>&1").c_str()); }

std::string mpirun(int ranks) {
  return std::string("mpirun --allow-run-as-root --oversubscribe -np ") + std::to_string(ranks) + " ";
}

class DataParallelJob : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  }
};

TEST_P(DataParallelJob, RanksTrainTheSingleRankModel) {
  const int ranks = GetParam();
  TempDir dir;
  const std::string config = dir.write("job.toml", kMlp);
  ASSERT_EQ(run(std::string(HT_BINARY) + " " + config + " --job.output_dir=" + dir.path("one")), 0);
  ASSERT_EQ(run(mpirun(ranks) + HT_BINARY + " " + config + " --job.output_dir=" + dir.path("many")), 0);
  const auto one = read_model(dir.path("one/checkpoints/step_00000006/model.pt"));
  const auto many = read_model(dir.path("many/checkpoints/step_00000006/model.pt"));
  ASSERT_FALSE(one.empty());
  ASSERT_EQ(one.size(), many.size());
  for (const auto& [key, t] : one) {
    ASSERT_TRUE(many.count(key)) << key;
    EXPECT_TRUE(at::allclose(many.at(key), t, 1e-4, 1e-6)) << key << ": max difference "
                                                           << (many.at(key) - t).abs().max().item<double>();
  }
  const std::string metrics = read_file(dir.path("many/metrics.jsonl"));
  EXPECT_THAT(metrics, HasSubstr("\"comm_ms\""));
  EXPECT_THAT(metrics, HasSubstr("\"comm_bytes\""));
  EXPECT_THAT(read_file(dir.path("many/config.resolved.toml")), HasSubstr("data_parallel = " + std::to_string(ranks)));
}

INSTANTIATE_TEST_SUITE_P(TwoAndFourRanks, DataParallelJob, ::testing::Values(2, 4));

TEST(DataParallelJobErrors, ABatchThatDoesNotDivideOrAWrongReplicaCount) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", kMlp);
  const std::string log = dir.path("log.txt");
  EXPECT_NE(std::system((mpirun(3) + HT_BINARY + " " + config + " --job.output_dir=" + dir.path("x") + " > " + log +
                         " 2>&1").c_str()), 0);
  EXPECT_THAT(read_file(log), HasSubstr("training.global_batch_size = 32 does not divide among 3 data-parallel ranks; "
                                        "use a multiple of 3 (e.g. 33)"));
  EXPECT_NE(std::system((std::string(HT_BINARY) + " " + config + " --parallel.data_parallel=2 --job.output_dir=" +
                         dir.path("y") + " > " + log + " 2>&1").c_str()), 0);
  EXPECT_THAT(read_file(log), HasSubstr("parallel.data_parallel = 2 but the job has 1 data-parallel rank(s); start it "
                                        "with mpirun -np 2, or set parallel.data_parallel = 0 (all ranks)"));
}

}  // namespace
}  // namespace ht::test
