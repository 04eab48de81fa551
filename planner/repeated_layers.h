#pragma once
// A deep decoder's step from a trace of a few of its layers (issue 33: "do not re-trace what can
// be derived exactly"). Llama 3 70B's 80 layers are one layer 80 times: tracing every one on meta
// tensors took 1.6-2.4 s a tensor-parallel size, most of a 70B search. A step traced with three
// layers has each layer's forward and backward as one run of events (a segment) that reads the
// segments of the layers beside it and of the blocks before and after (the embedding, the
// head); copying the middle layer's segments, each copy reading its own neighbours, gives the
// deep model's step in the order its recorder would have written it: the same tensors, kernels
// and events, index for index. A block that is not a layer reads no layer but the first and the
// last, except to free what the copied layer made (the autocast cache's copies, released in the
// order they were cast when forward ends): each such run of frees is written once per copy. launcher/planning/layer_traces.h checks that on every traced
// point (three layers stretched to four against four traced) before it uses one.

#include "planner/step_trace.h"

#include <map>
#include <string>
#include <vector>

namespace ht {

// How the shallow trace's blocks become the deep model's: blocks [first, first + layers) are the
// identical layers, and block first + 1 is copied until there are target_layers.
struct LayerRepeat {
  int first = 1;          // the first layer's block (a decoder's: after the embedding)
  int layers = 3;         // in the shallow trace: at least three (the copied one has a layer each side)
  int target_layers = 3;  // in the deep model
  // Gradient buckets (cut at blocks, ModelProfile::block_buckets) by block: the shallow model's
  // bucket indices and the deep model's, each block's in reduction order (-1: parameters no block
  // holds). A shallow bucket becomes the deep bucket at its place in the mapped block's list.
  std::map<int, std::vector<int>> shallow_buckets, deep_buckets;

  int added() const { return target_layers - layers; }
  int repeated() const { return first + 1; }
};

// The shallow step with its middle layer copied (`why` empty), or an empty trace and why not: a
// block whose kernels are not one run, a layer that reads one that is not beside it, a bucket
// that has no counterpart. The persistent bytes are the shallow trace's (the caller's to set).
StepTrace repeat_layers(const StepTrace& shallow, const LayerRepeat& repeat, std::string& why);

// The buckets backward reads (TraceExtras::backward_read_buckets), mapped likewise: the copied
// layer's for every copy. Sorted, as the tracer writes them.
std::vector<size_t> repeat_buckets(const std::vector<size_t>& shallow, const LayerRepeat& repeat);
// Per bucket values (ProfilePoint::fp32_read_elements), mapped likewise. Sorted by bucket.
std::vector<std::pair<size_t, int64_t>> repeat_bucket_elements(const std::vector<std::pair<size_t, int64_t>>& shallow,
                                                               const LayerRepeat& repeat);

// The most bytes alive at once over the trace's events: the arena's in-use peak above what was
// alive when the step began (CpuArena counts its blocks' rounded sizes; placement does not enter).
int64_t live_peak_bytes(const StepTrace& trace);

// Whether two traces are one step: every tensor, kernel (its measured ms aside) and event, and
// the persistent bytes. Else false, and the first difference in `difference` if given.
bool same_step(const StepTrace& a, const StepTrace& b, std::string* difference = nullptr);

}  // namespace ht
