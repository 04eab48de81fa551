#include "training/step_runner.h"

#include <exception>

namespace ht {

double LocalRunner::run(const Batch& batch, double loss_seed, GradientSync& sync) {
  double loss = 0;
  const int64_t micro_batches = batch_.micro_batches, size = batch_.micro;
  for (int64_t k = 0; k < micro_batches; ++k) {
    const Batch micro{batch.input.narrow(0, k * size, size), batch.target.narrow(0, k * size, size)};
    loss += forward_backward(micro, loss_seed, sync, k + 1 == micro_batches) / static_cast<double>(micro_batches);
  }
  return loss;
}

double LocalRunner::forward_backward(const Batch& micro, double loss_seed, GradientSync& sync, bool last) {
  Interpreter& interp = engine_.interp;
  Model& model = *engine_.model;
  // One micro-batch is the step a static plan captures and runs (memory/static_plan.h).
  struct Step {
    MemoryManager& memory;
    explicit Step(MemoryManager& m) : memory(m) { memory.begin_step(); }
    // A step that threw is not one to plan from.
    ~Step() { memory.end_step(/*completed=*/std::uncaught_exceptions() == 0); }
  } step{engine_.memory};
  Tensor loss = model.loss(model.forward(interp.input(micro.input.to(engine_.device))),
                           interp.input(micro.target.to(engine_.device)));
  struct Listening {
    Interpreter& interp;
    ~Listening() { interp.set_gradient_listener(nullptr); }  // also when backward throws
  } listening{interp};
  interp.set_gradient_listener(sync.listener(last));
  // d(seed * loss) = seed * d(loss): seeding backward with the scale adds no op to the graph.
  interp.backward({loss}, {at::full(loss.sizes(), loss_seed, loss.options())});
  sync.backward_ended();
  return loss.value().item<double>();
}

Tensor LocalRunner::forward_only(Interpreter& interp, const at::Tensor& input, int64_t) {
  return engine_.model->forward(interp.input(input.to(engine_.device)));
}

}  // namespace ht
