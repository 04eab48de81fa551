#pragma once
// A measured profile's memory made exact at every size a trace saw. The profiler trains a model
// at every power-of-two micro-batch size a plan uses up to where a step takes too long, or at a
// run's own size alone, and the cost model interpolates and extrapolates the rest: right enough
// for time (no better figure exists: a kernel's CPU time is not a function of its work), not for
// memory: a convolutional network's activations are not a straight line between 8 and 64 images
// (the ConvNet at 16 was +4.2% between those two). A step traced on meta tensors at each size
// (launcher/planning/trace_profile.h, with this machine's kernel workspaces declared) is the data
// run's to the byte and trains nothing. Here each traced size the profile did not measure becomes
// a point of it: its memory (peaks, the trace's tensors, pipeline cuts) the trace's, its times
// the measured ones interpolated as the cost model would have, so a prediction's time does not
// change and its memory is exact.

#include "planner/profile.h"

#include <string>
#include <vector>

namespace ht {

struct TracedPoints {
  int added = 0;
  // Per precision whose traces were not used: why (the trace and a trained size disagree).
  std::vector<std::string> refused;
};

// Adds to `measured` a point for each point of `traced` whose (micro-batch, precision) it has
// not measured at its own thread count. A precision's traces are used only where they agree with
// every trained size they also traced (activations within kAgreement): a trace that sees less
// than the data run (a kernel whose workspace is not declared: bf16 convolutions, more threads
// than were measured) leaves that precision to the measured line. A traced point whose kernels
// are not the measured steps' (another path of a graph that changes every step) is left out.
TracedPoints add_traced_points(ModelProfile& measured, const ModelProfile& traced);
constexpr double kAgreement = 0.01;

}  // namespace ht
