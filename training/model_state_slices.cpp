// ModelState: checkpoints as slices (training/slice_files.h), written by every rank of a
// job that holds less than the whole state (sharded replicas, tensor-parallel parts, either with
// pipeline stages) and read back by any layout: each rank writes what it holds and reads what it
// will hold, nothing is gathered. A tensor-parallel rank's tensors are recorded as its part of the
// whole tensor (models/decoder_split.h), without the padded vocabulary's rows; the replicated
// tensors, equal on every rank of the group, by its first rank.
#include "training/model_state.h"
#include "base/clock.h"

#include "base/user_error.h"
#include "training/optimizer.h"
#include "models/decoder.h"
#include "models/decoder_split.h"
#include "parallel/grid_group.h"
#include "alloc/byte_size.h"
#include "alloc/cpu_device_allocator.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>
#include <optional>

namespace ht {

ModelState::CheckpointPart ModelState::checkpoint_part(const std::string& name, const std::vector<int64_t>& sizes) const {
  CheckpointPart c;
  c.sizes = sizes;
  c.valid = 1;
  for (int64_t s : sizes) c.valid *= s;
  if (groups_.tensor() == nullptr) return c;
  const auto* decoder = dynamic_cast<const Decoder*>(&model_);
  TORCH_INTERNAL_ASSERT(decoder != nullptr, "checkpoint_part: a decoder split across a group");
  const ParameterSplit split = decoder_parameter_split(decoder->options(), name);
  if (!split.split()) {
    c.writer = groups_.tensor()->rank() == 0;  // equal on every rank of the group
    return c;
  }
  c.part.dim = split.dim;
  c.part.ranges = split.ranges;
  c.sizes = whole_sizes_of(decoder->options(), name, sizes);
  if (split.padding > 0) {  // rows of the padded vocabulary after the rank's own: not the whole's
    TORCH_INTERNAL_ASSERT(split.dim == 0 && !sizes.empty() && sizes[0] > 0, "checkpoint_part: padding of ", name);
    c.valid -= split.padding * (c.valid / sizes[0]);
  }
  return c;
}

void ModelState::add_slice(SliceFileWriter& out, const std::string& kind, const std::string& name,
                        const at::Tensor& param, int64_t offset, const at::Tensor& values) const {
  const CheckpointPart c = checkpoint_part(name, param.sizes().vec());
  if (!c.writer) return;
  if (c.part.whole()) {
    out.add(kind, name, param, offset, values);
    return;
  }
  const int64_t end = std::min(offset + values.numel(), c.valid);  // the padding is not written
  if (end > offset) out.add_part(kind, name, c.sizes, c.part, offset, values.reshape({-1}).narrow(0, 0, end - offset));
}

at::Tensor ModelState::read_slice(const SliceIndex& index, const std::string& kind, const std::string& name,
                               const at::Tensor& param, int64_t offset, int64_t length) const {
  const CheckpointPart c = checkpoint_part(name, param.sizes().vec());
  if (c.part.whole()) return index.read(kind, name, offset, length);
  HostAllocationScope host;
  at::Tensor out = at::zeros({length}, param.options().device(at::kCPU));  // the padding: zeros
  const int64_t end = std::min(offset + length, c.valid);
  if (end > offset) out.narrow(0, 0, end - offset).copy_(index.read_part(kind, name, c.part, offset, end - offset));
  return out;
}

std::vector<at::Tensor> ModelState::read_slice_state(const SliceIndex& index, const std::string& name,
                                                  const at::Tensor& param, int64_t offset, const at::Tensor& like) const {
  return read_sliced_state(index, name, like,
                           [&](const char* kind) { return read_slice(index, kind, name, param, offset, like.numel()); });
}

// Every rank writes the slices it holds: its pieces of the parameters and their optimizer state
// (sharded), or each parameter's part and its state (tensor parallelism without sharding: each
// stage's first replica); and each stage's first replica what every replica has whole (the
// parameters no bucket holds, the buffers). A rank's memory holds its share only.
void ModelState::with_job_group(const std::function<void(Communicator&)>& fn) {
  std::optional<GridGroup> stages, job;  // every rank of the job
  Communicator* group = &groups_.replicas().group();
  if (layout_.stage) group = &stages.emplace(*group, *groups_.pipeline());
  if (groups_.tensor() != nullptr) group = &job.emplace(groups_.tensor()->communicator(), *group);
  fn(*group);
}

void ModelState::write_slices(SliceFileWriter& out) const {
  const bool adamw = optimizer_name(optimizer()) == "adamw";
  if (optimizer_.shard() != nullptr) {
    write_pieces(out, adamw);
  } else if (groups_.replicas().rank() == 0) {
    write_parameters(out, adamw);
  }
  if (groups_.replicas().rank() != 0) return;  // each stage's first replica: what every replica has whole
  const std::set<const void*> bucketed = bucketed_parameters();
  const auto params = model_.named_parameters();
  for (size_t i = 0; i < params.size() && optimizer_.shard() != nullptr; ++i) {
    const at::Tensor& p = params[i].value();
    if (bucketed.count(p.unsafeGetTensorImpl()) == 0 && writes_whole_parameter(i, p)) {
      add_slice(out, "param", params[i].key(), p, 0, memory_order(p));
    }
  }
  const auto buffers = model_.named_buffers();
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (layout_.stage && !layout_.stage->share().own_buffer[i]) continue;
    add_slice(out, "buffer", buffers[i].key(), buffers[i].value(), 0, memory_order(buffers[i].value()));
  }
}

// Every rank writes the slices it holds: its pieces of the parameters and their optimizer state
// (sharded), or each parameter's part and its state (tensor parallelism without sharding: each
// stage's first replica); and each stage's first replica what every replica has whole (the
// parameters no bucket holds, the buffers). A rank's memory holds its share only.
void ModelState::save_sliced(const CheckpointStore& store, const TrainerState& state, Progress& progress) {
  const std::string kind = optimizer_name(optimizer());
  // A large model's share takes a while to write: say so before, and how long after.
  int64_t bytes = 0;
  for (const at::Tensor& t : optimizer_.master()) {
    bytes += static_cast<int64_t>(t.nbytes());
    for (const at::Tensor& s : optimizer_state(optimizer(), t)) bytes += static_cast<int64_t>(s.nbytes());  // moments in their dtype
  }
  const auto start = std::chrono::steady_clock::now();
  if (bytes > (int64_t{1} << 30)) {
    progress.line("checkpoint of step " + std::to_string(state.step) + ": each rank writes its slices, " +
                   format_bytes(bytes) + " here");
  }
  with_job_group([&](Communicator& writers) {
    writers.set_context("the checkpoint after step " + std::to_string(state.step));
    const std::string folder =
        store.save_sliced(writers, state, kind, [&](SliceFileWriter& out) { write_slices(out); });
    char took[64];
    std::snprintf(took, sizeof took, " (slices of %d ranks, %.1f s)", writers.size(), seconds_since(start));
    progress.line("checkpoint " + folder + took);
  });
}

// A sharded rank's pieces of the parameters, and their optimizer state.
void ModelState::write_pieces(SliceFileWriter& out, bool adamw) const {
  const std::map<const void*, std::string> names = parameter_names();
  const std::vector<at::Tensor>& pieces = optimizer_.shard()->pieces();
  for (size_t i = 0; i < pieces.size(); ++i) {
    const OptimizerShard::PieceOf p = optimizer_.shard()->piece_of(i);
    if (layout_.stage && layout_.stage->holds_tied_copy(*p.param)) continue;  // the registering stage writes it
    const std::string& name = names.at(p.param->unsafeGetTensorImpl());
    add_slice(out, "param", name, *p.param, p.offset, pieces[i]);
    write_state(out, name, *p.param, p.offset, optimizer_state(optimizer(), pieces[i]), adamw);
  }
}

// Each of the stage's parameters (a tensor-parallel rank's part of it), and its optimizer state.
void ModelState::write_parameters(SliceFileWriter& out, bool adamw) const {
  const auto params = model_.named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i].value();
    if (!writes_whole_parameter(i, p)) continue;
    add_slice(out, "param", params[i].key(), p, 0, memory_order(p));
    write_state(out, params[i].key(), p, 0, optimizer_state(optimizer(), p), adamw);
  }
}

void ModelState::write_state(SliceFileWriter& out, const std::string& name, const at::Tensor& param, int64_t offset,
                          const std::vector<at::Tensor>& state, bool adamw) const {
  if (state.empty()) return;  // never stepped
  if (adamw && offset == 0 && checkpoint_part(name, param.sizes().vec()).writer) {
    out.add_step(name, state[0].item<int64_t>());
  }
  for (size_t k = adamw ? 1 : 0, kind = 0; k < state.size(); ++k, ++kind) {
    add_slice(out, "state" + std::to_string(kind), name, param, offset, memory_order(state[k]));
  }
}

bool ModelState::writes_whole_parameter(size_t index, const at::Tensor& param) const {
  return !layout_.stage || (layout_.stage->share().own_param[index] && !layout_.stage->holds_tied_copy(param));
}

std::set<const void*> ModelState::bucketed_parameters() const {
  std::set<const void*> bucketed;
  for (const at::Tensor& t : groups_.replicas().reduction_order()) bucketed.insert(t.unsafeGetTensorImpl());
  return bucketed;
}

std::map<const void*, std::string> ModelState::parameter_names() const {
  std::map<const void*, std::string> names;
  for (const auto& p : model_.named_parameters()) names[p.value().unsafeGetTensorImpl()] = p.key();
  return names;
}

namespace {

UserError slices_do_not_fit(const std::string& folder, const std::string& why) {
  return UserError(folder + ": this checkpoint does not fit the configured model or optimizer: " + why +
                   "; resume with the config it was saved with");
}

// The configured tensor's whole shape and dtype against the checkpoint's record of it.
void check_slice_record(const SliceIndex& index, const std::string& folder, const char* kind, const std::string& name,
                        const std::vector<int64_t>& sizes, at::ScalarType dtype) {
  const SlicedTensor* t = index.find(kind, name);
  if (t == nullptr) throw slices_do_not_fit(folder, "it has no tensor " + name);
  if (t->sizes != sizes || t->dtype != dtype) {
    throw slices_do_not_fit(folder, name + " is " + c10::str(t->dtype, at::IntArrayRef(t->sizes)) + " there but " +
                                        c10::str(dtype, at::IntArrayRef(sizes)) + " in the configured model");
  }
}

}  // namespace

// Each rank reads back only the ranges its stage, part and pieces cover, whatever layout wrote them.
TrainerState ModelState::load_slices(const std::string& folder) {
  const SliceIndex index(folder);
  const std::string kind = optimizer_name(optimizer());
  if (index.optimizer() != kind) {
    throw slices_do_not_fit(folder, "its optimizer state is " + index.optimizer() + "'s, the configured optimizer " +
                                        kind);
  }
  at::NoGradGuard no_grad;
  read_whole_tensors_from_slices(index, folder);
  if (optimizer_.shard() != nullptr) {
    read_pieces_from_slices(index);
  } else {
    read_state_from_slices(index);
  }
  return CheckpointStore::load_trainer_state(folder);
}

// Every parameter and buffer checked; the buffers and the parameters every rank holds whole
// (all but ZeRO-3's sharded ones, and a pipeline stage's own only) read whole.
void ModelState::read_whole_tensors_from_slices(const SliceIndex& index, const std::string& folder) {
  size_t tensors = 0;
  const std::set<const void*> bucketed = bucketed_parameters();
  const auto params = model_.named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i].value();
    const bool held = !layout_.stage || layout_.stage->share().own_param[i];  // a stage's tensors of others are empty
    const std::vector<int64_t> sizes = held ? p.sizes().vec() : layout_.stage->share().param_sizes[i];
    check_slice_record(index, folder, "param", params[i].key(), checkpoint_part(params[i].key(), sizes).sizes,
                       p.scalar_type());
    ++tensors;
    if (!held || (layout_.parameter_shards && bucketed.count(p.unsafeGetTensorImpl()) != 0)) continue;  // by pieces
    memory_order(p).copy_(read_slice(index, "param", params[i].key(), p, 0, p.numel()));
  }
  const auto buffers = model_.named_buffers();
  for (size_t i = 0; i < buffers.size(); ++i) {
    const at::Tensor& b = buffers[i].value();
    const bool held = !layout_.stage || layout_.stage->share().own_buffer[i];
    const std::vector<int64_t> sizes = held ? b.sizes().vec() : layout_.stage->share().buffer_sizes[i];
    check_slice_record(index, folder, "buffer", buffers[i].key(), checkpoint_part(buffers[i].key(), sizes).sizes,
                       b.scalar_type());
    ++tensors;
    if (held) memory_order(b).copy_(read_slice(index, "buffer", buffers[i].key(), b, 0, b.numel()));
  }
  const size_t saved = index.names("param").size() + index.names("buffer").size();
  if (tensors != saved) {
    throw slices_do_not_fit(folder, "it holds " + std::to_string(saved) + " tensors, the configured model " +
                                        std::to_string(tensors));
  }
}

// This rank's pieces: their optimizer state, and at ZeRO-3 their parameters' values.
void ModelState::read_pieces_from_slices(const SliceIndex& index) {
  const std::map<const void*, std::string> names = parameter_names();
  const std::vector<at::Tensor>& pieces = optimizer_.shard()->pieces();
  for (size_t i = 0; i < pieces.size(); ++i) {
    const OptimizerShard::PieceOf p = optimizer_.shard()->piece_of(i);
    const std::string& name = names.at(p.param->unsafeGetTensorImpl());
    at::Tensor piece = pieces[i];
    if (layout_.parameter_shards) piece.copy_(read_slice(index, "param", name, *p.param, p.offset, p.length));
    const std::vector<at::Tensor> state = read_slice_state(index, name, *p.param, p.offset, piece);
    if (state.empty()) {
      drop_optimizer_state(optimizer(), piece);
    } else {
      set_optimizer_state(optimizer(), piece, state);
    }
  }
}

// Without sharding: the optimizer state of each parameter the stage holds (a part of it with
// tensor parallelism).
void ModelState::read_state_from_slices(const SliceIndex& index) {
  const auto params = model_.named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor p = params[i].value();
    if (layout_.stage && !layout_.stage->share().own_param[i]) continue;
    const std::vector<at::Tensor> state = read_slice_state(index, params[i].key(), p, 0, p);
    if (state.empty()) {
      drop_optimizer_state(optimizer(), p);
    } else {
      set_optimizer_state(optimizer(), p, state);
    }
  }
}

}  // namespace ht
