#include "tests/schedule/graphs.h"

#include <algorithm>

namespace ht::schedule::testing {

std::vector<int> GraphBuilder::op(const std::vector<int>& inputs, const std::vector<int64_t>& output_bytes,
                                  double cost_ms, int64_t working_bytes) {
  const int index = static_cast<int>(graph_.forward.size());
  ForwardOp f;
  f.cost_ms = cost_ms;
  f.inputs = inputs;
  f.working_bytes = working_bytes;
  for (int64_t bytes : output_bytes) {
    Value v;
    v.bytes = bytes;
    v.producer = index;
    f.outputs.push_back(static_cast<int>(graph_.values.size()));
    graph_.values.push_back(v);
  }
  graph_.forward.push_back(f);
  saved_.emplace_back();
  stage_working_.push_back(0);
  return graph_.forward.back().outputs;
}

void GraphBuilder::saves(const std::vector<int>& values, int64_t working_bytes) {
  saved_.back() = values;
  stage_working_.back() = working_bytes;
}

StepGraph GraphBuilder::finish(int64_t fixed_bytes) {
  StepGraph g = graph_;
  g.fixed_bytes = fixed_bytes;
  for (size_t k = 0; k < g.forward.size(); ++k) {
    for (int v : g.forward[k].inputs) g.values[v].last_forward_use = static_cast<int>(k);
  }
  for (size_t k = g.forward.size(); k-- > 0;) {
    BackwardStage s;
    s.forward_op = static_cast<int>(k);
    s.reads = saved_[k];
    s.working_bytes = stage_working_[k];
    g.backward.push_back(s);
  }
  g.finish();
  return g;
}

StepGraph chain(int n) {
  GraphBuilder b;
  int prev = -1;
  for (int i = 0; i < n; ++i) {
    const int v = b.op1(prev < 0 ? std::vector<int>{} : std::vector<int>{prev}, 1, 1.0);
    if (prev >= 0) b.saves({prev});
    prev = v;
  }
  return b.finish();
}

namespace {

constexpr int64_t kKiB = 1024, kMiB = 1024 * 1024;

// conv (saves its input), batch norm (saves its input and statistics): the output of the pair.
int conv_bn(GraphBuilder& b, int in, int64_t bytes, double conv_ms) {
  const int c = b.op1({in}, bytes, conv_ms);
  b.saves({in});
  const std::vector<int> bn = b.op({c}, {bytes, 2 * kKiB}, 0.3 * conv_ms / 2);
  b.saves({c, bn[1]});
  return bn[0];
}

int relu(GraphBuilder& b, int in, int64_t bytes) {
  const int r = b.op1({in}, bytes, 0.1);
  b.saves({r});
  return r;
}

// Linear layer with its input saved.
int linear(GraphBuilder& b, int in, int64_t bytes, double ms) {
  const int y = b.op1({in}, bytes, ms);
  b.saves({in});
  return y;
}

// Layer norm: saves its input and statistics.
int layer_norm(GraphBuilder& b, int in, int64_t bytes) {
  const std::vector<int> ln = b.op({in}, {bytes, 16 * kKiB}, 0.2);
  b.saves({in, ln[1]});
  return ln[0];
}

// Dropout: saves its mask (a quarter of the bytes: one byte per float).
int dropout(GraphBuilder& b, int in, int64_t bytes) {
  const std::vector<int> d = b.op({in}, {bytes, bytes / 4}, 0.1);
  b.saves({d[1]});
  return d[0];
}

}  // namespace

StepGraph resnet(int stages, int blocks_per_stage) {
  GraphBuilder b;
  const int64_t base = 8 * kMiB;  // batch 32, 64 channels at 32x32, fp32
  int x = b.op1({}, base, 1.0);   // stem conv: its input is the batch, a leaf
  const std::vector<int> bn = b.op({x}, {base, 2 * kKiB}, 0.15);
  b.saves({x, bn[1]});
  x = relu(b, bn[0], base);
  for (int stage = 0; stage < stages; ++stage) {
    const int64_t bytes = base >> stage;  // width doubles, resolution halves each way
    for (int block = 0; block < blocks_per_stage; ++block) {
      const int in = x;
      const int r1 = relu(b, conv_bn(b, in, bytes, 2.0), bytes);
      const int y = conv_bn(b, r1, bytes, 2.0);
      const int shortcut = stage > 0 && block == 0 ? conv_bn(b, in, bytes, 0.4) : in;
      const int sum = b.op1({y, shortcut}, bytes, 0.1);
      x = relu(b, sum, bytes);
    }
  }
  const int pooled = b.op1({x}, 64 * kKiB, 0.1);
  const int logits = linear(b, pooled, 4 * kKiB, 0.05);
  const std::vector<int> loss = b.op({logits}, {4, 4 * kKiB}, 0.05);
  b.saves({logits, loss[1]});
  b.not_droppable(loss[0]);  // the trainer holds the loss
  return b.finish(16 * kMiB);
}

StepGraph gpt(int layers) {
  GraphBuilder b;
  const int64_t h = 4 * kMiB;  // batch 8 x 256 tokens x 512 channels, fp32
  const int tokens = b.op1({}, h, 0.1);
  int x = b.op1({tokens}, h, 0.1);  // + positions
  for (int layer = 0; layer < layers; ++layer) {
    const int l1 = layer_norm(b, x, h);
    const int qkv = linear(b, l1, 3 * h, 3.0);
    int q = b.op1({qkv}, h, 0.1), k = b.op1({qkv}, h, 0.1), v = b.op1({qkv}, h, 0.1);  // heads made contiguous
    q = b.op1({q}, h, 0.1);                                                           // scaled by 1/sqrt(d)
    const std::vector<int> attn = b.op({q, k, v}, {h, 64 * kKiB}, 2.0, h);
    b.saves({q, k, v, attn[0], attn[1]}, 2 * h);
    const int merged = b.op1({attn[0]}, h, 0.1);
    const int x2 = b.op1({x, dropout(b, linear(b, merged, h, 1.0), h)}, h, 0.1);
    const int f = b.op1({linear(b, layer_norm(b, x2, h), 4 * h, 4.0)}, 4 * h, 0.2);  // + bias
    const int g = b.op1({f}, 4 * h, 0.4);                                            // gelu
    b.saves({f});
    x = b.op1({x2, dropout(b, linear(b, g, h, 4.0), h)}, h, 0.1);
  }
  const int logits = linear(b, layer_norm(b, x, h), h / 2, 2.0);
  const std::vector<int> loss = b.op({logits}, {4, 16 * kKiB}, 0.3);
  b.saves({logits, loss[1]});
  b.not_droppable(loss[0]);
  return b.finish(64 * kMiB);
}

StepGraph random_skips(int ops, uint32_t seed) {
  uint32_t state = seed * 2654435761u + 1;
  auto next = [&state](uint32_t n) {
    state = state * 1664525u + 1013904223u;
    return (state >> 8) % n;
  };
  GraphBuilder b;
  int prev = b.op1({}, 64 * kKiB, 0.5);
  int values = 1;
  for (int i = 1; i < ops; ++i) {
    std::vector<int> inputs{prev};
    if (values > 2 && next(3) == 0)  // a skip from one of the last 16 values
      inputs.push_back(std::max(0, values - 16) + static_cast<int>(next(std::min(values - 1, 15))));
    std::vector<int64_t> bytes{static_cast<int64_t>(1 + next(64)) * kKiB};
    if (next(5) == 0) bytes.push_back(static_cast<int64_t>(1 + next(16)) * kKiB);
    const std::vector<int> out = b.op(inputs, bytes, 0.05 + next(100) / 50.0, next(4) == 0 ? 32 * kKiB : 0);
    std::vector<int> saved = inputs;
    if (out.size() > 1 || next(2) == 0) saved.push_back(out.back());
    b.saves(saved, static_cast<int64_t>(next(32)) * kKiB);
    values += static_cast<int>(out.size());
    prev = out[0];
  }
  return b.finish(kMiB);
}

}  // namespace ht::schedule::testing
