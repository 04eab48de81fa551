// Attention that does not store T x T, measured. For each sequence length T, a GPT-2-layout
// decoder layer under bf16 autocast with dropout (the shape of the measurement:
// h = 256, a = 8), twice: with the attention op (runtime/ops/attention.cpp) and with attention
// composed of matmul, masked_fill, softmax and dropout (DecoderOptions::naive_attention).
//
//  - Saved bytes per layer: the bytes alive after forward (what backward will read) with two
//    layers minus with one, counted by the CPU allocator hook; beside them our accounting
//    tensor by tensor (docs/models.md) and Korthikanti et al.'s 34sbh + 5as^2b (all 16-bit).
//  - Step time: forward and backward of the two-layer model, ours and naive interleaved
//    (A B, B A, ...) after warm-up, median ratio with its spread; then PyTorch eager on the same
//    model (bench/peer/attention_peer.py under the Python given, Debian's python3-torch here; its
//    own process, so its median, not interleaved).
// Exits non-zero when the op's saved bytes are off our accounting by more than 5%, or when its
// loss differs from the naive attention's beyond bf16 rounding.
//
// --device cuda: the same on the GPU, bytes from ATen's caching allocator. Without dropout the op
// runs ATen's fused memory-efficient kernel (base/compat.h), and the peer is PyTorch's own
// F.scaled_dot_product_attention in the machine's python3 (flash or memory-efficient, its pick);
// with dropout the op's blockwise kernel runs.
#include "bench/bench_util.h"
#include "bench/peer_rows.h"
#include "alloc/cpu_device_allocator.h"
#include "alloc/cuda_arena.h"
#include "models/decoder.h"
#include "base/compat.h"
#include "runtime/determinism.h"
#include "runtime/thread_pools.h"

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace ht::bench {
namespace {

at::Device g_device(at::kCPU);

int64_t allocated_bytes() {
  return g_device.is_cuda() ? cuda_allocated_bytes(0) : CpuAllocationCounter::install().current_bytes();
}

struct Shape {
  int64_t s, b, h, a;
  double dropout;
  int64_t vocab = 256;
};

DecoderOptions options(const Shape& x, int64_t layers, bool naive) {
  DecoderOptions o = DecoderOptions::gpt2(x.vocab, x.s, layers, x.a, x.h, x.dropout);
  o.naive_attention = naive;
  return o;
}

// Bytes alive after a forward of `layers` layers (parameters excluded: they exist before).
int64_t bytes_after_forward(const Shape& x, int64_t layers, bool naive) {
  at::manual_seed(1);
  Decoder model(options(x, layers, naive));
  model.train();
  if (g_device.is_cuda()) model.move_to(g_device, at::kFloat);
  const at::Tensor tokens = at::randint(x.vocab, {x.b, x.s}, at::kLong).to(g_device);
  const int64_t before = allocated_bytes();
  Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, 1});
  interp.set_autocast(at::kBFloat16);
  const Tensor out = model.forward(interp.input(tokens));
  return allocated_bytes() - before;
}

int64_t saved_per_layer(const Shape& x, bool naive) {
  return bytes_after_forward(x, 2, naive) - bytes_after_forward(x, 1, naive);
}

// Our layer's saved tensors (docs/models.md, "What a layer saves"; docs/memory.md, "What a decoder
// layer saves"), bytes. Since 2026-12-02 every activation is bf16 (the norms' inputs too), and the
// op's output is laid out token by token on every device, so merging the heads for wo is a view of
// what the op saved, never a copy.
double our_accounting(const Shape& x) {
  const double sbh = static_cast<double>(x.s * x.b * x.h), sb = static_cast<double>(x.s * x.b);
  const double norm_inputs = 2 * 2 * sbh, norm_stats = 2 * 2 * 4 * sb;
  const double bf16_linear_inputs = 2 * sbh /*q,k,v in*/ + 2 * sbh /*fc in*/ + 8 * sbh /*proj in*/;
  const double attention = 3 * 2 * sbh /*q, k, v*/ + 2 * sbh /*out, also wo's input*/ + 4 * static_cast<double>(x.a) * sb /*lse*/;
  const double gelu_input = 8 * sbh, dropout_masks = x.dropout > 0 ? 2 * sbh : 0.0;
  const double weight_copies = 2 * 12 * static_cast<double>(x.h * x.h);  // bf16 copies linear saves
  return norm_inputs + norm_stats + bf16_linear_inputs + attention + gelu_input + dropout_masks + weight_copies;
}

double korthikanti(const Shape& x, bool scores) {
  const double sbh = static_cast<double>(x.s * x.b * x.h);
  return 34 * sbh + (scores ? 5.0 * static_cast<double>(x.a * x.s * x.s * x.b) : 0.0);
}

struct Side {
  std::shared_ptr<Decoder> model;
  std::vector<double> ms;
  double loss = 0;
};

void step(Side& side, const at::Tensor& tokens, const at::Tensor& targets, uint64_t seed) {
  Interpreter interp(InterpreterOptions{ExecutionMode::kInterpreted, seed});
  interp.set_autocast(at::kBFloat16);
  const auto t0 = std::chrono::steady_clock::now();
  Tensor loss = side.model->loss(side.model->forward(interp.input(tokens)), interp.input(targets));
  interp.backward(loss);
  // Reading a gradient waits for the GPU's queue, so the time holds the kernels, not their launch.
  if (g_device.is_cuda()) side.model->parameters().front().grad().view(-1).slice(0, 0, 1).item<float>();
  side.ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  side.loss = loss.value().item<double>();
  for (at::Tensor& p : side.model->parameters()) p.mutable_grad() = at::Tensor();
}

struct Timing {
  double ours_ms, ratio, lo, hi, loss_gap;
  double ours_peak_mib = -1;  // the op's step, on a GPU
};

Timing time_layers(const Shape& x, int warmup, int reps) {
  Side ours, naive;
  at::manual_seed(2);
  ours.model = std::make_shared<Decoder>(options(x, 2, false));
  at::manual_seed(2);
  naive.model = std::make_shared<Decoder>(options(x, 2, true));
  if (g_device.is_cuda()) {
    ours.model->move_to(g_device, at::kFloat);
    naive.model->move_to(g_device, at::kFloat);
  }
  const at::Tensor tokens = at::randint(x.vocab, {x.b, x.s}, at::kLong).to(g_device);
  const at::Tensor targets = at::randint(x.vocab, {x.b, x.s}, at::kLong).to(g_device);
  uint64_t seed = 1;
  for (int i = 0; i < warmup; ++i, ++seed) {
    step(naive, tokens, targets, seed);
    step(ours, tokens, targets, seed);
  }
  ours.ms.clear();
  naive.ms.clear();
  std::vector<double> ratios;
  double gap = 0;
  for (int i = 0; i < reps; ++i, ++seed) {
    Side& first = i % 2 ? ours : naive;
    Side& second = i % 2 ? naive : ours;
    step(first, tokens, targets, seed);
    step(second, tokens, targets, seed);
    ratios.push_back(naive.ms.back() / ours.ms.back());
    gap = std::max(gap, std::abs(ours.loss - naive.loss));
  }
  Timing t{median(ours.ms), median(ratios), *std::min_element(ratios.begin(), ratios.end()),
           *std::max_element(ratios.begin(), ratios.end()), gap};
  if (g_device.is_cuda()) {  // one more step of the op alone: its peak, model and inputs included
    naive.model.reset();
    reset_cuda_allocated_peak(0);
    step(ours, tokens, targets, seed);
    t.ours_peak_mib = static_cast<double>(cuda_allocated_peak_bytes(0)) / (1 << 20);
  }
  return t;
}

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> v;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) v.push_back(std::stoll(item));
  return v;
}

}  // namespace
}  // namespace ht::bench

int main(int argc, char** argv) {
  using namespace ht::bench;
  CLI::App app{"Attention: saved bytes per layer and step time, the attention op against composed attention "
               "and PyTorch eager"};
  std::string seqs = "512,1024,2048,4096";
  int64_t batch = 2, embd = 256, heads = 8, threads = 0;
  double dropout = 0.1;
  int warmup = 1, reps = 5;
  bool quick = false;
  std::string device = "cpu";
  std::string python = "/usr/bin/python3", peer = std::string(HT_SOURCE_DIR) + "/bench/peer/attention_peer.py";
  app.add_option("--seq", seqs, "sequence lengths T, comma-separated");
  app.add_option("--batch", batch, "b");
  app.add_option("--embd", embd, "h");
  app.add_option("--heads", heads, "a");
  app.add_option("--dropout", dropout, "dropout (embeddings, attention, residuals)");
  app.add_option("--threads", threads, "compute threads; 0: the machine's default");
  app.add_option("--warmup", warmup, "untimed steps per side");
  app.add_option("--reps", reps, "timed steps per side");
  app.add_option("--python", python, "the Python that runs the PyTorch peer; empty: no peer");
  app.add_flag("--quick", quick, "T = 128, 256 only (a smoke run)");
  app.add_option("--device", device,
                 "cpu, or cuda: GPT-2 small's width (h = 768, a = 12, b = 4, no dropout) at T = 1024-8192 unless "
                 "given, the peer PyTorch's SDPA in --python (python3 there)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  CLI11_PARSE(app, argc, argv);
  if (device == "cuda") {
    if (!at::hasCUDA()) {
      std::fprintf(stderr, "bench_attention: --device cuda: no GPU is visible, or this libtorch has no CUDA\n");
      return 2;
    }
    g_device = at::Device(at::kCUDA, 0);
    ht::use_deterministic_cuda_kernels();  // as hybrid_train does on a GPU
    if (app.count("--seq") == 0) seqs = "1024,2048,4096,8192";
    if (app.count("--batch") == 0) batch = 4;
    if (app.count("--embd") == 0) embd = 768;
    if (app.count("--heads") == 0) heads = 12;
    if (app.count("--dropout") == 0) dropout = 0;
    if (app.count("--python") == 0) python = "python3";
  }
  if (quick) seqs = "128,256";
  const int n_threads = threads > 0 ? static_cast<int>(threads) : ht::default_thread_count(1);
  ht::set_compute_threads(n_threads);
  const std::vector<int64_t> lengths = parse_list(seqs);
  std::printf("bench_attention: GPT-2 layer, b = %lld, h = %lld, a = %lld, dropout %.2f, bf16 autocast, %s, %d threads\n\n",
              static_cast<long long>(batch), static_cast<long long>(embd), static_cast<long long>(heads), dropout,
              device.c_str(), at::get_num_threads());
  std::printf("| T | op saves (MB) | our accounting | op / accounting | naive saves | naive / op | Korthikanti 34sbh+5as^2b | 34sbh |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  bool ok = true;
  // cuBLAS makes its workspaces (33 MiB on an H200) at the first matrix product and keeps them: not
  // bytes a layer saves (they counted in the first row of the first GPU run, 1.26x the accounting).
  if (g_device.is_cuda()) bytes_after_forward(Shape{lengths.front(), batch, embd, heads, dropout}, 1, false);
  for (int64_t t : lengths) {
    const Shape x{t, batch, embd, heads, dropout};
    const double op = static_cast<double>(saved_per_layer(x, false));
    const double naive = static_cast<double>(saved_per_layer(x, true));
    const double ours = our_accounting(x);
    const double off = op / ours;
    ok = ok && std::abs(off - 1) <= 0.05;
    std::printf("| %lld | %.2f | %.2f | %.3f | %.2f | %.2fx | %.2f | %.2f |\n", static_cast<long long>(t), op / 1e6,
                ours / 1e6, off, naive / 1e6, naive / op, korthikanti(x, true) / 1e6, korthikanti(x, false) / 1e6);
    std::fflush(stdout);
  }
#ifdef HT_FUSED_ATTENTION
  if (g_device.is_cuda()) {  // which kernel ATen itself would pick for the layer's q, k, v (contiguous)
    const int64_t hd = embd / heads;
    const at::Tensor q = at::randn({batch, heads, lengths.front(), hd}, at::TensorOptions().device(g_device).dtype(at::kBFloat16));
    std::printf("\nATen's fused choice for (%lld, %lld, %lld, %lld) bf16, causal: %lld (1 flash, 2 memory-efficient, 3 cuDNN, 0 math)\n",
                static_cast<long long>(batch), static_cast<long long>(heads), static_cast<long long>(lengths.front()),
                static_cast<long long>(hd),
                static_cast<long long>(at::_fused_sdp_choice(q, q, q, {}, 0.0, true, 1.0 / std::sqrt(static_cast<double>(hd)))));
  }
#endif
  std::printf("\nStep (forward + backward of 2 layers, embedding and head included), ours and naive interleaved:\n\n");
  std::printf("| T | naive / op (median) | spread | PyTorch eager / op | |loss op - naive| | peak MiB op | PyTorch peak MiB |\n"
              "| --- | --- | --- | --- | --- | --- | --- |\n");
  for (int64_t t : lengths) {
    const Shape x{t, batch, embd, heads, dropout};
    const Timing timing = time_layers(x, warmup, reps);
    std::string peer_ratio = "-", peer_peak = "-", our_peak = "-";
    char buf[32];
    if (timing.ours_peak_mib >= 0) {
      std::snprintf(buf, sizeof buf, "%.1f", timing.ours_peak_mib);
      our_peak = buf;
    }
    if (!python.empty()) {
      std::string failure;
      const std::vector<PeerRow> rows =
          run_peer(python, peer,
                   "--seq " + std::to_string(t) + " --batch " + std::to_string(batch) + " --embd " + std::to_string(embd) +
                       " --heads " + std::to_string(heads) + " --dropout " + std::to_string(dropout) + " --threads " +
                       std::to_string(n_threads) + " --warmup " + std::to_string(warmup) + " --reps " + std::to_string(reps) + " --device " + device,
                   failure);
      if (rows.empty()) {
        std::fprintf(stderr, "peer failed: %s\n", failure.c_str());
      } else {
        std::snprintf(buf, sizeof buf, "%.2fx", rows.front().step_ms / timing.ours_ms);
        peer_ratio = buf;
        if (rows.front().peak_bytes >= 0) {
          std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(rows.front().peak_bytes) / (1 << 20));
          peer_peak = buf;
        }
      }
    }
    // Dropout masks differ between the two (the op draws its own per block), so the losses
    // agree to dropout's noise; without dropout, to bf16 rounding.
    const double allowed = dropout > 0 ? 0.05 : 0.02;
    ok = ok && timing.loss_gap <= allowed;
    const ht::detail::AttentionKernelCounts kernels = ht::detail::attention_kernel_counts();
    std::printf("<!-- attention op forwards so far: %lld fused, %lld blockwise -->\n", static_cast<long long>(kernels.fused),
                static_cast<long long>(kernels.blockwise));
    std::printf("| %lld | %.2fx | %.2f-%.2f | %s | %.4f | %s | %s |\n", static_cast<long long>(t), timing.ratio, timing.lo,
                timing.hi, peer_ratio.c_str(), timing.loss_gap, our_peak.c_str(), peer_peak.c_str());
    std::fflush(stdout);
  }
  if (!ok) std::printf("\nFAILED: saved bytes off the accounting by more than 5%%, or losses apart\n");
  return ok ? 0 : 1;
}
