#include "parallel/pipeline_stage.h"
#include "parallel/serial_streams.h"
#include "base/clock.h"
#include "base/user_error.h"
#include "alloc/cpu_device_allocator.h"

#include <chrono>
#include <utility>

namespace ht {
namespace {

// Tags repeat every kTagSpace messages; two messages on one link with one tag still match in
// the order they were sent, which is the order the schedule consumes them.
constexpr int kTagSpace = 1 << 14;
constexpr int kEvaluationTag = kTagSpace;

}  // namespace

PipelineStage::PipelineStage(Model& model, PipelineLayout layout, std::shared_ptr<Communicator> pipeline,
                             at::Device device)
    : model_(model), layout_(std::move(layout)), pipeline_(std::move(pipeline)), device_(device) {
  const PipelineSchedule schedule = make_schedule(layout_.kind, layout_.shape);
  actions_ = schedule[static_cast<size_t>(rank())];
  if (!pipeline_->matches_by_tag()) {
    const std::optional<Posting> runs = serial_posting(schedule, layout_.shape);
    if (!runs) {
      throw UserError(std::string("parallel.pipeline_schedule = \"") + choice_name(layout_.kind) + "\" on " +
                      std::to_string(layout_.shape.stages) + " stages with " +
                      std::to_string(layout_.shape.micro_batches) + " micro-batches and " +
                      std::to_string(layout_.shape.virtual_stages) + " chunks each: no posting of its messages runs " +
                      "on " + pipeline_->backend() + ", which matches them in posting order (" +
                      check_on_serial_streams(schedule, layout_.shape, Posting::kPairs) + "); use \"1f1b\"");
    }
    posting_ = *runs;
  }
  stream_ = rank_stream(actions_, rank(), layout_.shape, posting_);
  params_ = stage_parameters(model_, layout_, rank());
  tied_ = tied_parameters(model_, layout_);
}

bool PipelineStage::holds_loss() const {
  return rank_of_virtual_stage(layout_.virtual_stages() - 1, layout_.shape) == rank();
}

int PipelineStage::tag(const LinkMessage& m) const {
  return ((m.micro_batch * layout_.virtual_stages() + m.to_vs) * 2 + (m.gradient ? 1 : 0)) % kTagSpace;
}

namespace {

// On the wire a 4-D tensor crosses channels-last as its memory: the NHWC-contiguous view of a
// channels-last tensor (communicators send contiguous tensors). A NCHW copy made the next stage's
// convolution copy its input back, and the sending stage's pooling backward copy its indices and
// gradient (measured: a ConvNet's first stage at 16 images peaked at 1,216,256 bytes, 757,504 so).
at::Tensor to_wire(const at::Tensor& value, bool channels_last) {
  if (!channels_last || value.dim() != 4) return value.contiguous();
  return value.contiguous(at::MemoryFormat::ChannelsLast).permute({0, 2, 3, 1});
}

std::vector<int64_t> wire_sizes(std::vector<int64_t> sizes, bool channels_last) {
  if (channels_last && sizes.size() == 4) return {sizes[0], sizes[2], sizes[3], sizes[1]};
  return sizes;
}

at::Tensor from_wire(at::Tensor buffer, bool channels_last) {
  return channels_last && buffer.dim() == 4 ? buffer.permute({0, 3, 1, 2}) : buffer;
}

}  // namespace

void PipelineStage::post(const std::vector<PostedMessage>& group) {
  std::vector<PeerMessage> messages;
  std::vector<std::pair<LinkMessage, at::Tensor>> buffers;
  bool sends = false;
  for (const PostedMessage& p : group) {
    const LinkMessage& m = p.message;
    PeerMessage out{p.send, at::Tensor(), p.peer, tag(m), describe(m)};
    if (p.send) {
      auto it = outbox_.find(m);
      TORCH_CHECK(it != outbox_.end(), "pipeline: ", describe(m), " is posted before it was made");
      out.tensor = std::move(it->second);
      outbox_.erase(it);
      stats_.p2p_bytes += static_cast<int64_t>(out.tensor.nbytes());
      sends = true;
    } else {
      // An activation enters to_vs; a gradient is of to_vs's output, the input of to_vs + 1.
      const int of = m.gradient ? m.to_vs + 1 : m.to_vs;
      out.tensor = at::empty(wire_sizes(layout_.input_sizes(of, micro_size_), layout_.channels_last),
                             at::TensorOptions(device_).dtype(layout_.input_dtype(of)));
      buffers.emplace_back(m, out.tensor);
    }
    messages.push_back(std::move(out));
  }
  // A backend that matches in posting order holds the stream until the group is matched (NCCL's
  // the GPU's, the host going on; nccl_like the host): the host's part of that is waiting too.
  const auto start = std::chrono::steady_clock::now();
  const std::shared_ptr<Transfer> transfer = pipeline_->post_group(std::move(messages));
  stats_.wait_ms += ms_since(start);
  for (auto& [m, buffer] : buffers) receives_.emplace(m, Receive{std::move(buffer), transfer});
  if (sends) sends_.push_back(transfer);
  reap_sends(false);
}

at::Tensor PipelineStage::take_received(const LinkMessage& m) {
  auto it = receives_.find(m);
  TORCH_CHECK(it != receives_.end(), "pipeline: no receive posted for ", describe(m));
  const auto start = std::chrono::steady_clock::now();
  it->second.transfer->wait();
  stats_.wait_ms += ms_since(start);
  at::Tensor value = from_wire(std::move(it->second.buffer), layout_.channels_last);
  receives_.erase(it);
  return value;
}

void PipelineStage::send(const at::Tensor& value, int vs, int micro_batch, bool gradient) {
  const LinkMessage m{micro_batch, gradient ? vs - 1 : vs + 1, gradient};
  outbox_[m] = to_wire(value, layout_.channels_last);
}

void PipelineStage::reap_sends(bool all) {
  std::vector<std::shared_ptr<Transfer>> pending;
  for (auto& s : sends_) {
    if (all) {
      const auto start = std::chrono::steady_clock::now();
      s->wait();
      stats_.wait_ms += ms_since(start);
    } else if (!s->done()) {
      pending.push_back(std::move(s));
    }
  }
  sends_ = std::move(pending);
}

void PipelineStage::forward(Interpreter& interp, const Action& a) {
  const int vs = virtual_stage(rank(), a.chunk, layout_.shape);
  InFlight& f = in_flight_[{a.micro_batch, a.chunk}];
  const int64_t offset = a.micro_batch * micro_size_;
  Tensor x;
  if (vs == 0) {
    x = interp.input(input_.narrow(0, offset, micro_size_).to(device_, /*non_blocking=*/true));
  } else {
    at::Tensor received = take_received({a.micro_batch, vs, false});
    x = interp.stage_input(received);
    f.input = x;
  }
  const auto start = std::chrono::steady_clock::now();
  const int first = layout_.blocks_begin(vs), end = layout_.blocks_end(vs);
  // The seeds one rank draws for these blocks of this micro-batch.
  interp.set_seed_counter(seed_base_ + static_cast<uint64_t>(a.micro_batch) * layout_.seeds_per_micro_batch() +
                          layout_.seeds_before(first));
  for (int b = first; b < end; ++b) {
    model_.block_begins(b);
    x = model_.blocks()[static_cast<size_t>(b)]->forward(x);
  }
  model_.block_begins(-1);
  if (vs + 1 == layout_.virtual_stages()) {
    f.loss = model_.loss(x, interp.input(target_.narrow(0, offset, micro_size_).to(device_, /*non_blocking=*/true)));
    // In double, micro-batch by micro-batch: the host's sum, bit for bit, never read here.
    const HostAllocationScope host(device_.is_cpu());
    loss_sum_.add_(f.loss.value().to(at::kDouble) / static_cast<double>(layout_.shape.micro_batches));
  } else {
    f.output = x;
  }
  f.tape = interp.take_tape();
  stats_.compute_ms += ms_since(start);
  stats_.peak_in_flight = std::max(stats_.peak_in_flight, static_cast<int>(in_flight_.size()));
  if (f.output.defined()) send(f.output.value(), vs, a.micro_batch, /*gradient=*/false);
}

void PipelineStage::backward(Interpreter& interp, const Action& a) {
  const int vs = virtual_stage(rank(), a.chunk, layout_.shape);
  auto it = in_flight_.find({a.micro_batch, a.chunk});
  TORCH_CHECK(it != in_flight_.end(), "pipeline: ", describe(a), " before its forward");
  InFlight& f = it->second;
  if (a.kind == ActionKind::kBackwardWeight) {
    const auto start = std::chrono::steady_clock::now();
    interp.backward(f.tape, {}, {}, BackwardPart::kWeights);
    stats_.compute_ms += ms_since(start);
    in_flight_.erase(it);
    return;
  }
  std::vector<Tensor> roots;
  std::vector<at::Tensor> grads;
  if (f.loss.defined()) {
    roots = {f.loss};
    grads = {at::full(f.loss.sizes(), loss_seed_, f.loss.value().options())};
  } else {
    roots = {f.output};
    grads = {take_received({a.micro_batch, vs, true})};
  }
  const auto start = std::chrono::steady_clock::now();
  const BackwardPart part = a.kind == ActionKind::kBackward ? BackwardPart::kAll : BackwardPart::kInputs;
  interp.backward(f.tape, roots, grads, part);
  stats_.compute_ms += ms_since(start);
  if (f.input.defined()) {
    at::Tensor g = f.input.value().grad();
    TORCH_CHECK(g.defined(), "pipeline: no gradient reached the input of stage ", vs);
    send(g.to(layout_.input_dtype(vs)), vs, a.micro_batch, /*gradient=*/true);
  }
  if (part == BackwardPart::kAll) {
    in_flight_.erase(it);
  } else {  // the weights' part comes later; what it needs is on the tape
    f.input = Tensor();
    f.output = Tensor();
    f.loss = Tensor();
  }
}

at::Tensor PipelineStage::train_step(Interpreter& interp, const at::Tensor& input, const at::Tensor& target,
                                     int64_t micro_size, double loss_seed) {
  input_ = input;
  target_ = target;
  micro_size_ = micro_size;
  loss_seed_ = loss_seed;
  {
    const HostAllocationScope host(device_.is_cpu());
    loss_sum_ = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device_));
  }
  seed_base_ = interp.seed_counter();
  stats_ = PipelineStats{};
  for (const StreamItem& item : stream_) {
    if (item.action < 0) {
      post(item.group);
      continue;
    }
    const Action& a = actions_[static_cast<size_t>(item.action)];
    if (a.kind == ActionKind::kForward) {
      forward(interp, a);
    } else {
      backward(interp, a);
    }
  }
  reap_sends(/*all=*/true);
  TORCH_CHECK(in_flight_.empty() && receives_.empty() && outbox_.empty(), "pipeline: the schedule left work undone");
  interp.set_seed_counter(seed_base_ + static_cast<uint64_t>(layout_.shape.micro_batches) *
                                           layout_.seeds_per_micro_batch());
  input_ = at::Tensor();
  target_ = at::Tensor();
  return std::exchange(loss_sum_, at::Tensor());
}

Tensor PipelineStage::forward_only(Interpreter& interp, const at::Tensor& input, int64_t n) {
  Tensor out;
  for (int vs = 0; vs < layout_.virtual_stages(); ++vs) {
    if (rank_of_virtual_stage(vs, layout_.shape) != rank()) continue;
    Tensor x;
    if (vs == 0) {
      x = interp.input(input.to(device_, /*non_blocking=*/true));
    } else {
      at::Tensor buffer =
          at::empty(layout_.input_sizes(vs, n), at::TensorOptions(device_).dtype(layout_.input_dtype(vs)));
      pipeline_->irecv(buffer, rank_of_virtual_stage(vs - 1, layout_.shape), kEvaluationTag,
                       "an evaluation activation")->wait();
      x = interp.input(buffer);
    }
    for (int b = layout_.blocks_begin(vs); b < layout_.blocks_end(vs); ++b) {
      x = model_.blocks()[static_cast<size_t>(b)]->forward(x);
    }
    if (vs + 1 == layout_.virtual_stages()) {
      out = x;
    } else {
      pipeline_->isend(x.value().contiguous(), rank_of_virtual_stage(vs + 1, layout_.shape), kEvaluationTag,
                       "an evaluation activation")->wait();
    }
  }
  return out;
}

}  // namespace ht
