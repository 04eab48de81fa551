#include "training/step_runner.h"

#include "alloc/cpu_device_allocator.h"

#include <exception>

namespace ht {

at::Tensor LocalRunner::run(const Batch& batch, double loss_seed, GradientSync& sync) {
  // The mean in double, each micro-batch's loss divided and added in turn: the bits of the same
  // sum made on the host from each loss read. The count is a tensor on the device: CUDA divides
  // by a host scalar as a product with its reciprocal, a bit off for counts not powers of two.
  // A CPU rank's sum is host memory (HostAllocationScope), not its arena's: no block beside what
  // the planner counts.
  const int64_t micro_batches = batch_.micro_batches, size = batch_.micro;
  at::Tensor loss, count;
  {
    HostAllocationScope host;
    const auto options = at::TensorOptions().dtype(at::kDouble).device(engine_.device);
    loss = at::zeros({}, options);
    count = at::full({}, static_cast<double>(micro_batches), options);
  }
  for (int64_t k = 0; k < micro_batches; ++k) {
    const Batch micro{batch.input.narrow(0, k * size, size), batch.target.narrow(0, k * size, size)};
    const at::Tensor micro_loss = forward_backward(micro, loss_seed, sync, k + 1 == micro_batches);
    HostAllocationScope host;
    loss.add_(micro_loss.div(count));
  }
  return loss;
}

at::Tensor LocalRunner::forward_backward(const Batch& micro, double loss_seed, GradientSync& sync, bool last) {
  Interpreter& interp = engine_.interp;
  Model& model = *engine_.model;
  // One micro-batch is the step a static plan captures and runs (memory/static_plan.h).
  struct Step {
    MemoryManager& memory;
    explicit Step(MemoryManager& m) : memory(m) { memory.begin_step(); }
    // A step that threw is not one to plan from.
    ~Step() { memory.end_step(/*completed=*/std::uncaught_exceptions() == 0); }
  } step{engine_.memory};
  Tensor loss = model.loss(model.forward(interp.input(on_device(micro.input, engine_.device))),
                           interp.input(on_device(micro.target, engine_.device)));
  struct Listening {
    Interpreter& interp;
    ~Listening() { interp.set_gradient_listener(nullptr); }  // also when backward throws
  } listening{interp};
  interp.set_gradient_listener(sync.listener(last));
  // d(seed * loss) = seed * d(loss): seeding backward with the scale adds no op to the graph.
  interp.backward({loss}, {at::full(loss.sizes(), loss_seed, loss.options())});
  sync.backward_ended();
  // Widened now, so the loss's own block goes back before the step ends, as every other of it.
  HostAllocationScope host;
  return loss.value().detach().to(at::kDouble, /*non_blocking=*/false, /*copy=*/true);
}

Tensor LocalRunner::forward_only(Interpreter& interp, const at::Tensor& input, int64_t) {
  return engine_.model->forward(interp.input(on_device(input, engine_.device)));  // staged by evaluate()
}

}  // namespace ht
