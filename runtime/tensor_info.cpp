#include "runtime/tensor_info.h"

#include "alloc/host_link.h"
#include "runtime/interpreter.h"
#include "runtime/kernel_timer.h"
#include "runtime/op.h"

#include <algorithm>

namespace ht {
namespace {

// Releasing a record can release its producer, whose inputs may then go too: a chain of
// thousands of ops would recurse that deep through destructors. Destructors hand their
// references to this list instead, and the outermost release drains it in a loop.
struct LineageReleaser {
  std::vector<std::shared_ptr<TensorInfo>> pending;
  bool draining = false;
};
thread_local LineageReleaser t_releaser;

void release_lineage(std::vector<std::shared_ptr<TensorInfo>>& refs) {
  for (auto& ref : refs) t_releaser.pending.push_back(std::move(ref));
  refs.clear();
  if (t_releaser.draining) return;
  t_releaser.draining = true;
  while (!t_releaser.pending.empty()) {
    std::shared_ptr<TensorInfo> ref = std::move(t_releaser.pending.back());
    t_releaser.pending.pop_back();
    ref.reset();  // may destroy a record, whose producer appends its inputs to `pending`
  }
  t_releaser.draining = false;
}

}  // namespace

TensorInfo::~TensorInfo() { owner->on_record_destroyed(*this); }

double TensorInfo::compute_ms() const { return producer ? producer->kernel_ms() : 0.0; }
double TensorInfo::modeled_ms() const { return producer ? producer->modeled_ms : 0.0; }

bool TensorInfo::copying_to_host() const { return host != nullptr && host->out && !host->out->done(); }
bool TensorInfo::on_host() const { return host != nullptr && host->out && host->out->done(); }

bool TensorInfo::evictable() const {
  if (is_leaf || !resident() || pin_count > 0 || copying_to_host()) return false;
  if (!producer || !owner->recomputes(*producer)) return false;
  for (const TensorInfo* v : views) {
    if (v->resident() && v->pin_count > 0) return false;
  }
  return true;
}

ComputePath::ComputePath(std::shared_ptr<const Op> op_in,
                         std::vector<std::shared_ptr<TensorInfo>> inputs_in)
    : op(std::move(op_in)), inputs(std::move(inputs_in)) {
  for (auto& in : inputs) in->users.push_back(this);
}

ComputePath::~ComputePath() {
  for (auto& in : inputs) {
    auto& users = in->users;
    auto it = std::find(users.begin(), users.end(), this);
    if (it != users.end()) users.erase(it);
  }
  release_lineage(inputs);
}

at::IntArrayRef BackwardArgs::input_sizes(size_t i) const { return input_infos[i]->sizes; }
at::ScalarType BackwardArgs::input_dtype(size_t i) const { return input_infos[i]->dtype; }
at::TensorOptions BackwardArgs::input_options(size_t i) const {
  return at::TensorOptions().dtype(input_infos[i]->dtype).device(input_infos[i]->device);
}

double ComputePath::kernel_ms() const {
  if (pending_ms) {
    compute_ms = pending_ms->ms();
    pending_ms.reset();
  }
  return compute_ms;
}

}  // namespace ht
