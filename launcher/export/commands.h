#pragma once
// The commands that use a run's weights after training:
//   hybrid_train export RUN_DIR [--output DIR] [--dtype float32|bfloat16]
//     writes DIR/model.safetensors and DIR/config.json (default DIR: RUN_DIR/hf), which
//     transformers' from_pretrained(DIR) loads as GPT2LMHeadModel or LlamaForCausalLM;
//   hybrid_train sample RUN_DIR --prompt TEXT [--tokens N] [--temperature T] [--top-k K]
//     [--greedy] [--seed S] [--device D]
//     prints the prompt and its continuation.
// Their command lines are parsed here (launcher/cli.cpp hands them over); bad arguments are
// UserErrors (exit 2) naming the argument and what would work.

#include "launcher/export/sample.h"

#include <string>

namespace ht {

struct ExportArgs {
  std::string run_dir;
  std::string output_dir;  // empty: RUN_DIR/hf
  std::string dtype = "float32";
};

struct SampleArgs {
  std::string run_dir;
  std::string prompt;
  std::string device = "cpu";
  Sampling sampling;
};

// argv[1] is the command's name. Returns an exit code when the command line was fully handled
// (--help: 0; a parse error: 2), -1 when the command should run.
int parse_export_args(int argc, const char* const* argv, ExportArgs& args);
int parse_sample_args(int argc, const char* const* argv, SampleArgs& args);

// Each prints what it did (export) or the text (sample) and returns the exit code.
int run_export(const ExportArgs& args);
int run_sample(const SampleArgs& args);

}  // namespace ht
