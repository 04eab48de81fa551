#include "memory/step_capture.h"

#include "alloc/cpu_arena.h"
#include "runtime/op.h"

#include <algorithm>
#include <cstring>

namespace ht {
namespace {

uint64_t mix(uint64_t h, uint64_t v) {
  // splitmix64 over the running hash: order-sensitive and well spread.
  uint64_t z = h + 0x9E3779B97F4A7C15ull + v;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t hash_name(const char* name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const char* c = name; *c != '\0'; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  return h;
}

uint64_t hash_shape(uint64_t h, const TensorInfo& t) {
  h = mix(h, static_cast<uint64_t>(t.dtype));
  h = mix(h, t.sizes.size());
  for (int64_t d : t.sizes) h = mix(h, static_cast<uint64_t>(d));
  return h;
}

const TensorInfo& root_of(const TensorInfo& t) { return t.is_view() ? *t.base : t; }

}  // namespace

StepCapture::StepCapture(CpuArena* arena, int64_t fixed_bytes) : arena_(arena) {
  graph_.fixed_bytes = fixed_bytes;
}

int64_t StepCapture::bytes_of(const TensorInfo& t) const {
  if (t.nbytes <= 0) return 0;
  const void* data = t.value.defined() && t.value.has_storage() ? t.value.storage().data() : nullptr;
  if (data != nullptr && arena_->contains(data)) return arena_->block_bytes(data);
  const auto a = static_cast<int64_t>(CpuArena::kAlignment);
  return (t.nbytes + a - 1) / a * a;
}

int StepCapture::value_of(const TensorInfo* t) const {
  if (t == nullptr) return -1;
  auto it = value_index_.find(&root_of(*t));
  if (it == value_index_.end()) return -1;
  // A record of an earlier step may have died and its address been reused: check it is the same.
  return records_[it->second].lock().get() == it->first ? it->second : -1;
}

int StepCapture::forward_index_of(const ComputePath* path) const {
  auto it = forward_index_.find(path);
  return it == forward_index_.end() ? -1 : it->second;
}

int StepCapture::add_value(const std::shared_ptr<TensorInfo>& record, int producer) {
  const TensorInfo& t = *record;
  const int id = static_cast<int>(graph_.values.size());
  schedule::Value v;
  v.bytes = bytes_of(t);
  v.producer = producer;
  // A collective's output is kept: a plan is each rank's own, and a recomputation on one rank
  // alone would wait for the others forever.
  v.droppable = t.producer != nullptr && t.producer->op->traits().recomputable && !t.producer->op->traits().collective;
  graph_.values.push_back(v);
  resident_.push_back(0);
  taped_.push_back(0);
  records_.push_back(record);
  value_index_[&t] = id;
  if (t.resident()) on_resident(t);
  return id;
}

void StepCapture::kernel_begins() {
  resident_at_kernel_ = resident_bytes_;
  kernel_peak_ = 0;
  evicted_in_kernel_ = 0;
  in_kernel_ = true;
  arena_->begin_peak_window();
}

void StepCapture::kernel_ends() {
  fold_window();
  in_kernel_ = false;
}

void StepCapture::fold_window() {
  kernel_peak_ = std::max(kernel_peak_, arena_->window_peak() + evicted_in_kernel_);
}

int64_t StepCapture::working_bytes(int64_t outputs) const {
  return std::max<int64_t>(0, kernel_peak_ - graph_.fixed_bytes - resident_at_kernel_ - outputs);
}

uint64_t StepCapture::forward_op(const ComputePath& path, const std::vector<Tensor>& outputs, bool taped) {
  const int k = static_cast<int>(graph_.forward.size());
  forward_index_[&path] = k;
  schedule::ForwardOp op;
  op.cost_ms = path.kernel_ms();  // on a GPU, waits for this kernel (capture steps only)
  op.modeled_ms = path.modeled_ms;
  const OpTraits& traits = path.op->traits();
  uint64_t sig = hash_name(traits.name);
  for (size_t i = 0; i < path.inputs.size(); ++i) {
    const TensorInfo& in = *path.inputs[i];
    const int v = value_of(&in);
    sig = hash_shape(mix(sig, static_cast<uint64_t>(static_cast<int64_t>(v))), in);
    if (v < 0) continue;
    if (std::find(op.inputs.begin(), op.inputs.end(), v) == op.inputs.end()) op.inputs.push_back(v);
    graph_.values[v].last_forward_use = k;
    if (taped && (traits.saves_inputs & (1u << i))) ++taped_[v];
  }
  int64_t output_bytes = 0;
  for (size_t j = 0; j < outputs.size(); ++j) {
    const TensorInfo& out = *outputs[j].info();
    sig = hash_shape(sig, out);
    if (out.is_view()) continue;  // shares its root's bytes: reads of it are reads of the root
    const int v = add_value(outputs[j].info_ptr(), k);
    op.outputs.push_back(v);
    output_bytes += graph_.values[v].bytes;
    if (taped && (traits.saves_outputs & (1u << j))) ++taped_[v];
  }
  for (size_t j = 0; j < outputs.size(); ++j) {  // a saved view holds its root
    const TensorInfo& out = *outputs[j].info();
    const int v = value_of(&out);
    if (out.is_view() && v >= 0 && taped && (traits.saves_outputs & (1u << j))) ++taped_[v];
  }
  op.working_bytes = working_bytes(output_bytes);
  graph_.forward.push_back(std::move(op));
  signatures_.push_back(sig);
  return sig;
}

void StepCapture::forward_done() {
  // A handle beyond the tape's is the user's (the loss, the logits): the plan must leave it be.
  for (size_t v = 0; v < records_.size(); ++v) {
    std::shared_ptr<TensorInfo> t = records_[v].lock();
    if (t && t->handle_refs > taped_[v]) graph_.values[v].droppable = false;
  }
}

void StepCapture::backward_stage(const ComputePath& path, const std::vector<const TensorInfo*>& saved) {
  schedule::BackwardStage stage;
  stage.forward_op = forward_index_of(&path);
  for (const TensorInfo* t : saved) {
    const int v = value_of(t);
    if (v >= 0 && std::find(stage.reads.begin(), stage.reads.end(), v) == stage.reads.end()) stage.reads.push_back(v);
  }
  graph_.backward.push_back(std::move(stage));
}

void StepCapture::on_resident(const TensorInfo& t) {
  const int v = value_of(&t);
  if (v < 0 || t.is_view() || resident_[v]) return;
  resident_[v] = 1;
  resident_bytes_ += graph_.values[v].bytes;
}

void StepCapture::on_dropped(const TensorInfo& t) {
  const int v = value_of(&t);
  if (v < 0 || t.is_view() || !resident_[v]) return;
  resident_[v] = 0;
  resident_bytes_ -= graph_.values[v].bytes;
  if (!in_kernel_) return;
  // Inside a kernel only eviction drops a value: the allocator had no room for the kernel (the
  // budget, or no hole large enough) and DTR freed this one, so the arena's peak from here on
  // understates the kernel's need. A plan that keeps the value needs both: counted resident when
  // the kernel began, its bytes count on top of the peaks that follow. (A step's first capture
  // runs under DTR and its plan is solved from it: Planning.PredictsTheStaticPlanARunMakes's GPT
  // evicted 131072 bytes inside log_softmax's backward, measured 51392 working bytes of 102592,
  // and its plan, solved for a peak of 1187136, peaked at 1238272.)
  fold_window();  // the value's bytes are already back in the arena
  evicted_in_kernel_ += graph_.values[v].bytes;
  arena_->begin_peak_window();
}

void StepCapture::backward_stage_ran() {
  if (!graph_.backward.empty()) graph_.backward.back().working_bytes = working_bytes(0);
}

void StepCapture::on_destroyed(const TensorInfo& t) {
  auto it = value_index_.find(&t);
  if (it == value_index_.end()) return;
  const int v = it->second;
  value_index_.erase(it);
  if (!t.is_view() && resident_[v]) {
    resident_[v] = 0;
    resident_bytes_ -= graph_.values[v].bytes;
  }
}

uint64_t StepCapture::finish() {
  uint64_t h = mix(0, signatures_.size());
  for (uint64_t s : signatures_) h = mix(h, s);
  graph_.finish();
  return h;
}

}  // namespace ht
