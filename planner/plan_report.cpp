#include "planner/plan_report.h"
#include "base/printf_string.h"

#include <algorithm>
#include <tuple>
#include <cstdarg>
#include <cstdio>
#include <map>

namespace ht {
namespace {

std::string mib(int64_t bytes) { return printf_string("%.1f", static_cast<double>(bytes) / (1 << 20)); }

}  // namespace

int64_t largest_op_working_set(const StepTrace& trace) {
  int64_t largest = 0, during = 0, held = 0;
  int running = -1;
  std::vector<char> alive(trace.tensors.size(), 0);
  for (const TraceEvent& e : trace.events) {
    const auto i = static_cast<size_t>(e.index);
    switch (e.kind) {
      case TraceEvent::Kind::kKernelBegins: {
        running = e.index;
        held = 0;
        for (int in : trace.kernels[i].inputs) held += alive[static_cast<size_t>(in)] ? trace.tensors[in].bytes : 0;
        during = 0;
        largest = std::max(largest, held);
        break;
      }
      case TraceEvent::Kind::kKernelEnds: running = -1; break;
      case TraceEvent::Kind::kAllocated:
        alive[i] = 1;
        if (running >= 0) {
          during += trace.tensors[i].bytes;
          largest = std::max(largest, held + during);
        }
        break;
      case TraceEvent::Kind::kFreed:
        alive[i] = 0;
        if (running >= 0) during -= trace.tensors[i].bytes;
        break;
    }
  }
  return largest;
}

namespace {

// Where a point's forward and backward time goes, by op (its kernels' times), the largest first.
std::string time_by_op(const StepTrace& trace) {
  std::vector<std::pair<double, std::string>> order;
  for (const auto& [op, share] : time_shares_by_op(trace)) order.emplace_back(share, op);
  if (order.empty()) return "";
  std::sort(order.rbegin(), order.rend());
  std::string s = "  time by op:";
  for (size_t i = 0; i < std::min<size_t>(order.size(), 6); ++i) {
    s += printf_string("%s %s %.0f%%", i == 0 ? "" : ",", order[i].second.c_str(), 100 * order[i].first);
  }
  return s + "\n";
}

}  // namespace

std::map<std::string, double> time_shares_by_op(const std::vector<KernelTime>& kernels) {
  std::map<std::string, double> ms;
  double total = 0;
  for (const KernelTime& k : kernels) {
    ms[std::string(k.op) + (k.backward ? " backward" : "")] += k.ms;
    total += k.ms;
  }
  if (total <= 0) return {};
  for (auto& [op, t] : ms) t /= total;
  return ms;
}

std::map<std::string, double> time_shares_by_op(const StepTrace& trace) {
  std::vector<KernelTime> kernels;
  kernels.reserve(trace.kernels.size());
  for (const TraceKernel& k : trace.kernels) kernels.push_back({k.op, k.backward, k.ms});
  return time_shares_by_op(kernels);
}

MisalignedTime misaligned_time(const StepTrace& trace, const DeviceRates& rates) {
  double total = 0, misaligned = 0, aligned = 0;
  for (const TraceKernel& k : trace.kernels) {
    const double ms = kernel_ms(k, rates);
    total += ms;
    if (!k.misaligned) continue;
    misaligned += ms;
    TraceKernel fixed = k;
    fixed.misaligned = false;
    aligned += kernel_ms(fixed, rates);
  }
  if (total <= 0) return {};
  return {misaligned / total, (misaligned - aligned) / total};
}

std::string profile_text(const ModelProfile& p, const Machine& machine) {
  std::string s = printf_string("%s (%.1f s): %s, %lld parameters; per rank: parameters and buffers %s MiB, "
                                "gradients %s MiB, %s state %s MiB\n",
                                p.how.c_str(), p.seconds, p.model.c_str(), static_cast<long long>(p.parameters),
                                mib(p.parameter_bytes).c_str(), mib(p.gradient_bytes).c_str(), p.optimizer.c_str(),
                                mib(p.optimizer_state_bytes).c_str());
  s += "  micro-batch  precision  threads  fwd+bwd ms  optimizer ms  peak MiB  activations MiB  largest op MiB\n";
  std::vector<const ProfilePoint*> rows;  // by precision, then size
  for (const ProfilePoint& pt : p.points) rows.push_back(&pt);
  std::stable_sort(rows.begin(), rows.end(), [](const ProfilePoint* a, const ProfilePoint* b) {
    return std::make_tuple(a->precision, a->threads, a->micro_batch) < std::make_tuple(b->precision, b->threads, b->micro_batch);
  });
  bool traced = false;
  for (const ProfilePoint* pt : rows) {
    traced = traced || pt->memory_traced;
    s += printf_string("  %11lld  %9s  %7d  %10.1f  %12.1f  %8s  %15s  %14s%s\n", static_cast<long long>(pt->micro_batch),
                       choice_name(pt->precision), pt->threads, pt->forward_backward_ms, pt->optimizer_ms,
                       mib(pt->peak_bytes).c_str(), mib(pt->activation_bytes()).c_str(),
                       mib(largest_op_working_set(pt->trace)).c_str(), pt->memory_traced ? "  *" : "");
  }
  if (traced) {
    s += "  * memory traced on meta tensors at this size (this CPU's kernel workspaces declared); times the\n"
         "    trained sizes' line\n";
  }
  // Blocks of the largest point at full threads: where the time goes.
  const ProfilePoint* big = nullptr;
  for (const ProfilePoint& pt : p.points) {
    if (pt.threads == p.threads && (big == nullptr || pt.micro_batch > big->micro_batch)) big = &pt;
  }
  if (big != nullptr && !big->blocks.empty()) {
    s += printf_string("  blocks at micro-batch %lld (forward/backward ms):", static_cast<long long>(big->micro_batch));
    for (size_t b = 0; b < big->blocks.size(); ++b) {
      s += printf_string(" %zu: %.1f/%.1f", b, big->blocks[b].forward_ms, big->blocks[b].backward_ms);
    }
    s += printf_string("; %zu tensors and %zu kernels recorded\n", big->trace.tensors.size(), big->trace.kernels.size());
    s += time_by_op(big->trace);
  }
  s += "machine: " + machine.description + "\n";
  return s;
}

std::string plans_table(const std::vector<RankedPlan>& ranked, size_t rows, bool tokens) {
  std::string s =
      std::string("  #  ranks  stages  tensor  micro x accum  precision         policy      shard  peak/rank MiB  fits  step ms  compute  "
                  "bubble  recompute  optimizer  all-reduce  tensor ms") +
      (tokens ? "   tokens/s  device-h/Gtok" : "  samples/s  device-h/epoch") + "   MFU\n";
  for (size_t i = 0; i < std::min(rows, ranked.size()); ++i) {
    const Plan& p = ranked[i].plan;
    const Prediction& r = ranked[i].prediction;
    // "4 il2": interleaved_1f1b, 2 chunks a stage (the column's width).
    const std::string schedule = p.schedule == ScheduleKind::kInterleaved1f1b
                                     ? "il" + std::to_string(p.virtual_stages)
                                     : std::string(choice_name(p.schedule));
    const std::string stages = p.stages > 1 ? std::to_string(p.stages) + " " + schedule : "1";
    // "2 sp cp4": tensor-parallel 2 with sequence parallelism, each sequence split 4 ways.
    const std::string tensor = std::to_string(p.tensor) + (p.tensor > 1 && p.sequence_parallel ? " sp" : "") +
                               (p.context > 1 ? " cp" + std::to_string(p.context) : "");
    const std::string policy = policy_cell(p);  // "per_block 50%": the share each block keeps
    s += printf_string("%3zu  %5d  %6s  %6s  %7lld x %-4lld  %9s  %13s  %9s  %13s  %4s  %7.1f  %7.1f  %6.1f  %9.1f  %9.1f  "
                       "%10.1f  %9.1f  %9.1f  %14.4f  %4s\n",
                       i + 1, p.devices(), stages.c_str(), tensor.c_str(), static_cast<long long>(p.micro_batch),
                       static_cast<long long>(p.accumulation), choice_name(p.precision), policy.c_str(),
                       choice_name(p.shard), mib(r.peak_bytes).c_str(), r.fits ? "yes" : "no", r.step_ms, r.compute_ms,
                       r.bubble_ms, r.recompute_ms, r.optimizer_ms + r.gather_ms, r.allreduce_exposed_ms, r.tensor_ms + r.context_ms,
                       tokens ? r.tokens_per_s : r.samples_per_s,
                       tokens ? r.device_hours_per_billion_tokens : r.device_hours_per_epoch, r.mfu > 0 ? printf_string("%.0f%%", 100 * r.mfu).c_str() : "-");
  }
  if (ranked.size() > rows) s += printf_string("  (%zu more plans: --all prints them; plans.jsonl has them all)\n", ranked.size() - rows);
  return s;
}

}  // namespace ht
