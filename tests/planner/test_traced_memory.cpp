// A measured profile completed by traced sizes (planner/traced_memory.h): each traced size the
// profiler did not train becomes a point whose memory is the trace's and whose times are the
// measured line's, so the cost model's memory is exact there and its times do not move.
#include "planner/cost_model.h"
#include "planner/traced_memory.h"

#include <gtest/gtest.h>

namespace ht::test {
namespace {

constexpr int64_t kPersistent = 3000 * 64;

StepTrace two_kernels(double forward_ms, double backward_ms, int count = 2) {
  StepTrace trace;
  for (int k = 0; k < count; ++k) {
    TraceKernel kernel;
    kernel.backward = k % 2 == 1;
    kernel.block = k % 2 == 0 ? 0 : 1;
    kernel.ms = kernel.backward ? backward_ms : forward_ms;
    trace.kernels.push_back(kernel);
  }
  return trace;
}

ProfilePoint point(const ModelProfile& p, int64_t micro, int64_t activations) {
  ProfilePoint pt;
  pt.micro_batch = micro;
  pt.threads = p.threads;
  pt.persistent_bytes = kPersistent;
  pt.batch_bytes = batch_bytes(p, micro);
  pt.forward_backward_peak_bytes = pt.persistent_bytes + pt.batch_bytes + activations;
  pt.optimizer_peak_bytes = pt.persistent_bytes + pt.batch_bytes + 4096;
  pt.peak_bytes = std::max(pt.forward_backward_peak_bytes, pt.optimizer_peak_bytes);
  pt.blocks.assign(2, BlockTime{});
  return pt;
}

// Trained at 8 and 32: times affine, activations 1000 bytes a sample plus 5000.
ModelProfile measured() {
  ModelProfile p;
  p.input_sample_bytes = 100;
  p.target_sample_bytes = 8;
  p.train_samples = 1000;
  p.global_batch = 64;
  p.threads = 2;
  for (int64_t m : {8, 32}) {
    ProfilePoint pt = point(p, m, 5000 + 1000 * m);
    pt.forward_backward_ms = 2.0 + 0.5 * static_cast<double>(m);
    pt.optimizer_ms = 1.0;
    pt.step_ms = pt.forward_backward_ms + pt.optimizer_ms;
    pt.trace = two_kernels(pt.forward_backward_ms / 3, 2 * pt.forward_backward_ms / 3);
    pt.blocks[0].forward_ms = pt.trace.kernels[0].ms;
    pt.blocks[1].backward_ms = pt.trace.kernels[1].ms;
    p.points.push_back(pt);
  }
  return p;
}

// Traced at 8 (measured already), 16 and 64 (a convolution's activations are not a line: 777
// bytes more at 16), and at 128 down another path (three kernels: not the measured steps').
ModelProfile traced(const ModelProfile& p) {
  ModelProfile t = p;
  t.points.clear();
  for (int64_t m : {8, 16, 64}) {
    ProfilePoint pt = point(p, m, 5000 + 1000 * m + (m == 16 ? 777 : 0));
    pt.trace = two_kernels(0, 0);
    t.points.push_back(pt);
  }
  ProfilePoint other = point(p, 128, 1);
  other.trace = two_kernels(0, 0, 3);
  t.points.push_back(other);
  return t;
}

TEST(TracedMemory, UntrainedSizesTakeTheTracesMemoryAndTheMeasuredLinesTimes) {
  ModelProfile p = measured();
  const ModelProfile before = p;
  const TracedPoints merged = add_traced_points(p, traced(p));
  EXPECT_EQ(merged.added, 2);  // 16 and 64
  EXPECT_TRUE(merged.refused.empty());
  ASSERT_EQ(p.points.size(), 4u);
  for (const ProfilePoint& pt : p.points) {
    EXPECT_EQ(pt.memory_traced, pt.micro_batch == 16 || pt.micro_batch == 64) << pt.micro_batch;
  }
  // Memory at 16: the trace's, where the line between 8 and 32 said 777 bytes less.
  EXPECT_EQ(activation_bytes(before, 16, MixedPrecision::kOff), 5000 + 16000);
  EXPECT_EQ(activation_bytes(p, 16, MixedPrecision::kOff), 5000 + 16000 + 777);
  const ProfilePoint& at16 = p.points[2];
  ASSERT_EQ(at16.micro_batch, 16);
  EXPECT_EQ(at16.activation_bytes(), 5000 + 16000 + 777);
  EXPECT_EQ(at16.optimizer_working_bytes(), 4096);
  // Times: the measured line's, at the new sizes and between them.
  for (int64_t m : {4, 12, 16, 20, 48, 64, 100}) {
    EXPECT_DOUBLE_EQ(forward_backward_ms(p, m, MixedPrecision::kOff, 2),
                     forward_backward_ms(before, m, MixedPrecision::kOff, 2))
        << m;
  }
  // The kernels scaled to the point's time, and summed by block as a measured point's are.
  EXPECT_DOUBLE_EQ(at16.forward_backward_ms, 10.0);
  EXPECT_DOUBLE_EQ(at16.trace.kernels[0].ms + at16.trace.kernels[1].ms, 10.0);
  EXPECT_DOUBLE_EQ(at16.blocks[0].forward_ms, at16.trace.kernels[0].ms);
  EXPECT_DOUBLE_EQ(at16.blocks[1].backward_ms, at16.trace.kernels[1].ms);
  EXPECT_DOUBLE_EQ(at16.step_ms, 11.0);
}

TEST(TracedMemory, NothingToAddWhenEveryTracedSizeWasTrained) {
  ModelProfile p = measured();
  ModelProfile t = traced(p);
  t.points.resize(1);  // 8 only
  EXPECT_EQ(add_traced_points(p, t).added, 0);
  EXPECT_EQ(p.points.size(), 2u);
}

// A trace that sees less than the data run at a trained size (a kernel's workspace not declared)
// is not trusted at the sizes nobody trained: the measured line stays.
TEST(TracedMemory, TracesThatDisagreeWithATrainedSizeAreNotUsed) {
  ModelProfile p = measured();
  ModelProfile t = traced(p);
  t.points[0].forward_backward_peak_bytes -= 13000 / 50;  // 2% under at 8
  TracedPoints merged = add_traced_points(p, t);
  EXPECT_EQ(merged.added, 0);
  ASSERT_EQ(merged.refused.size(), 1u);
  EXPECT_NE(merged.refused[0].find("-2.0% off the trained step's at micro-batch 8"), std::string::npos)
      << merged.refused[0];
  EXPECT_EQ(p.points.size(), 2u);
  // Within 1% it agrees.
  t.points[0].forward_backward_peak_bytes += 13000 / 50 - 13000 / 200;
  EXPECT_EQ(add_traced_points(p, t).added, 2);
  // And a trace that saw no trained size has nothing to be checked by.
  ModelProfile q = measured();
  t.points.erase(t.points.begin());
  merged = add_traced_points(q, t);
  EXPECT_EQ(merged.added, 0);
  ASSERT_EQ(merged.refused.size(), 1u);
  EXPECT_NE(merged.refused[0].find("no trained size traced"), std::string::npos) << merged.refused[0];
}

}  // namespace
}  // namespace ht::test
