#include "launcher/training/trainer.h"

#include <chrono>
#include <cmath>

// Evaluation: the held-out set shared among the data-parallel ranks, on an interpreter of its own.

namespace ht {

EvalResult Trainer::evaluate() {
  const auto start = std::chrono::steady_clock::now();
  // Its own interpreter: evaluation never draws from the training seed stream, so when and how
  // often it runs cannot change training.
  MemoryManager memory;
  Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, static_cast<uint64_t>(config_.job.seed) + 1}, &memory);
  interp.set_autocast(autocast_type(config_.training.mixed_precision));
  interp.set_parameter_source(param_shards_.get());
  interp.set_tensor_parallel(tensor_.get());
  interp.set_keep_collectives(keeps_collectives(config_));
  memory.configure(memory_options());  // the same device memory and policy
  NoGradGuard no_grad(interp);
  model_->eval();
  const Dataset& eval = *data_.eval;
  // The same samples whatever the number of ranks: eval_batches counts batches of one rank of a
  // single-rank run; the ranks share them, batch b going to rank b mod ranks.
  const TrainingConfig& t = config_.training;
  int64_t total = eval.size();
  if (t.eval_batches > 0) {
    total = std::min(total, t.eval_batches * (t.micro_batch_size > 0 ? t.micro_batch_size : t.global_batch_size));
  }
  const int64_t batch = config_.micro_batch_size();
  const int64_t batches = total / batch + (total % batch ? 1 : 0);
  double loss_sum = 0;
  int64_t correct = 0, samples = 0;
  // Sharded parameters are gathered by every rank together: every rank runs as many forwards,
  // a rank past the last batch repeating its own last one and counting it nowhere.
  const int64_t ranks = replicas_.size();
  const int64_t rounds = param_shards_ ? (batches + ranks - 1) / ranks * ranks : batches;
  for (int64_t b = replicas_.rank(); b < rounds; b += ranks) {
    const bool counted = b < batches;
    const int64_t which = counted ? b : std::max<int64_t>(0, b - ranks);
    const int64_t n = std::min(batch, total - which * batch);
    const Batch data = eval.slice(which * batch, n);
    const at::Tensor target = data.target.to(device_);
    Tensor out = pipeline_ ? pipeline_->forward_only(interp, data.input, n)
                           : model_->forward(interp.input(data.input.to(device_)));
    if (!out.defined()) {  // a pipeline stage other than the last: its part is done
      interp.clear_cast_cache();
      continue;
    }
    const double loss = model_->loss(out, interp.input(target)).value().item<double>();
    interp.clear_cast_cache();  // no backward ends this forward
    if (!counted) continue;
    loss_sum += loss * static_cast<double>(n);
    if (data_.info.task == Task::kClassification) {
      correct += out.value().argmax(1).eq(target).sum().item<int64_t>();
    }
    samples += n;
  }
  if (param_shards_) param_shards_->release_all();
  model_->train();
  return finish_evaluation(loss_sum, correct, samples,
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

EvalResult Trainer::finish_evaluation(double loss_sum, int64_t correct, int64_t samples, double seconds) {
  if (replicas_.size() > 1 || pipeline_) {
    replicas_.group().set_context("evaluation after step " + std::to_string(state_.step));
    at::Tensor sums = at::tensor({loss_sum, static_cast<double>(correct), static_cast<double>(samples)}, at::kDouble);
    if (pipeline_) {  // the last stage has the sums; the others add zeros, exactly
      pipeline_->group().set_context("evaluation after step " + std::to_string(state_.step));
      pipeline_->group().allreduce_sum(sums, "the evaluation");
    }
    replicas_.group().allreduce_sum(sums, "the evaluation");
    loss_sum = sums[0].item<double>();
    correct = static_cast<int64_t>(sums[1].item<double>());
    samples = static_cast<int64_t>(sums[2].item<double>());
  }
  EvalResult r;
  r.samples = samples;
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
