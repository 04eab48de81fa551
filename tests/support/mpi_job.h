#pragma once
// What the tests that run hybrid_train under mpirun share: the command prefix, a quiet run, and a
// checkpoint's model read back by tensor name.

#include "training/checkpoint.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

namespace ht::test {

// A checkpoint's model by tensor name: its folder (either layout: whole or a sharded run's
// slices), or its model.pt file.
inline std::map<std::string, at::Tensor> read_model(const std::string& path) {
  const std::filesystem::path p(path);
  return CheckpointStore::model_tensors(std::filesystem::is_directory(p) ? path : p.parent_path().string());
}

// Every tensor of two checkpoints' models (model.pt files or folders) close: at::allclose(other, one, rtol, atol) for each name.
inline void expect_close_models(const std::string& a, const std::string& b, double rtol, double atol) {
  const auto one = read_model(a), other = read_model(b);
  ASSERT_FALSE(one.empty()) << a;
  ASSERT_EQ(one.size(), other.size());
  for (const auto& [key, t] : one) {
    ASSERT_TRUE(other.count(key)) << key;
    EXPECT_TRUE(at::allclose(other.at(key), t, rtol, atol)) << key << ": max difference "
                                                          << (other.at(key) - t).abs().max().item<double>();
  }
}

// Every tensor of two checkpoints' models (model.pt files or folders) equal: bit for bit with
// `tolerance` 0, else each within it (the largest absolute difference).
inline void expect_same_model(const std::string& a, const std::string& b, double tolerance = 0) {
  const auto one = read_model(a), other = read_model(b);
  ASSERT_FALSE(one.empty()) << a;
  ASSERT_EQ(one.size(), other.size()) << a << " and " << b;
  for (const auto& [key, t] : one) {
    ASSERT_TRUE(other.count(key)) << key;
    const double diff = (other.at(key).to(at::kDouble) - t.to(at::kDouble)).abs().max().item<double>();
    if (tolerance == 0) {
      EXPECT_TRUE(at::equal(other.at(key), t)) << key << ": max difference " << diff;
    } else {
      EXPECT_LE(diff, tolerance) << key;
    }
  }
}

// A GPT of 2 layers at width 32 on synthetic tokens, AdamW: the small decoder the planning and
// sharding tests train.
inline constexpr const char* kTinyGpt = R"([model]
name = "gpt"
n_layer = 2
n_head = 2
n_embd = 32
block_size = 16
[data]
dataset = "synthetic"
synthetic_samples = 256
synthetic_eval_samples = 16
synthetic_shape = [16]
synthetic_classes = 50
[training]
steps = 4
global_batch_size = 16
optimizer = "adamw"
[metrics]
log_interval = 1
)";

// A ConvNet of two convolution blocks and a classifier on 16x16 synthetic images, channels-last
// (the default for image models): 32 images a step, 4 steps.
inline constexpr const char* kTinyConvNet = R"([model]
name = "convnet"
channels = [8, 16]
fc_hidden = 32
[data]
dataset = "synthetic"
synthetic_samples = 256
synthetic_eval_samples = 16
synthetic_shape = [1, 16, 16]
[training]
steps = 4
global_batch_size = 32
[metrics]
log_interval = 1
)";

// A Llama of 8 layers whose activations are most of its peak, 2 ranks x 2 micro-batches of 16, 3
// steps, a checkpoint at the end: the job the multi-rank tests put under a DTR budget (a small
// ResNet's parameters, optimizer state and largest op leave no 40% budget workable).
inline constexpr const char* kEightLayerLlama = R"([model]
name = "llama"
n_layer = 8
n_head = 4
n_kv_heads = 2
n_embd = 32
multiple_of = 16
block_size = 64
[data]
dataset = "text"
path = "/usr/share/common-licenses/GPL-3"
[training]
steps = 3
global_batch_size = 64
micro_batch_size = 16
eval_batches = 1
threads = 1
[checkpoint]
interval = 3
)";

// The exit status of `command`, its output discarded.
inline int run(const std::string& command) { return std::system((command + " > /dev/null 2>&1").c_str()); }

// The exit status of `command`, its output (stdout and stderr) in `log`.
inline int run_logged(const std::string& command, const std::string& log) {
  return std::system((command + " > " + log + " 2>&1").c_str());
}

// The number after `"key": ` in the last line of a metrics file that has it; -1 where none has.
inline int64_t last_number(const std::string& metrics, const std::string& key) {
  const size_t at = metrics.rfind("\"" + key + "\": ");
  if (at == std::string::npos) return -1;
  return std::stoll(metrics.substr(at + key.size() + 4));
}

inline bool have_mpirun() { return run("mpirun --version") == 0; }

inline std::string mpirun(int ranks) {
  return std::string("mpirun --allow-run-as-root --oversubscribe -np ") + std::to_string(ranks) + " ";
}

}  // namespace ht::test
