#include "parallel/pipeline_layout.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace ht {

std::vector<int64_t> PipelineLayout::input_sizes(int vs, int64_t n) const {
  std::vector<int64_t> sizes = profile.out_sizes[static_cast<size_t>(blocks_begin(vs) - 1)];
  sizes[0] = n;
  return sizes;
}

at::ScalarType PipelineLayout::input_dtype(int vs) const {
  return profile.out_dtype[static_cast<size_t>(blocks_begin(vs) - 1)];
}

uint64_t PipelineLayout::seeds_before(int block) const {
  uint64_t seeds = 0;
  for (int b = 0; b < block; ++b) seeds += profile.seeds[static_cast<size_t>(b)];
  return seeds;
}

PipelineLayout lay_out_pipeline(const PipelineRequest& request, const Model& model, BlockProfile profile) {
  PipelineLayout layout;
  layout.kind = request.kind;
  layout.shape = request.shape;
  const int blocks = static_cast<int>(model.blocks().size());
  if (layout.virtual_stages() > blocks) {
    throw std::invalid_argument(std::to_string(layout.virtual_stages()) + " stages, but the model has " +
                                std::to_string(blocks) + " blocks; use at most " + std::to_string(blocks) +
                                " stages in all");
  }
  for (size_t b = 0; b < profile.costs.size(); ++b) {
    profile.costs[b].name = model.block_names()[b];
  }
  PartitionOptions options;
  options.stages = layout.virtual_stages();
  options.in_flight = in_flight_per_virtual_stage(layout.kind, layout.shape);
  options.memory_limit_bytes = request.memory_limit_bytes;
  layout.counts_given = !request.stage_blocks.empty();
  layout.partition = layout.counts_given ? partition_from_counts(profile.costs, request.stage_blocks, options)
                                         : balance_stages(profile.costs, options);
  for (const StagePlan& s : layout.partition.stages) layout.first_block.push_back(s.first_block);
  layout.first_block.push_back(blocks);
  layout.profile = std::move(profile);
  layout.costs = request.costs;
  return layout;
}

std::string describe_pipeline(const PipelineLayout& layout) {
  std::string text = std::string("pipeline: ") + choice_name(layout.kind) + ", " +
                     std::to_string(layout.shape.stages) + " stages";
  if (layout.shape.virtual_stages > 1) text += " x " + std::to_string(layout.shape.virtual_stages) + " chunks";
  text += ", " + std::to_string(layout.shape.micro_batches) + " micro-batches of " +
          std::to_string(layout.profile.micro_batch) + "; " +
          (layout.counts_given ? std::string("blocks as parallel.stage_blocks says")
                               : std::string("blocks balanced by ") + choice_name(layout.costs) + " time") + ":\n";
  text += format_stage_table(layout.profile.costs, layout.partition);
  text += "\nblock ms (forward + backward of a micro-batch):";
  for (const BlockCost& c : layout.profile.costs) {
    char block[96];
    std::snprintf(block, sizeof block, " %s %.3f", c.name.c_str(), c.forward_ms + c.backward_ms);
    text += block;
  }
  PartitionOptions options;
  options.stages = layout.virtual_stages();
  const Partition by_params = partition_by_parameters(layout.profile.costs, options);
  char line[160];
  std::snprintf(line, sizeof line, "\n(split by parameter count instead: slowest stage %.2f ms, %.2fx the mean)",
                by_params.slowest_ms, by_params.mean_ms > 0 ? by_params.slowest_ms / by_params.mean_ms : 1.0);
  return text + line;
}

namespace {

int rank_of_block(const PipelineLayout& layout, int block) {
  for (int vs = 0; vs < layout.virtual_stages(); ++vs) {
    if (block < layout.blocks_end(vs)) return rank_of_virtual_stage(vs, layout.shape);
  }
  return rank_of_virtual_stage(layout.virtual_stages() - 1, layout.shape);
}

// Rank of the block registering each tensor (by TensorImpl) that `of` lists.
template <typename Of>
std::vector<int> owners(const Model& model, const PipelineLayout& layout, std::vector<at::Tensor> all, Of of) {
  std::unordered_map<const void*, int> rank;
  const auto& blocks = model.blocks();
  for (size_t b = 0; b < blocks.size(); ++b)
    for (const at::Tensor& t : of(*blocks[b]))
      rank.emplace(t.unsafeGetTensorImpl(), rank_of_block(layout, static_cast<int>(b)));
  std::vector<int> result;
  for (const at::Tensor& t : all) {
    auto it = rank.find(t.unsafeGetTensorImpl());
    result.push_back(it == rank.end() ? 0 : it->second);  // a tensor outside the blocks: rank 0's
  }
  return result;
}

}  // namespace

std::vector<int> parameter_owners(const Model& model, const PipelineLayout& layout) {
  return owners(model, layout, model.parameters(), [](const Block& b) { return b.parameters(); });
}

std::vector<int> buffer_owners(const Model& model, const PipelineLayout& layout) {
  return owners(model, layout, model.buffers(), [](const Block& b) { return b.buffers(); });
}

std::vector<TiedParameter> tied_parameters(const Model& model, const PipelineLayout& layout) {
  const std::vector<at::Tensor> params = model.parameters();
  const std::vector<int> owner = parameter_owners(model, layout);
  std::vector<TiedParameter> tied;
  const auto& blocks = model.blocks();
  for (size_t b = 0; b < blocks.size(); ++b) {
    const int user = rank_of_block(layout, static_cast<int>(b));
    for (const at::Tensor& shared : blocks[b]->shared_parameters()) {
      for (size_t i = 0; i < params.size(); ++i) {
        if (!params[i].is_same(shared) || owner[i] == user) continue;
        tied.push_back(TiedParameter{params[i], owner[i], user});
      }
    }
  }
  return tied;
}

std::vector<at::Tensor> stage_parameters(const Model& model, const PipelineLayout& layout, int rank) {
  const std::vector<at::Tensor> params = model.parameters();
  const std::vector<int> owner = parameter_owners(model, layout);
  std::unordered_set<const void*> used;
  for (const TiedParameter& t : tied_parameters(model, layout))
    if (t.user == rank) used.insert(t.param.unsafeGetTensorImpl());
  std::vector<at::Tensor> mine;
  for (size_t i = 0; i < params.size(); ++i) {
    if (owner[i] == rank || used.count(params[i].unsafeGetTensorImpl())) mine.push_back(params[i]);
  }
  return mine;
}

}  // namespace ht
