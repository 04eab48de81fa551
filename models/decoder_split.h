#pragma once
// How the decoder's parameters split across the ranks of a tensor-parallel group
// (DecoderOptions::tensor_parallel), as plain data: which dimension of the whole parameter a rank
// holds a part of, and which ranges of it, in order, read off the decoder's tensor-parallel plan
// (models/tensor_parallel_plan.h: a column-wise layer's rows, a row-wise layer's columns, the
// vocabulary's rows). The decoder slices its whole initialization by it (so that every layout
// starts from the one-rank run's weights), and a checkpoint that records each tensor's whole
// shape maps parts to wholes by it.

#include "models/decoder_options.h"

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace ht {

struct ParameterSplit {
  int64_t dim = -1;  // -1: every rank holds the whole
  std::vector<std::pair<int64_t, int64_t>> ranges;  // (start, length) along dim, concatenated
  int64_t padding = 0;  // rows of zeros after them (the padded vocabulary)
  bool split() const { return dim >= 0; }
};

// Rank options.tensor_rank's part of parameter `name` (a name of Decoder's).
ParameterSplit decoder_parameter_split(const DecoderOptions& options, const std::string& name);
// The whole of a split parameter from every rank's part (`parts[r]` rank r's, in rank order).
at::Tensor whole_of(const DecoderOptions& options, const std::string& name, const std::vector<at::Tensor>& parts);
// The whole parameter's sizes from those of a rank's part: every rank's ranges along the split
// dimension, without the padding (the one-rank model's sizes).
std::vector<int64_t> whole_sizes_of(const DecoderOptions& options, const std::string& name,
                                    std::vector<int64_t> part_sizes);
// The part of `whole` that the split describes (a new tensor).
at::Tensor part_of(const at::Tensor& whole, const ParameterSplit& split);

}  // namespace ht
