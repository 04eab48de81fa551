#include "parallel/grid_group.h"

namespace ht {

GridGroup::GridGroup(Communicator& replicas, Communicator& pipeline) : replicas_(replicas), pipeline_(pipeline) {
  set_context(replicas_.context());
  set_timeout(replicas_.timeout());
}

void GridGroup::allreduce_sum(at::Tensor& t, const char* what) {
  replicas_.set_context(context());
  pipeline_.set_context(context());
  replicas_.allreduce_sum(t, what);
  pipeline_.allreduce_sum(t, what);
}

void GridGroup::broadcast(at::Tensor& t, int root, const char* what) {
  const int stage = root / replicas_.size(), replica = root % replicas_.size();
  replicas_.set_context(context());
  pipeline_.set_context(context());
  if (replicas_.rank() == replica) pipeline_.broadcast(t, stage, what);  // the root's pipeline only
  replicas_.broadcast(t, replica, what);
}

void GridGroup::barrier(const char* what) {
  replicas_.barrier(what);
  pipeline_.barrier(what);
}

void GridGroup::idle_barrier(const char* what) {
  replicas_.idle_barrier(what);
  pipeline_.idle_barrier(what);
}

void GridGroup::refuse(const char* collective, const std::string& what) const {
  throw CommunicationError("rank " + std::to_string(rank()) + ", " + context() + ": " + collective + " of " + what +
                           " over the whole grid: not offered (use the stage's or the pipeline's group)");
}

void GridGroup::reduce_scatter_sum(const at::Tensor&, at::Tensor&, const std::vector<int64_t>&, const char* what) {
  refuse("a reduce-scatter", what);
}
void GridGroup::all_gather(const at::Tensor&, at::Tensor&, const std::vector<int64_t>&, const char* what) {
  refuse("an all-gather", what);
}
void GridGroup::send(const at::Tensor&, int, const char* what) { refuse("a send", what); }
void GridGroup::recv(at::Tensor&, int, const char* what) { refuse("a receive", what); }
std::unique_ptr<Transfer> GridGroup::isend(const at::Tensor&, int, int, const std::string& what) {
  refuse("a send", what);
}
std::unique_ptr<Transfer> GridGroup::irecv(at::Tensor&, int, int, const std::string& what) {
  refuse("a receive", what);
}

}  // namespace ht
