// Device memory on a GPU (alloc/cuda_arena.h), in a program of its own: hybrid_train's CUDA
// allocator must go in front of ATen's before anything allocates on the GPU. Built where libtorch
// has CUDA; every test skips without a GPU.
//  - Outside an arena ATen's caching allocator serves, and its peak is what a run without a
//    budget reports.
//  - An arena is a real limit, asks the memory manager for room when full, and takes back blocks
//    freed after its scope.
//  - DTR under a budget on CUDA trains bit-identically to the run without one (deterministic
//    cuDNN, as the program sets), with modeled and with measured (CUDA-event) kernel costs.
#include "alloc/cpu_device_allocator.h"
#include "alloc/cuda_arena.h"
#include "runtime/determinism.h"
#include "runtime/kernel_timer.h"
#include "tests/support/budget_training.h"

#include <gtest/gtest.h>

#ifdef HT_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <thread>
#endif

namespace ht::test {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

bool gpu() { return at::hasCUDA() && cuda_budgets_built(); }

class CudaMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu()) GTEST_SKIP() << "no GPU, or a build without CUDA budgets: " << cuda_budgets_missing();
    use_deterministic_cuda_kernels();  // as the program does on a GPU
    install_cuda_allocator();
  }
  const at::TensorOptions cuda = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
};

TEST_F(CudaMemory, OutsideAnArenaTheCachingAllocatorServes) {
  at::Tensor warm = at::ones({1}, cuda);
  reset_cuda_allocated_peak(0);
  {
    at::Tensor t = at::ones({4 * kMiB / 4}, cuda);  // 4 MiB
    EXPECT_EQ(t.sum().item<float>(), static_cast<float>(kMiB));
  }
  EXPECT_GE(cuda_allocated_peak_bytes(0), 4 * kMiB);
  EXPECT_EQ(active_arena(), nullptr);
}

TEST_F(CudaMemory, AnArenaIsARealLimit) {
  auto arena = make_cuda_arena(64 * kMiB, 0);
  CudaArenaScope scope(arena);
  EXPECT_EQ(active_arena(), arena.get());
  {
    at::Tensor t = at::full({16 * kMiB / 4}, 2.0f, cuda);
    EXPECT_TRUE(arena->contains(t.data_ptr()));
    EXPECT_GE(arena->stats().in_use, 16 * kMiB);
    EXPECT_EQ(t.sum().item<float>(), 8.0f * static_cast<float>(kMiB));  // the kernels ran in the block
    EXPECT_THROW(at::empty({80 * kMiB / 4}, cuda), OutOfBudget);
  }
  EXPECT_EQ(arena->stats().in_use, 0);
  EXPECT_GE(arena->stats().failed_allocations, 1);
}

// Drops what it holds when asked for room, as the memory manager evicts.
class DropOnRequest : public OutOfMemoryHandler {
 public:
  at::Tensor held;
  int asked = 0;
  bool make_room(size_t) override {
    ++asked;
    if (!held.defined()) return false;
    held.reset();
    return true;
  }
};

TEST_F(CudaMemory, AFullArenaAsksForRoomBeforeItFails) {
  auto arena = make_cuda_arena(32 * kMiB, 0);
  CudaArenaScope scope(arena);
  DropOnRequest handler;
  set_out_of_memory_handler(&handler);
  handler.held = at::zeros({24 * kMiB / 4}, cuda);
  at::Tensor t = at::ones({16 * kMiB / 4}, cuda);  // fits only once `held` is gone
  set_out_of_memory_handler(nullptr);
  EXPECT_EQ(handler.asked, 1);
  EXPECT_FALSE(handler.held.defined());
  EXPECT_TRUE(arena->contains(t.data_ptr()));
}

#ifdef HT_TORCH_CUDA
// A block made while another stream was ATen's current one (a collective's temporary on the
// communication stream) goes back to the arena only once that stream has passed its free
// (alloc/deferred_frees.h). The side stream is held by a host function until the test lets it go.
TEST_F(CudaMemory, ABlockMadeOnASideStreamIsReusedOnlyAfterThatStream) {
  auto arena = make_cuda_arena(16 * kMiB, 0);
  CudaArenaScope scope(arena);
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  std::atomic<bool> go{false};
  const void* where = nullptr;
  {
    const c10::cuda::CUDAStreamGuard on_side(side);
    ASSERT_EQ(cudaLaunchHostFunc(
                  side.stream(),
                  [](void* flag) {  // bounded, so a mistake fails the test rather than hanging it
                    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
                    while (!static_cast<std::atomic<bool>*>(flag)->load() && std::chrono::steady_clock::now() < until) {
                      std::this_thread::yield();
                    }
                  },
                  &go),
              cudaSuccess);
    at::Tensor t = at::ones({4 * kMiB / 4}, cuda);  // queued behind the host function: not run
    where = t.data_ptr();
  }  // freed on the host while the side stream has not reached it
  at::Tensor next = at::empty({4 * kMiB / 4}, cuda);  // the compute stream's
  EXPECT_NE(next.data_ptr(), where);
  EXPECT_GT(arena->block_bytes(where), 0) << "held back for the side stream";
  go = true;
  side.synchronize();
  next.reset();
  at::Tensor after = at::empty({4 * kMiB / 4}, cuda);  // the side stream is past: its block came back
  EXPECT_EQ(arena->stats().in_use, CpuArena::rounded_size(4 * kMiB));
}
#endif

TEST_F(CudaMemory, BlocksFreedAfterTheScopeGoBackToTheirArena) {
  auto arena = make_cuda_arena(16 * kMiB, 0);
  at::Tensor kept;
  {
    CudaArenaScope scope(arena);
    kept = at::ones({kMiB / 4}, cuda);
  }
  EXPECT_EQ(active_arena(), nullptr);
  at::Tensor outside = at::ones({kMiB / 4}, cuda);  // the caching allocator again
  EXPECT_FALSE(arena->contains(outside.data_ptr()));
  EXPECT_GE(arena->stats().in_use, kMiB);
  kept.reset();
  EXPECT_EQ(arena->stats().in_use, 0);
}

TEST_F(CudaMemory, CudaEventsTimeTheKernelNotItsLaunch) {
  at::Tensor a = at::randn({4096, 4096}, cuda);
  KernelTimer timer(a.device());
  ASSERT_NE(timer.device_time(), nullptr);
  timer.start();
  for (int i = 0; i < 8; ++i) a = at::mm(a, a).div_(64.0);
  timer.stop();
  const double kernel = timer.device_time()->ms();
  // Eight 4096^3 products are ~1.1 TFLOP: well over a millisecond on any GPU, while their launch
  // returns at once. No ratio to the host time is asserted (the host may be slow too).
  EXPECT_GT(kernel, 0.0);
  std::printf("[ cuda events ] 8 matmuls: kernels %.3f ms, launch (host) %.3f ms\n", kernel, timer.host_ms());
}

class CudaDtr : public CudaMemory, public ::testing::WithParamInterface<std::string> {};

TEST_P(CudaDtr, BitIdenticalToTheRunWithoutABudget) {
  const ModelCase* c = nullptr;
  for (const ModelCase& m : budget_cases())
    if (m.name == GetParam()) c = &m;
  ASSERT_NE(c, nullptr);
  SaverOptions on_gpu;
  on_gpu.device = at::Device(at::kCUDA, 0);
  const BudgetRun plain = train_in_budget(*c, 1024 * kMiB, std::nullopt, 3, 16, on_gpu);
  ASSERT_FALSE(plain.out_of_budget) << plain.failure;
  // The smallest budget each must train in. ResNet-18 at 0.5 of its activations ran out on an H200
  // (2026-11-26): cuDNN's convolution backward asks for a 389 KiB workspace that the CPU kernels do
  // not, and found 730 KiB free in pieces (fragmentation: issue 34).
  const double required = GetParam() == "resnet18" ? 0.7 : 0.5;
  for (const double ratio : {0.7, 0.5, 0.3}) {
    for (const KernelCosts costs : {KernelCosts::kModeled, KernelCosts::kMeasured}) {
      SaverOptions savers = on_gpu;
      savers.costs = costs;
      const int64_t budget = budget_at(plain, ratio);
      const std::string what = c->name + " at " + std::to_string(ratio) + " with " + choice_name(costs) + " costs";
      const BudgetRun run = train_in_budget(*c, budget, EvictionHeuristic::kDtr, 3, 16, savers);
      if (run.out_of_budget && ratio < required) {
        std::printf("[ out of reach ] %s: %s\n", what.c_str(), run.failure.c_str());
        continue;  // below this model's smallest budget (the CPU tests bound that)
      }
      expect_identical(plain, run, what);
      EXPECT_LE(run.peak_in_use, budget) << what;
      EXPECT_GT(run.stats.evictions, 0) << what;
      EXPECT_EQ(run.in_use_after, plain.in_use_after) << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaDtr, ::testing::Values("gpt", "resnet18"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ht::test
