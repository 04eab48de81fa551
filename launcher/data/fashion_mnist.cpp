#include "launcher/data/fashion_mnist.h"

#include "base/user_error.h"

#include <zlib.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

namespace ht {
namespace {

constexpr double kMean = 0.2860, kStd = 0.3530;  // Fashion-MNIST training set, pixels in [0, 1]

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

// Reads an idx file (gzip or plain): big-endian magic, dims, then unsigned bytes.
at::Tensor read_idx(const std::string& path, int expected_dims) {
  std::unique_ptr<gzFile_s, GzCloser> file(gzopen(path.c_str(), "rb"));
  if (!file) {
    throw UserError(path + ": cannot open Fashion-MNIST file; install Debian's dataset-fashion-mnist "
                    "or set the data path to a folder holding the four idx files");
  }
  auto read_be32 = [&](const char* what) {
    std::array<unsigned char, 4> b{};
    if (gzread(file.get(), b.data(), 4) != 4) {
      throw UserError(path + ": truncated idx header (" + what + "); the file is damaged");
    }
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
  };
  const uint32_t magic = read_be32("magic");
  if ((magic >> 8) != 0x08 || static_cast<int>(magic & 0xff) != expected_dims) {
    throw UserError(path + ": not an idx file of unsigned bytes with " +
                    std::to_string(expected_dims) + " dimensions (magic " + std::to_string(magic) +
                    ")");
  }
  std::vector<int64_t> dims;
  int64_t count = 1;
  for (int i = 0; i < expected_dims; ++i) {
    dims.push_back(read_be32("dimension"));
    count *= dims.back();
  }
  at::Tensor data = at::empty(dims, at::kByte);
  int64_t done = 0;
  while (done < count) {
    const int chunk = static_cast<int>(std::min<int64_t>(count - done, 1 << 30));
    const int got = gzread(file.get(), data.data_ptr<uint8_t>() + done, chunk);
    if (got <= 0) {
      throw UserError(path + ": truncated: expected " + std::to_string(count) + " bytes of data, got " +
                      std::to_string(done));
    }
    done += got;
  }
  return data;
}

std::string find_file(const std::string& dir, const std::string& stem) {
  for (const char* suffix : {".gz", ""}) {
    const std::string path = (std::filesystem::path(dir) / (stem + suffix)).string();
    if (std::filesystem::exists(path)) return path;
  }
  throw UserError("no " + stem + "[.gz] in this folder; install Debian's dataset-fashion-mnist (files in " +
                  kDefaultFashionMnistDir + ") or point data.path at a folder holding the idx files");
}

}  // namespace

ImageSet load_fashion_mnist(const std::string& dir, const std::string& split) {
  if (split != "train" && split != "test") {
    throw UserError("Fashion-MNIST split '" + split + "' does not exist; use 'train' or 'test'");
  }
  const std::string prefix = split == "train" ? "train" : "t10k";
  at::Tensor images = read_idx(find_file(dir, prefix + "-images-idx3-ubyte"), 3);
  at::Tensor labels = read_idx(find_file(dir, prefix + "-labels-idx1-ubyte"), 1);
  if (images.size(0) != labels.size(0) || images.size(1) != 28 || images.size(2) != 28) {
    throw UserError(dir + ": " + split + " images " + c10::str(images.sizes()) + " and labels " +
                    c10::str(labels.sizes()) + " do not match Fashion-MNIST's N x 28 x 28 and N");
  }
  ImageSet set;
  set.images = images.to(at::kFloat).div_(255.0).sub_(kMean).div_(kStd).unsqueeze(1);
  set.labels = labels.to(at::kLong);
  if (set.labels.max().item<int64_t>() >= 10) {
    throw UserError(dir + ": " + split + " labels outside [0, 10): not Fashion-MNIST");
  }
  return set;
}

}  // namespace ht
