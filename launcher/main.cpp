// hybrid_train CONFIG.toml [--section.key=value ...]: parse, build, train, report. Under mpirun
// every rank runs this; rank 0 prints and writes. hybrid_train plan CONFIG.toml: the planner;
// hybrid_train tokenize: text to token files.
#include "alloc/byte_size.h"
#include "launcher/cli.h"
#include "launcher/planning/device_catalog.h"
#include "launcher/config/config_loader.h"
#include "launcher/config/config_validation.h"
#include "launcher/config/run_plan_of.h"
#include "launcher/job.h"
#include "launcher/report/html_report.h"
#include "base/user_error.h"
#include "parallel/process_grid.h"
#include "runtime/thread_pools.h"

#include <cstdio>
#include <string>

namespace {

// An error: printed by rank 0 when every rank meets it (bad input, found before training), by
// the rank that met it otherwise. A rank that fails while training ends the whole job, so that
// the others do not wait for it in a collective.
int fail(const ht::ProcessGrid& grid, bool training, int code, const std::string& kind, const std::string& what,
         bool names_rank = false) {
  const std::string who = grid.world > 1 && !names_rank ? "rank " + std::to_string(grid.rank) + ": " : "";
  if (training || grid.is_root()) std::fprintf(stderr, "hybrid_train: %s: %s%s\n", kind.c_str(), who.c_str(), what.c_str());
  std::fflush(stderr);
  if (training && grid.world > 1) ht::abort_process_grid(code);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  ht::restart_with_passive_openmp(argv);  // before MPI or any thread starts
  ht::ProcessGrid grid;
  try {
    grid = ht::make_process_grid();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hybrid_train: error: %s\n", e.what());
    return ht::kUserErrorExitCode;
  }
  struct Finalize {
    ~Finalize() { ht::finalize_process_grid(); }
  } finalize;
  bool training = false;
  try {
    const ht::CommandLine cl = ht::parse_command_line(argc, argv);
    if (cl.exit_code >= 0) return cl.exit_code;
    if (cl.export_args) return ht::run_export(*cl.export_args);
    if (cl.sample_args) return ht::run_sample(*cl.sample_args);
    if (!cl.report_dir.empty()) {
      std::printf("report: %s\n", ht::write_html_report(cl.report_dir).c_str());
      return 0;
    }
    if (cl.tokenize) {
      if (grid.world > 1) {
        throw ht::UserError("hybrid_train tokenize runs as one process (its encoding uses every core); start it "
                            "without mpirun (or srun)");
      }
      return ht::run_tokenize_command(cl.tokenize_args);
    }
    ht::LoadedConfig loaded = ht::load_config(cl.config_path, cl.overrides);
    if (cl.plan && loaded.config.training.device != "cpu" && loaded.config.cluster.device.empty()) {
      // The local GPUs as a cluster of the catalog's kind: the model traced, priced at its rates.
      const ht::ClusterOfKind local =
          ht::local_gpu_cluster(ht::device_catalog(cl.plan_command.args.devices_file),
                                static_cast<int64_t>(loaded.config.cluster.runtime_mib * (1 << 20)));
      std::vector<ht::ConfigOverride> overrides = ht::cluster_overrides(local, "the local GPU");
      // This machine's host memory, where the config describes none: offload to host may be planned.
      if (loaded.config.cluster.host_memory.empty()) {
        const std::string host = "\"" + std::to_string(ht::host_physical_memory_bytes()) + "\"";
        overrides.push_back({"cluster.host_memory", host, "the local GPU (cluster.host_memory = " + host + ")"});
      }
      overrides.insert(overrides.end(), cl.overrides.begin(), cl.overrides.end());
      loaded = ht::load_config(cl.config_path, overrides);
      std::printf("plan: this machine's %d GPU(s) as the catalog's %s (%s free each)\n", local.devices_per_node,
                  local.device.kind.c_str(), ht::format_bytes(local.device.memory_bytes).c_str());
    }
    if (cl.plan) {
      if (grid.world > 1) {
        throw ht::UserError("hybrid_train plan runs as one process and plans for every rank count itself; start it "
                            "without mpirun (or srun), e.g. hybrid_train plan " + cl.config_path + " --ranks 1,2,4");
      }
      for (const std::string& w : cl.warnings) std::fprintf(stderr, "hybrid_train: warning: %s\n", w.c_str());
      for (const std::string& w : loaded.warnings) std::fprintf(stderr, "hybrid_train: warning: %s\n", w.c_str());
      return ht::run_plan_command(loaded.config, cl.plan_command);
    }
    ht::check_pipeline_ranks(loaded.config, grid.world);  // every rank refuses alike
    ht::divide_process_grid(grid, static_cast<int>(loaded.config.parallel.pipeline_parallel),
                            static_cast<int>(loaded.config.parallel.tensor_parallel),
                            static_cast<int>(loaded.config.parallel.context_parallel));
    if (const std::string across = ht::tensor_groups_across_hosts(grid); !across.empty()) {
      throw ht::UserError(loaded.config.source + ": parallel.tensor_parallel = " +
                          std::to_string(grid.tensor_parallel) + ": " + across +
                          "; a group's collectives run inside every layer and must stay on one host: place "
                          "consecutive ranks on one host (mpirun --map-by slot, or srun's block distribution; "
                          "docs/cluster.md), with a multiple of tensor_parallel ranks per host");
    }
    if (grid.is_root()) {
      for (const std::string& w : loaded.warnings) std::fprintf(stderr, "hybrid_train: warning: %s\n", w.c_str());
    }
    // What the grid makes of the config (the replicas, the micro-batches, the schedule), refused
    // alike by every rank before any trains (run_job resolves it again).
    (void)ht::run_plan_of(loaded.config, grid);
    training = true;
    const ht::JobOutcome outcome = ht::run_job(loaded.config, false, &grid);
    // Stopped by a signal (a checkpoint written): the shell's code for that signal's end.
    return outcome.result.stopped_by != 0 ? 128 + outcome.result.stopped_by : 0;
  } catch (const ht::UserError& e) {
    return fail(grid, training, ht::kUserErrorExitCode, "error", e.what());
  } catch (const ht::CommunicationError& e) {
    return fail(grid, true, 1, "error", e.what(), /*names_rank=*/true);
  } catch (const c10::Error& e) {
    return fail(grid, true, 1, "internal error", e.what_without_backtrace());
  } catch (const std::exception& e) {
    return fail(grid, true, 1, "internal error", e.what());
  }
}
