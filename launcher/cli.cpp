#include "launcher/cli.h"

#include "launcher/planning/device_catalog.h"

#include "launcher/config/config_text.h"
#include "base/user_error.h"
#include "alloc/byte_size.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <iostream>

#ifndef HT_VERSION
#define HT_VERSION "unknown"
#endif

namespace ht {
namespace {

// CLI11 hands over what it does not know; those are the --section.key=value overrides.
std::vector<ConfigOverride> overrides_from(const std::vector<std::string>& extras) {
  std::vector<ConfigOverride> out;
  for (size_t i = 0; i < extras.size(); ++i) {
    const std::string& arg = extras[i];
    if (arg.rfind("--", 0) != 0 || arg.size() <= 2) {
      throw UserError("argument '" + arg + "': unexpected; usage: hybrid_train CONFIG.toml [--section.key=value ...]");
    }
    const size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      out.push_back({arg.substr(2, eq - 2), arg.substr(eq + 1), arg});
    } else if (i + 1 < extras.size() && extras[i + 1].rfind("--", 0) != 0) {
      out.push_back({arg.substr(2), extras[i + 1], arg + " " + extras[i + 1]});
      ++i;
    } else {
      throw UserError("argument " + arg + ": missing value; write " + arg + "=VALUE");
    }
  }
  return out;
}

// "1,2,4" or "1..8" (every count from 1 to 8).
std::vector<int> parse_ranks(const std::string& text, const std::string& option = "--ranks") {
  const std::string hint = "; write a list such as " + option + " 1,2,4 or a range such as " + option + " 1..8";
  std::vector<int> out;
  auto number = [&](const std::string& word) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || word.empty() || v < 1) {
      throw UserError(option + " " + text + ": '" + word + "' is not a count of 1 or more" + hint);
    }
    return v;
  };
  const size_t dots = text.find("..");
  if (dots != std::string::npos) {
    const int first = number(text.substr(0, dots)), last = number(text.substr(dots + 2));
    if (last < first) throw UserError(option + " " + text + ": the range is empty" + hint);
    for (int r = first; r <= last; ++r) out.push_back(r);
    return out;
  }
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    out.push_back(number(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// `option`'s comma-separated words of one choice (--precisions off,bf16), each kept once; a word
// that is none of them is refused as "'word' is not <a_what>; <advice>".
template <typename Choice>
std::vector<Choice> parse_choice_list(const std::string& option, const std::string& text, const std::string& a_what,
                                      const std::string& advice) {
  std::vector<Choice> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string word = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const std::optional<Choice> choice = parse_choice<Choice>(word);
    if (!choice) throw UserError(option + " " + text + ": '" + word + "' is not " + a_what + "; " + advice);
    if (std::find(out.begin(), out.end(), *choice) == out.end()) out.push_back(*choice);
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

CommandLine parse_plan_command_line(int argc, const char* const* argv) {
  CommandLine cl;
  cl.plan = true;
  CLI::App app{"hybrid_train plan: profiles the job's model on this machine and ranks the ways to train it "
               "(data-parallel ranks, micro-batch size, precision, memory policy) by predicted step time or cost; "
               "writes the best as <job.output_dir>/plan.toml."};
  app.name("hybrid_train plan");
  app.allow_extras();
  std::string ranks, stages, tensor, context, exchanges, memory, objective = "time", precisions;
  int max_ranks = 0;
  app.add_option("config", cl.config_path, "the job's TOML file, e.g. configs/resnet18_fmnist.toml");
  app.add_option("--ranks", ranks, "rank counts to consider: 1,2,4 or 1..8 (default: 1, 2, 4, ... up to the "
                                   "CPUs this process may use, or [cluster]'s devices)");
  app.add_option("--stages", stages, "pipeline stages to consider, each a divisor of a rank count: 1,2,4 (default: "
                                     "1, 2 and 4, up to the model's blocks)");
  app.add_option("--tensor", tensor, "tensor-parallel group sizes to consider for a gpt or llama model, each "
                                     "profiled apart: 1,2,4 (default: parallel.tensor_parallel)");
  app.add_option("--context", context, "context-parallel group sizes to consider for a gpt or llama model (each rank "
                                       "a 1/c of every sequence), each profiled apart with every tensor size: 1,2,4 "
                                       "(default: parallel.context_parallel; where that is 1, with --cluster and "
                                       "model.block_size of 16384 or more, also powers of two up to a node's devices "
                                       "with tensor size 1)");
  app.add_option("--context-exchange", exchanges, "how each context size's attention exchanges keys and values, "
                                                  "each profiled apart: ring, all_gather or ring,all_gather (default: "
                                                  "parallel.context_exchange)");
  app.add_option("--device-memory", memory, "memory per device (rank), e.g. 16GiB (default: memory.budget, else "
                                            "[cluster].device_memory, else this machine's memory shared by the ranks)");
  app.add_option("--objective", objective, "time (fastest step) or cost (fewest device-hours per epoch)")
      ->check(CLI::IsMember({"time", "cost"}));
  app.add_option("--max-ranks", max_ranks, "use at most this many ranks")->check(CLI::PositiveNumber);
  app.add_option("--precisions", precisions, "precisions to consider: off,bf16 (default: the config's and bf16)");
  std::string cluster, devices;
  app.add_option("--cluster", cluster, "plan for a cluster of a catalog device kind: KIND:NODESxDEVICES, e.g. "
                                       "h100-sxm:8x8 (configs/devices.toml lists the kinds; sets [cluster]'s device, nodes, "
                                       "devices, memory and links: the model is traced, not run, and priced at the kind's rates)");
  app.add_option("--devices", devices, "a device catalog of your own (the format of configs/devices.toml): its "
                                       "kinds added to the built-in ones, or replacing them");
  app.add_flag("--all", cl.plan_command.all_rows, "print every plan, not the best 15");
  try {
    app.parse(argc - 1, argv + 1);
  } catch (const CLI::ParseError& e) {
    cl.exit_code = app.exit(e) == 0 ? 0 : kUserErrorExitCode;
    return cl;
  }
  cl.overrides = overrides_from(app.remaining());
  if (!cluster.empty()) {
    // Before the user's overrides: a --cluster.<key>=... given too still decides that key.
    const ClusterOfKind of_kind = parse_cluster(cluster, device_catalog(devices));
    if (!of_kind.warning.empty()) cl.warnings.push_back(of_kind.warning);
    std::vector<ConfigOverride> described = cluster_overrides(of_kind, "--cluster " + cluster);
    described.insert(described.end(), cl.overrides.begin(), cl.overrides.end());
    cl.overrides = std::move(described);
  } else if (!devices.empty()) {
    device_catalog(devices);  // checked, though no --cluster reads it
  }
  if (cl.config_path.empty()) {
    throw UserError("no config file given; usage: hybrid_train plan CONFIG.toml [--ranks 1,2,4] "
                    "[--device-memory 16GiB] [--objective time|cost], e.g. hybrid_train plan configs/quickstart.toml");
  }
  PlanArgs& a = cl.plan_command.args;
  a.devices_file = devices;
  if (!ranks.empty()) a.ranks = parse_ranks(ranks);
  if (!stages.empty()) a.stages = parse_ranks(stages, "--stages");
  if (!tensor.empty()) a.tensor = parse_ranks(tensor, "--tensor");
  if (!context.empty()) a.context = parse_ranks(context, "--context");
  if (!exchanges.empty()) {
    a.context_exchanges = parse_choice_list<ContextExchange>(
        "--context-exchange", exchanges, "a way to exchange keys and values",
        "use ring or all_gather (parallel.context_exchange's values), e.g. --context-exchange ring,all_gather");
  }
  if (!memory.empty()) {
    const auto bytes = parse_byte_size(memory, 0);
    if (!bytes || *bytes <= 0) {
      throw UserError("--device-memory " + memory + ": not a memory size; use bytes with a unit, e.g. 16GiB or 800MiB");
    }
    a.device_memory = *bytes;
  }
  a.objective = objective == "cost" ? Objective::kCost : Objective::kTime;
  a.max_ranks = max_ranks;
  if (!precisions.empty()) {
    a.precisions = parse_choice_list<MixedPrecision>("--precisions", precisions, "a precision",
                                                     "use off, bf16 or fp16, e.g. --precisions off,bf16");
  }
  return cl;
}

}  // namespace

CommandLine parse_report_command_line(int argc, const char* const* argv) {
  CommandLine cl;
  CLI::App app{"hybrid_train report: writes RUN_DIR/report.html, one self-contained page (loss, step time, memory, "
               "the memory trace, the planner's prediction beside the run) from the files a run wrote there. "
               "Every run writes it at its end too."};
  app.name("hybrid_train report");
  app.add_option("run_dir", cl.report_dir, "a run's job.output_dir, e.g. runs/quickstart");
  try {
    app.parse(argc - 1, argv + 1);
  } catch (const CLI::ParseError& e) {
    cl.exit_code = app.exit(e) == 0 ? 0 : kUserErrorExitCode;
    return cl;
  }
  if (cl.report_dir.empty()) {
    throw UserError("no run folder given; usage: hybrid_train report RUN_DIR, e.g. hybrid_train report runs/quickstart");
  }
  return cl;
}

CommandLine parse_tokenize_command_line(int argc, const char* const* argv) {
  CommandLine cl;
  cl.tokenize = true;
  TokenizeArgs& a = cl.tokenize_args;
  CLI::App app{"hybrid_train tokenize: trains a SentencePiece tokenizer on text files (or loads one) and encodes "
               "them into a token file in llm.c's format, for data.dataset = \"tokens\". E.g. hybrid_train tokenize "
               "--input '/usr/share/doc/python3.11/html/_sources/**/*.rst.txt' --model-prefix data/pydoc "
               "--output data/pydoc.bin --eval-fraction 0.05"};
  app.name("hybrid_train tokenize");
  std::string model_type = "bpe";
  app.add_option("--input", a.inputs, "text files, globs (quoted; ** crosses folders) or folders (every file below), "
                                      "in the order given, each glob's and folder's files sorted")->expected(1, -1);
  app.add_option("--model-prefix", a.model_prefix, "train a tokenizer; write PREFIX.model and PREFIX.vocab");
  app.add_option("--model", a.model, "encode with this tokenizer (a PREFIX.model written before)");
  app.add_option("--output", a.output, "the token file to write, PATH.bin (uint16 when the vocabulary fits in 65536 "
                                       "ids, else uint32); without it, train the tokenizer only");
  app.add_option("--vocab-size", a.vocab_size, "pieces of a trained tokenizer (at least 256 + 4 + the text's "
                                               "distinct characters: bytes fall back)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))->capture_default_str();
  app.add_option("--model-type", model_type, "bpe or unigram")->check(CLI::IsMember({"bpe", "unigram"}))->capture_default_str();
  app.add_option("--eval-fraction", a.eval_fraction, "the last share of the text (from a line's start) to PATH_val.bin "
                                                     "(data.eval_path)")
      ->check(CLI::Range(0.0, 0.5))->capture_default_str();
  app.add_option("--max-sentences", a.max_sentences, "lines sampled to train on (bounds time and memory; every line "
                                                     "is encoded)")
      ->check(CLI::Range(int64_t{1000}, int64_t{1} << 40))->capture_default_str();
  app.add_flag("--overwrite", a.overwrite, "replace a tokenizer (PREFIX.model, PREFIX.vocab) or token files that exist "
                                           "(without it they are refused: a run trained with them reads their ids)");
  try {
    app.parse(argc - 1, argv + 1);
  } catch (const CLI::ParseError& e) {
    cl.exit_code = app.exit(e) == 0 ? 0 : kUserErrorExitCode;
    return cl;
  }
  a.model_type = *parse_choice<TokenizerModel>(model_type);
  return cl;
}

CommandLine parse_command_line(int argc, const char* const* argv) {
  if (argc >= 2 && std::string(argv[1]) == "plan") return parse_plan_command_line(argc, argv);
  if (argc >= 2 && std::string(argv[1]) == "report") return parse_report_command_line(argc, argv);
  if (argc >= 2 && std::string(argv[1]) == "tokenize") return parse_tokenize_command_line(argc, argv);
  if (argc >= 2 && (std::string(argv[1]) == "export" || std::string(argv[1]) == "sample")) {
    CommandLine cl;
    if (std::string(argv[1]) == "export") {
      cl.exit_code = parse_export_args(argc, argv, cl.export_args.emplace());
    } else {
      cl.exit_code = parse_sample_args(argc, argv, cl.sample_args.emplace());
    }
    return cl;
  }
  CommandLine cl;
  CLI::App app{"hybrid_train: trains the model a config file describes, through an interpreter that can "
               "trade compute for memory."};
  app.name("hybrid_train");
  app.allow_extras();
  app.set_version_flag("--version", std::string("hybrid_train ") + HT_VERSION);
  app.add_option("config", cl.config_path, "the job's TOML file, e.g. configs/quickstart.toml");
  bool markdown = false;
  app.add_flag("--config-reference-markdown", markdown, "print the config reference as Markdown and exit")
      ->group("");  // hidden: docs/config-reference.md is generated with it
  app.footer("\nhybrid_train plan CONFIG.toml --help: the planner.\nhybrid_train report RUN_DIR: a run's report.html.\n"
             "hybrid_train tokenize --help: text files to a SentencePiece tokenizer and token files.\n"
             "hybrid_train export RUN_DIR --help: a run's weights as a Hugging Face checkpoint.\n"
             "hybrid_train sample RUN_DIR --prompt TEXT --help: text from a run's weights.\n" +
             config_reference_text() +
             "\nOverrides win over the file and are type-checked like it, e.g. --training.steps=20.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    cl.exit_code = app.exit(e) == 0 ? 0 : kUserErrorExitCode;
    return cl;
  }
  if (markdown) {
    std::cout << config_reference_markdown();
    cl.exit_code = 0;
    return cl;
  }
  cl.overrides = overrides_from(app.remaining());
  if (cl.config_path.empty()) {
    throw UserError("no config file given; usage: hybrid_train CONFIG.toml [--section.key=value ...], "
                    "e.g. hybrid_train configs/quickstart.toml");
  }
  return cl;
}

}  // namespace ht
