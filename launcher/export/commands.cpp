#include "launcher/export/commands.h"

#include "launcher/export/hf_checkpoint.h"
#include "launcher/export/run_weights.h"
#include "base/user_error.h"
#include "alloc/byte_size.h"

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>

namespace ht {
namespace commands_impl {

// CLI11's parse, its errors as exit codes (help: 0, else kUserErrorExitCode).
int parse(CLI::App& app, int argc, const char* const* argv) {
  try {
    app.parse(argc - 1, argv + 1);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kUserErrorExitCode;
  }
  return -1;
}

void check_sampling(const SampleArgs& a) {
  const Sampling& s = a.sampling;
  if (a.run_dir.empty()) {
    throw UserError("no run folder given; usage: hybrid_train sample RUN_DIR --prompt TEXT, e.g. hybrid_train sample "
                    "runs/gpt_tiny --prompt \"The GNU\"");
  }
  if (a.prompt.empty()) throw UserError("--prompt: empty; give the text to continue, e.g. --prompt \"The GNU\"");
  if (s.tokens < 1) throw UserError("--tokens " + std::to_string(s.tokens) + ": give a count of 1 or more");
  if (!(s.temperature > 0) || !std::isfinite(s.temperature)) {
    throw UserError("--temperature " + std::to_string(s.temperature) + ": give a number above 0 (1: the model's own "
                    "distribution; below 1: surer; or --greedy)");
  }
  if (s.top_k < 0) throw UserError("--top-k " + std::to_string(s.top_k) + ": give 0 (every token) or a count");
}

}  // namespace commands_impl

int parse_export_args(int argc, const char* const* argv, ExportArgs& args) {
  CLI::App app{"hybrid_train export: writes a run's latest weights as a Hugging Face checkpoint, model.safetensors "
               "and config.json, which transformers loads with from_pretrained (GPT2LMHeadModel, LlamaForCausalLM)."};
  app.name("hybrid_train export");
  app.add_option("run_dir", args.run_dir, "a run's job.output_dir, e.g. runs/gpt_tiny");
  app.add_option("--output", args.output_dir, "the folder to write (default: RUN_DIR/hf)");
  app.add_option("--dtype", args.dtype, "float32 (the weights as trained) or bfloat16 (half the bytes)");
  const int code = commands_impl::parse(app, argc, argv);
  if (code >= 0) return code;
  if (args.run_dir.empty()) {
    throw UserError("no run folder given; usage: hybrid_train export RUN_DIR [--output DIR] [--dtype float32|bfloat16], "
                    "e.g. hybrid_train export runs/gpt_tiny");
  }
  if (args.dtype != "float32" && args.dtype != "bfloat16") {
    throw UserError("--dtype " + args.dtype + ": use float32 or bfloat16");
  }
  return -1;
}

int parse_sample_args(int argc, const char* const* argv, SampleArgs& args) {
  CLI::App app{"hybrid_train sample: continues a prompt with a run's latest weights and prints the text."};
  app.name("hybrid_train sample");
  Sampling& s = args.sampling;
  app.add_option("run_dir", args.run_dir, "a run's job.output_dir, e.g. runs/gpt_tiny");
  app.add_option("--prompt", args.prompt, "the text to continue");
  app.add_option("--tokens", s.tokens, "tokens to generate (default 200)");
  app.add_option("--temperature", s.temperature, "divides the logits: 1 samples the model's distribution, lower is "
                                                 "surer (default 1)");
  app.add_option("--top-k", s.top_k, "draw among the k most likely tokens; 0: all (default)");
  app.add_flag("--greedy", s.greedy, "always the most likely token (deterministic; ignores temperature and top-k)");
  app.add_option("--seed", s.seed, "seed of the draws: the same seed gives the same text (default 1)");
  app.add_option("--device", args.device, "cpu (default), cuda or cuda:N");
  const int code = commands_impl::parse(app, argc, argv);
  if (code >= 0) return code;
  commands_impl::check_sampling(args);
  return -1;
}

int run_export(const ExportArgs& a) {
  const RunWeights w = load_run_weights(a.run_dir, "export");
  const std::string dir = a.output_dir.empty() ? (std::filesystem::path(a.run_dir) / "hf").string() : a.output_dir;
  const at::ScalarType dtype = a.dtype == "bfloat16" ? at::kBFloat16 : at::kFloat;
  const int64_t bytes = export_hf(*w.model, w.options, dir, dtype);
  std::printf("export: %s (%s, %lld parameters, %s) from %s -> %s/model.safetensors and config.json (%s)\n",
              choice_name(w.config.model.name), w.options.is_llama() ? "LlamaForCausalLM" : "GPT2LMHeadModel",
              static_cast<long long>(w.model->num_parameters()), a.dtype.c_str(), w.checkpoint.c_str(), dir.c_str(),
              format_bytes(bytes).c_str());
  return 0;
}

int run_sample(const SampleArgs& a) {
  RunWeights w = load_run_weights(a.run_dir, "sample");
  const TextCodec codec = TextCodec::for_run(w.config, w.options.vocab_size);
  const std::vector<int64_t> prompt = codec.encode(a.prompt);
  if (prompt.empty()) throw UserError("--prompt \"" + a.prompt + "\": encodes to no tokens; give more text");
  at::Device device("cpu");
  try {
    device = at::Device(a.device);
    w.model->move_to(device, at::kFloat);
  } catch (const c10::Error& e) {
    throw UserError("--device " + a.device + ": not usable here (" + std::string(e.what_without_backtrace()).substr(0, 200) +
                    "); use cpu, or cuda on a machine with a GPU");
  }
  std::fputs(a.prompt.c_str(), stdout);
  std::fflush(stdout);
  std::string shown;  // the continuation printed so far: a token may change how the previous ones decode
  const std::vector<int64_t> ids = generate(*w.model, w.options.block_size, prompt, codec.size(), a.sampling, device,
                                            [&](const std::vector<int64_t>& so_far) {
                                              const std::string text = codec.decode(so_far);
                                              if (text.compare(0, shown.size(), shown) != 0) return;
                                              std::fputs(text.c_str() + shown.size(), stdout);
                                              std::fflush(stdout);
                                              shown = text;
                                            });
  const std::string text = codec.decode(ids);
  if (text.compare(0, shown.size(), shown) == 0) std::fputs(text.c_str() + shown.size(), stdout);
  std::fputs("\n", stdout);
  return 0;
}

}  // namespace ht
