#pragma once
// What the tests that run hybrid_train under mpirun share: the command prefix, a quiet run, and a
// checkpoint's model.pt read back by tensor name.

#include <torch/serialize/input-archive.h>

#include <cstdlib>
#include <map>
#include <string>

namespace ht::test {

inline std::map<std::string, at::Tensor> read_model(const std::string& path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  std::map<std::string, at::Tensor> tensors;
  for (const std::string& key : archive.keys()) {
    at::Tensor t;
    if (archive.try_read(key, t) || archive.try_read(key, t, true)) tensors[key] = t;
  }
  return tensors;
}

// The exit status of `command`, its output discarded.
inline int run(const std::string& command) { return std::system((command + " > /dev/null 2>&1").c_str()); }

inline std::string mpirun(int ranks) {
  return std::string("mpirun --allow-run-as-root --oversubscribe -np ") + std::to_string(ranks) + " ";
}

}  // namespace ht::test
