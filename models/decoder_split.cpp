#include "models/decoder_split.h"

#include "models/tensor_parallel_plan.h"

#include <ATen/ATen.h>

namespace ht {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

ParameterSplit decoder_parameter_split(const DecoderOptions& o, const std::string& name) {
  ParameterSplit s;
  const int64_t t = o.tensor_parallel, r = o.tensor_rank;
  if (t == 1) return s;
  const bool bias = ends_with(name, ".bias");
  const std::string path = name.substr(0, name.rfind('.'));
  const LayerSplit layer = layer_split_of(o, path);
  // Rank r's share of each part, the parts side by side.
  auto mine = [&](int dim) {
    s.dim = dim;
    int64_t offset = 0;
    for (int64_t width : layer.parts) {
      s.ranges.emplace_back(offset + r * (width / t), width / t);
      offset += width;
    }
  };
  switch (layer.style) {
    case ParallelStyle::kVocabulary: {
      const int64_t part = o.padded_vocab() / t, valid = o.vocab_rows_valid();
      s.dim = 0;
      s.ranges = {{o.vocab_first(), valid}};
      s.padding = part - valid;
      break;
    }
    case ParallelStyle::kColumnwise:
      mine(0);  // the weight's rows, and the bias's
      break;
    case ParallelStyle::kRowwise:
      if (!bias) mine(1);  // the weight's columns; the bias whole, added after the group's sum
      break;
    case ParallelStyle::kReplicated:
      break;
  }
  return s;
}

at::Tensor part_of(const at::Tensor& whole, const ParameterSplit& split) {
  if (!split.split()) return whole.clone();
  std::vector<at::Tensor> pieces;
  for (const auto& [start, length] : split.ranges) pieces.push_back(whole.narrow(split.dim, start, length));
  if (split.padding > 0) {
    std::vector<int64_t> pad = whole.sizes().vec();
    pad[split.dim] = split.padding;
    pieces.push_back(at::zeros(pad, whole.options()));
  }
  return at::cat(pieces, split.dim).contiguous();
}

std::vector<int64_t> whole_sizes_of(const DecoderOptions& o, const std::string& name,
                                    std::vector<int64_t> part_sizes) {
  const ParameterSplit mine = decoder_parameter_split(o, name);
  if (!mine.split()) return part_sizes;
  int64_t length = 0;
  for (int64_t r = 0; r < o.tensor_parallel; ++r) {
    DecoderOptions rank = o;
    rank.tensor_rank = r;
    for (const auto& range : decoder_parameter_split(rank, name).ranges) length += range.second;
  }
  part_sizes.at(static_cast<size_t>(mine.dim)) = length;
  return part_sizes;
}

at::Tensor whole_of(const DecoderOptions& o, const std::string& name, const std::vector<at::Tensor>& parts) {
  TORCH_CHECK(static_cast<int64_t>(parts.size()) == o.tensor_parallel, "whole_of: ", parts.size(), " parts of ", name,
              " for tensor_parallel = ", o.tensor_parallel);
  std::vector<ParameterSplit> splits;
  int64_t length = 0;
  for (int64_t r = 0; r < o.tensor_parallel; ++r) {
    DecoderOptions rank = o;
    rank.tensor_rank = r;
    splits.push_back(decoder_parameter_split(rank, name));
    for (const auto& range : splits.back().ranges) length += range.second;
  }
  if (!splits.front().split()) return parts.front().clone();
  const int64_t dim = splits.front().dim;
  std::vector<int64_t> sizes = parts.front().sizes().vec();
  sizes[dim] = length;
  at::Tensor whole = at::empty(sizes, parts.front().options());
  for (size_t r = 0; r < parts.size(); ++r) {
    int64_t offset = 0;
    for (const auto& [start, n] : splits[r].ranges) {
      whole.narrow(dim, start, n).copy_(parts[r].narrow(dim, offset, n));
      offset += n;
    }
  }
  return whole;
}

}  // namespace ht
