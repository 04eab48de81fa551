#include "launcher/job.h"

#include "launcher/config/config_text.h"
#include "launcher/data/dataset.h"
#include "launcher/model_factory.h"
#include "launcher/report/run_output.h"
#include "launcher/training/checkpoint.h"
#include "launcher/user_error.h"
#include "memory/cpu_allocation_counter.h"

#include <ATen/Parallel.h>

#include <cstdio>
#include <thread>

namespace ht {
namespace {

void print_plan(const Config& c, const DataInfo& data, const Model& model, const Trainer& trainer) {
  std::printf("data: %s\n", data.description.c_str());
  std::printf("model: %s, %lld parameters, on %s, %d ATen thread(s)\n", c.model.name.c_str(),
              static_cast<long long>(model.num_parameters()), c.training.device.c_str(), at::get_num_threads());
  std::printf("training: %lld steps (%lld per epoch), global batch %lld in %lld micro-batch(es) of %lld, "
              "%s lr %g (%s)\n\n",
              static_cast<long long>(trainer.total_steps()), static_cast<long long>(trainer.steps_per_epoch()),
              static_cast<long long>(c.training.global_batch_size), static_cast<long long>(c.micro_batches()),
              static_cast<long long>(c.micro_batch_size()), c.training.optimizer.c_str(), c.training.lr,
              c.training.schedule.c_str());
  std::fflush(stdout);
}

JsonObject summary_of(const Config& c, const Model& model, const TrainResult& r) {
  JsonObject s;
  s.add("job", c.job.name).add("config", c.source).add("model", c.model.name)
      .add("parameters", model.num_parameters()).add("device", c.training.device).add("steps", r.steps)
      .add("resumed_from_step", r.resumed_from_step).add("final_loss", r.final_loss)
      .add("mem_peak_bytes", r.mem_peak_bytes >= 0 ? std::optional<int64_t>(r.mem_peak_bytes) : std::nullopt)
      .add("wall_s", r.seconds)
      .add("samples_per_s", r.seconds > 0 ? static_cast<double>(r.samples) / r.seconds : 0.0);
  if (r.eval) {
    s.add("eval_loss", r.eval->loss);
    if (r.eval->accuracy) s.add("eval_accuracy", *r.eval->accuracy);
    if (r.eval->perplexity) s.add("eval_perplexity", *r.eval->perplexity);
  }
  return s;
}

}  // namespace

JobOutcome run_job(const Config& config, bool quiet) {
  // libtorch defaults to physical cores (1 on a 2-vCPU machine), which leaves OpenBLAS's own
  // threads spinning; all hardware threads is faster there.
  at::set_num_threads(config.training.threads > 0 ? static_cast<int>(config.training.threads)
                                                  : static_cast<int>(std::thread::hardware_concurrency()));
  CpuAllocationCounter::install();

  // Everything that can fail on bad input happens before anything is written.
  DataSplits data = make_datasets(config);
  const DataInfo info = data.info;
  at::manual_seed(config.job.seed);
  std::shared_ptr<Model> model = make_model(config, info);
  model->move_to(at::Device(config.training.device), at::kFloat);
  std::vector<std::string> resume_warnings;
  const auto resume = resolve_resume(config.checkpoint.resume, config.checkpoint_dir(), resume_warnings);
  for (const std::string& w : resume_warnings) std::fprintf(stderr, "hybrid_train: warning: %s\n", w.c_str());
  if (config.checkpoint.resume == "latest" && !resume) {
    std::fprintf(stderr, "hybrid_train: warning: checkpoint.resume = \"latest\" but %s holds no checkpoint; "
                 "starting from step 0\n", config.checkpoint_dir().c_str());
  }
  Trainer trainer(config, std::move(data), model);
  if (resume) trainer.resume_from(*resume);

  const std::string resolved = resolved_toml(config);
  if (!quiet) {
    std::printf("hybrid_train %s: job \"%s\"\n%s\n", HT_VERSION, config.job.name.c_str(), resolved.c_str());
    print_plan(config, info, *model, trainer);
  }
  RunOutput output(config.job.output_dir, resolved, resume.has_value());
  const TrainResult result = trainer.run(output);
  output.summary(summary_of(config, *model, result));
  std::printf("done: %lld steps in %.0f s, final loss %.4f", static_cast<long long>(result.steps), result.seconds,
              result.final_loss);
  if (result.eval && result.eval->accuracy) std::printf(", eval accuracy %.4f", *result.eval->accuracy);
  if (result.eval && result.eval->perplexity) std::printf(", eval perplexity %.3f", *result.eval->perplexity);
  std::printf("; outputs in %s\n", config.job.output_dir.c_str());
  return {model, result};
}

}  // namespace ht
