// The trainer is made of parts chosen once (training/trainer_parts.h): a test hands it a gradient
// sync of its own, and the trainer runs it in the plan's place without a line of the trainer's
// files knowing.
#include "tests/support/model_cases.h"
#include "training/trainer.h"

#include <gtest/gtest.h>

namespace ht::test {
namespace {

// Records what the trainer asks of it, and halves every gradient when the step's combination is
// waited for: an all-reduce's mean over two replicas whose gradients are equal.
class HalvingSync final : public GradientSync {
 public:
  explicit HalvingSync(std::vector<at::Tensor> params) : params_(std::move(params)) {}
  GradientListener* listener(bool last) override {
    ++listeners;
    lasts += last ? 1 : 0;
    return nullptr;
  }
  void backward_ended() override { ++backwards; }
  std::unique_ptr<SyncHandle> begin() override {
    ++begins;
    class Halve final : public SyncHandle {
     public:
      explicit Halve(const std::vector<at::Tensor>& params) : params_(params) {}
      void wait() override {
        for (const at::Tensor& p : params_) {
          at::Tensor handle = p;
          if (handle.grad().defined()) handle.mutable_grad().mul_(0.5);
        }
      }

     private:
      const std::vector<at::Tensor>& params_;
    };
    return std::make_unique<Halve>(params_);
  }
  int listeners = 0, lasts = 0, backwards = 0, begins = 0;

 private:
  std::vector<at::Tensor> params_;
};

// One rank, SGD without momentum or clipping, 3 steps of 2 micro-batches of 8.
RunPlan sgd_plan(double lr) {
  RunPlan plan;
  plan.batch = BatchPlan{16, 8, 2};
  plan.optimizer.kind = OptimizerKind::kSgd;
  plan.optimizer.lr = lr;
  plan.optimizer.momentum = 0;
  plan.optimizer.schedule = LrSchedule::kConstant;
  plan.loop.steps = 3;
  plan.loop.log_interval = 100;
  plan.loop.eval_samples = 8;
  return plan;
}

DataSplits mlp_data() {
  const ModelCase& mlp = model_case("mlp");
  DataSplits data;
  auto [x, y] = mlp.data(64);
  data.train = std::make_unique<TensorDataset>(x, y);
  data.eval = std::make_unique<TensorDataset>(x.narrow(0, 0, 16), y.narrow(0, 0, 16));
  data.info.task = Task::kClassification;
  data.info.classes = 5;
  return data;
}

// Trains the MLP (the same initial weights and data every time) under `plan`, with `sync` in
// place of the plan's gradient sync where given; returns the trained parameters.
std::vector<at::Tensor> train(const RunPlan& plan, HalvingSync** sync) {
  at::manual_seed(7);
  std::shared_ptr<Model> model = model_case("mlp").make();
  DataSplits data = mlp_data();
  auto engine = std::make_unique<Engine>(plan, model, nullptr);
  TrainerParts parts = make_trainer_parts(plan, data, *engine, {});
  if (sync != nullptr) {
    auto own = std::make_unique<HalvingSync>(model->parameters());
    *sync = own.get();
    parts.sync = std::move(own);
  }
  Trainer trainer(plan, std::move(data), std::move(engine), std::move(parts));
  trainer.run(nullptr);
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : model->parameters()) out.push_back(p.detach().clone());
  if (sync != nullptr) {
    EXPECT_EQ(trainer.state().step, 3);
  }
  return out;
}

TEST(TrainerParts, ATestsOwnGradientSyncRunsInThePlansPlace) {
  HalvingSync* sync = nullptr;
  const std::vector<at::Tensor> halved = train(sgd_plan(0.1), &sync);
  ASSERT_NE(sync, nullptr);
  EXPECT_EQ(sync->listeners, 6) << "asked once before each micro-batch's backward";
  EXPECT_EQ(sync->lasts, 3) << "the last micro-batch of each step said so";
  EXPECT_EQ(sync->backwards, 6);
  EXPECT_EQ(sync->begins, 3) << "one combination per optimizer step";
  // Halved gradients at lr 0.1 are the plain run's at lr 0.05, bit for bit (scaling by 2 is exact).
  const std::vector<at::Tensor> plain = train(sgd_plan(0.05), nullptr);
  ASSERT_EQ(halved.size(), plain.size());
  bool moved = false;
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(halved[i].equal(plain[i])) << "parameter " << i;
  }
  const std::vector<at::Tensor> full = train(sgd_plan(0.1), nullptr);
  for (size_t i = 0; i < plain.size(); ++i) moved = moved || !full[i].equal(plain[i]);
  EXPECT_TRUE(moved) << "the sync changed what was trained";
}

// The step runner leaves the loss on the device, unread (the trainer reads it once the update is
// queued: no host synchronisation per micro-batch on a GPU): a double holding the bits of the mean
// the host made from each micro-batch's loss read in turn (3 of them: a division that rounds). On
// the CPU the batch is staged as is.
TEST(TrainerParts, TheRunnersLossStaysOnTheDeviceAsTheMicroBatchesMean) {
  RunPlan plan = sgd_plan(0.1);
  plan.batch = BatchPlan{24, 8, 3};
  at::manual_seed(7);
  std::shared_ptr<Model> model = model_case("mlp").make();
  DataSplits data = mlp_data();
  Engine engine(plan, model, nullptr);
  TrainerParts parts = make_trainer_parts(plan, data, engine, {});
  const Batch batch = data.train->slice(0, 24);
  const Batch staged = staged_for(batch, engine.device);
  EXPECT_TRUE(staged.input.is_same(batch.input) && staged.target.is_same(batch.target));
  const uint64_t seeds = engine.interp.seed_counter();  // the MLP's dropout draws its masks from it
  const at::Tensor loss = parts.runner->run(staged, 1.0 / 3, *parts.sync);
  EXPECT_EQ(loss.dim(), 0);
  EXPECT_EQ(loss.scalar_type(), at::kDouble);
  EXPECT_EQ(loss.device(), engine.device);
  double expected = 0;  // the parameters have not moved: each micro-batch's loss again, read
  engine.interp.set_seed_counter(seeds);
  for (int64_t k = 0; k < 3; ++k) {
    const Tensor micro = model->loss(model->forward(engine.interp.input(batch.input.narrow(0, 8 * k, 8))),
                                     engine.interp.input(batch.target.narrow(0, 8 * k, 8)));
    expected += micro.value().item<double>() / 3.0;
  }
  EXPECT_EQ(loss.item<double>(), expected);
}

// A GPU's trainer draws the next step's batch while the device runs this step (training/batches.h):
// the same batches in the same order as drawing each when its step begins, across epochs, and a
// checkpoint taken with a batch drawn ahead resumes before it.
TEST(TrainerParts, BatchesDrawnAheadAreTheSamplersAndACheckpointResumesBeforeThem) {
  const TensorDataset data(at::arange(40, at::kFloat).reshape({40, 1}), at::arange(40, at::kLong));
  const ContextLayout whole;
  Sampler one(40, 8, 5, /*shuffle=*/true), other(40, 8, 5, true), third(40, 8, 5, true);
  Batches each(data, one, whole, at::kCPU, /*ahead=*/false), ahead(data, other, whole, at::kCPU, /*ahead=*/true);
  std::optional<SamplerPosition> saved;
  std::vector<at::Tensor> after_saved;
  for (int step = 0; step < 12; ++step) {  // 5 batches an epoch
    const Batch a = each.take(), b = ahead.take();
    ASSERT_TRUE(a.input.equal(b.input)) << "step " << step;
    ASSERT_TRUE(a.target.equal(b.target)) << "step " << step;
    if (saved) after_saved.push_back(a.target);
    ahead.draw_ahead();
    ahead.draw_ahead();  // a second call draws nothing more
    const SamplerPosition p = each.position(), q = ahead.position();
    EXPECT_EQ(p.epoch, q.epoch) << "step " << step;
    EXPECT_EQ(p.batch, q.batch) << "step " << step;
    if (step == 6) saved = q;
  }
  EXPECT_EQ(each.position().epoch, 2);
  Batches resumed(data, third, whole, at::kCPU, /*ahead=*/true);
  resumed.draw_ahead();  // drawn from the start, then forgotten by the seek
  resumed.seek(*saved);
  for (const at::Tensor& target : after_saved) {
    EXPECT_TRUE(resumed.take().target.equal(target));
    resumed.draw_ahead();
  }
}

}  // namespace
}  // namespace ht::test
