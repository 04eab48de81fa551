// Evaluation: the held-out set shared among the data-parallel ranks, on an interpreter of its own.
#include "training/trainer.h"
#include "alloc/cpu_device_allocator.h"
#include "base/clock.h"
#include "training/dataset.h"

#include <chrono>
#include <cmath>

namespace ht {
namespace {

// An evaluation's running sums on `device` (a CPU rank's outside its arena, as the host numbers
// they replace were).
struct DeviceSums {
  at::Device device;
  at::Tensor loss_sum, correct;  // double: the batches' losses times their samples; int64
  explicit DeviceSums(at::Device d) : device(d) {
    const HostAllocationScope host(device.is_cpu());
    loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
    correct = at::zeros({}, at::TensorOptions().dtype(at::kLong).device(device));
  }
  // A batch of n samples at mean loss `loss`; `right`: how many it classified right (undefined:
  // not a classifier).
  void add(const at::Tensor& loss, int64_t n, const at::Tensor& right) {
    const HostAllocationScope host(device.is_cpu());
    loss_sum.add_(loss.to(at::kDouble) * static_cast<double>(n));
    if (right.defined()) correct.add_(right);
  }
};

}  // namespace

EvalResult Trainer::evaluate() {
  const auto start = std::chrono::steady_clock::now();
  // Its own interpreter: evaluation never draws from the training seed stream, so when and how
  // often it runs cannot change training. The same parameters (sharded ones gathered by their
  // source), tensor-parallel group, device memory and policy as training's.
  MemoryManager memory;
  Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, plan_.seed + 1}, &memory);
  ParameterSource* parameters = engine_->interp.parameter_source();
  interp.set_autocast(autocast_type(plan_.precision));
  interp.set_parameter_source(parameters);
  interp.set_tensor_parallel(engine_->interp.tensor_parallel());
  interp.set_context_parallel(engine_->interp.context_parallel());
  interp.set_keep_collectives(keeps_collectives(plan_));
  memory.configure(memory_options(plan_.memory, plan_.seed, engine_->arena, engine_->host_link,
                                  static_cast<int>(engine_->model->blocks().size())));
  NoGradGuard no_grad(interp);
  Model& model = *engine_->model;
  model.eval();
  const Dataset& eval = *data_.eval;
  // The same samples whatever the number of ranks; the replicas share them in batches of a
  // forward's size, batch b going to replica b mod replicas, whose context ranks each take their
  // chunks of it (each counts the batch's samples at its chunks' mean loss: summed over the group,
  // every sample c times at its mean).
  int64_t total = eval.size();
  const int64_t batch = plan_.batch.micro;
  if (plan_.loop.eval_samples > 0) total = std::min(total, plan_.loop.eval_samples);
  const int64_t batches = total / batch + (total % batch ? 1 : 0);
  // The sums stay where the model runs, read once after the last batch: the host never waits for
  // a batch's forward. In double, in batch order: the host's sums, bit for bit.
  DeviceSums sums(engine_->device);
  int64_t samples = 0;
  // A parameter source gathers with the group: every rank runs as many forwards, a rank past the
  // last batch repeating its own last one and counting it nowhere.
  const DataParallel& replicas = parts_.groups->replicas();
  const int64_t ranks = replicas.size() / plan_.grid.context;
  const int64_t rounds = parameters != nullptr ? (batches + ranks - 1) / ranks * ranks : batches;
  for (int64_t b = replicas.rank() / plan_.grid.context; b < rounds; b += ranks) {
    const bool counted = b < batches;
    const int64_t which = counted ? b : std::max<int64_t>(0, b - ranks);
    const int64_t n = std::min(batch, total - which * batch);
    const Batch data = staged_for(context_part(eval.slice(which * batch, n), context_), engine_->device);
    const at::Tensor target = on_device(data.target, engine_->device);
    const Tensor out = parts_.runner->forward_only(interp, data.input, n);
    if (!out.defined()) {  // a pipeline stage other than the last: its part is done
      interp.clear_cast_cache();
      continue;
    }
    const at::Tensor loss = model.loss(out, interp.input(target)).value();
    interp.clear_cast_cache();  // no backward ends this forward
    if (!counted) continue;
    sums.add(loss, n, data_.info.task == Task::kClassification ? out.value().argmax(1).eq(target).sum() : at::Tensor());
    samples += n;
  }
  if (parameters != nullptr) parameters->release_all();
  model.train();
  return finish_evaluation(sums.loss_sum.item<double>(), sums.correct.item<int64_t>(), samples,
                           seconds_since(start));
}

EvalResult Trainer::finish_evaluation(double loss_sum, int64_t correct, int64_t samples, double seconds) {
  at::Tensor sums = at::tensor({loss_sum, static_cast<double>(correct), static_cast<double>(samples)}, at::kDouble);
  parts_.groups->sum_evaluation(sums, state_.step);
  loss_sum = sums[0].item<double>();
  correct = static_cast<int64_t>(sums[1].item<double>());
  samples = static_cast<int64_t>(sums[2].item<double>());
  EvalResult r;
  r.samples = samples / plan_.grid.context;  // each context rank counted every sample of its replica's batches
  r.seconds = seconds;
  r.loss = loss_sum / static_cast<double>(samples);
  if (data_.info.task == Task::kClassification) {
    r.accuracy = static_cast<double>(correct) / static_cast<double>(samples);
  } else {
    r.perplexity = std::exp(r.loss);
    if (data_.info.eval_bytes_per_token > 0) r.bits_per_byte = r.loss / std::log(2.0) / data_.info.eval_bytes_per_token;
  }
  result_.eval = r;
  return r;
}

}  // namespace ht
