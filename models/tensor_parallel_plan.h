#pragma once
// The decoder's tensor-parallel plan: how each of its layers splits across the ranks of a group
// (DecoderOptions::tensor_parallel), one entry per layer, as torchtitan's parallelize plans say
// it. The decoder applies it where it builds each layer: the layer keeps its style and this rank's
// part of its weights (models/decoder.cpp: PlannedLinear), and its forward runs the style it was
// given. A checkpoint maps a rank's parts to the whole tensors by the same entries
// (models/decoder_split.h), so there is no second list of names to keep in step with the layers.
//
//   embed.wte, head.lm_head   vocabulary   rows of the padded vocabulary (rank r: r V_p/t ..)
//   attn.wqkv                 column-wise  rank r's query heads, then its key heads, then its value heads
//   attn.wo                   row-wise     rank r's heads' columns; the bias whole, added after the sum
//   mlp.fc / mlp.w13          column-wise  the hidden width (Llama: rank r's gate rows, then its up rows)
//   mlp.proj / mlp.w2         row-wise     the hidden width's columns
//   everything else           replicated   (norms, wpe: whole on every rank; with sequence
//                                          parallelism read on pieces of the sequence)

#include "models/decoder_options.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ht {

enum class ParallelStyle : uint8_t {
  kReplicated,  // every rank holds the whole
  kColumnwise,  // output features split: the weight's rows and the bias's
  kRowwise,     // input features split: the weight's columns; the bias whole, added once summed
  kVocabulary,  // the padded vocabulary's rows (the embedding's lookup, the output layer)
};

struct LayerSplit {
  std::string layer;  // the layer's path below its block ("attn.wqkv"), or the block's and its ("embed.wte")
  ParallelStyle style = ParallelStyle::kReplicated;
  // The widths of the split dimension's parts, each split on its own: a column-wise layer's outputs
  // side by side (queries, keys, values; the MLP's gate and up), a row-wise layer's input.
  std::vector<int64_t> parts;
};

// The split layers of the decoder `o` describes (its shape: heads, widths, vocabulary).
std::vector<LayerSplit> decoder_parallel_plan(const DecoderOptions& o);
// The entry of the layer `path` names ("h3.attn.wqkv", "embed.wte"; a parameter's name without
// ".weight" or ".bias"); replicated where the plan has none.
LayerSplit layer_split_of(const DecoderOptions& o, const std::string& path);

}  // namespace ht
