// Checkpoints: complete or absent, damage detected, the newest valid one found, keep-K.
#include "training/checkpoint.h"
#include "training/optimizer.h"
#include "models/mlp.h"
#include "tests/support/temp_dir.h"

#include "base/user_error.h"

#include <gmock/gmock.h>
#include <sys/resource.h>

#include <csignal>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace ht::test {
namespace {

using ::testing::HasSubstr;

struct Fixture {
  std::shared_ptr<Mlp> model = std::make_shared<Mlp>(MlpOptions{8, {4}, 3, 0.0});
  torch::optim::SGD sgd{model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)};
  Fixture() {
    for (auto& p : model->parameters()) p.mutable_grad() = at::ones_like(p);
    sgd.step();  // creates momentum buffers worth saving
  }
};

void flip_a_byte(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(100);
  char ch = 0;
  f.read(&ch, 1);
  f.seekp(100);
  ch = static_cast<char>(ch ^ 0x5a);
  f.write(&ch, 1);
}

// What rotation and cleanup delete with (base/remove_tree.h, not std::filesystem::remove_all).
TEST(Checkpoint, RemoveTreeTakesAFolderAndLeavesWhatLinksPointTo) {
  TempDir dir;
  namespace fs = std::filesystem;
  fs::create_directories(dir.path("tree/a/b"));
  dir.write("tree/a/b/file", "x");
  dir.write("tree/top", "y");
  const std::string outside = dir.write("outside", "kept");
  fs::create_symlink(outside, dir.path("tree/a/link"));
  fs::create_directories(dir.path("elsewhere/inner"));
  fs::create_directory_symlink(dir.path("elsewhere"), dir.path("tree/dirlink"));
  remove_tree(dir.path("tree"));
  EXPECT_FALSE(fs::exists(dir.path("tree")));
  EXPECT_TRUE(fs::exists(outside)) << "a link is removed, not what it points to";
  EXPECT_TRUE(fs::exists(dir.path("elsewhere/inner")));
  std::error_code ec;
  remove_tree(dir.path("never_there"), ec);
  EXPECT_FALSE(ec) << "a missing path is no error, as with remove_all";
  remove_tree(dir.path("outside"));
  EXPECT_FALSE(fs::exists(outside)) << "a plain file goes too";
}

TEST(Checkpoint, RoundTripRestoresModelOptimizerAndState) {
  TempDir dir;
  Fixture a;
  const TrainerState state{7, {2, 3}, 41};
  const std::string folder = CheckpointStore(dir.path("ckpt"), 3).save(*a.model, a.sgd, state);
  EXPECT_EQ(CheckpointStore::verify(folder), "");
  Fixture b;
  for (auto& p : b.model->parameters()) p.detach().add_(1.0);
  const TrainerState loaded = CheckpointStore::load(folder, *b.model, b.sgd);
  EXPECT_EQ(loaded.step, 7);
  EXPECT_EQ(loaded.sampler.epoch, 2);
  EXPECT_EQ(loaded.sampler.batch, 3);
  EXPECT_EQ(loaded.seed_counter, 41u);
  EXPECT_FALSE(loaded.loss_scaler.has_value()) << "no loss scaler was saved";
  auto pa = a.model->parameters(), pb = b.model->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(pa[i].equal(pb[i]));
  // The momentum buffers came back too: the next steps agree.
  for (Fixture* f : {&a, &b}) {
    for (auto& p : f->model->parameters()) p.mutable_grad() = at::ones_like(p);
    f->sgd.step();
  }
  pa = a.model->parameters();
  pb = b.model->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(pa[i].equal(pb[i]));
}

TEST(Checkpoint, KeepsTheLossScalerOfAnFp16Run) {
  TempDir dir;
  Fixture f;
  TrainerState state{3, {0, 3}, 9};
  state.loss_scaler = LossScalerState{2048.0, 17, 2};
  const std::string folder = CheckpointStore(dir.path("ckpt"), 1).save(*f.model, f.sgd, state);
  const TrainerState loaded = CheckpointStore::load(folder, *f.model, f.sgd);
  ASSERT_TRUE(loaded.loss_scaler.has_value());
  EXPECT_EQ(loaded.loss_scaler->scale, 2048.0);
  EXPECT_EQ(loaded.loss_scaler->good_steps, 17);
  EXPECT_EQ(loaded.loss_scaler->skipped_steps, 2);
}

TEST(Checkpoint, KeepsTheNewestAndIgnoresUnfinishedFolders) {
  TempDir dir;
  Fixture f;
  CheckpointStore store(dir.path("ckpt"), 2);
  for (int64_t step : {1, 2, 3}) store.save(*f.model, f.sgd, TrainerState{step, {}, 0});
  std::filesystem::create_directories(dir.path("ckpt/.step_00000004.tmp"));  // a crash mid-save
  const auto folders = store.list();
  ASSERT_EQ(folders.size(), 2u);
  EXPECT_THAT(folders[0], HasSubstr("step_00000003"));
  EXPECT_THAT(folders[1], HasSubstr("step_00000002"));
}

// A run resumed from before an earlier run's last checkpoint: what it writes is kept (keep = 1
// deleted it at once while the later folder counted as the newest), the later folder stays until
// this run saves its step, and a killed run's temporary folder goes.
TEST(Checkpoint, KeepCountsUpToTheStepWrittenAndClearsAKilledRunsTemporaryFolder) {
  TempDir dir;
  Fixture f;
  CheckpointStore store(dir.path("ckpt"), 1);
  for (int64_t step : {4, 10}) store.save(*f.model, f.sgd, TrainerState{step, {}, 0});  // the earlier run
  std::filesystem::create_directories(dir.path("ckpt/.step_00000012.tmp"));  // killed while writing
  const std::string six = store.save(*f.model, f.sgd, TrainerState{6, {}, 0});
  EXPECT_EQ(store.list(), (std::vector<std::string>{dir.path("ckpt/step_00000010"), six}));
  EXPECT_FALSE(std::filesystem::exists(dir.path("ckpt/.step_00000012.tmp")));
  store.save(*f.model, f.sgd, TrainerState{10, {}, 0});
  EXPECT_EQ(store.list(), std::vector<std::string>{dir.path("ckpt/step_00000010")});
}

// AdamW through the copy a checkpoint is written from (host_copy_of): its moments and step counts
// come back, and the copy holds the state once and the parameters once. (The group's learning
// rate is written but libtorch 1.13's load keeps the configured one; the trainer sets it every
// step from the schedule.)
TEST(Checkpoint, AdamWsStateAndLearningRateComeBackThroughTheHostCopy) {
  TempDir dir;
  Fixture a;
  torch::optim::AdamW adamw(a.model->parameters(), torch::optim::AdamWOptions(0.01));
  for (int i = 0; i < 2; ++i) {
    for (auto& p : a.model->parameters()) p.mutable_grad() = at::randn_like(p);
    adamw.step();
  }
  set_learning_rate(adamw, 0.0042);
  const CheckpointStore store(dir.path("ckpt"), 1);
  WholeCheckpoint taken = store.take(*a.model, adamw, TrainerState{2, {}, 0});
  int64_t state_bytes = 0, parameter_bytes = 0;
  for (const auto& p : a.model->parameters()) {
    parameter_bytes += static_cast<int64_t>(p.nbytes());
    for (const at::Tensor& t : optimizer_state(adamw, p)) state_bytes += static_cast<int64_t>(t.nbytes());
  }
  EXPECT_EQ(taken.bytes, parameter_bytes + state_bytes) << "the parameters once, and their state";
  std::vector<at::Tensor> at_copy;
  for (auto& p : a.model->parameters()) {
    at_copy.push_back(p.detach().clone());
    p.detach().add_(1.0);  // training goes on: the copy holds still
  }
  store.write_unpublished(taken);
  const std::string folder = store.publish(2);
  EXPECT_EQ(CheckpointStore::verify(folder), "");
  Fixture b;
  torch::optim::AdamW loaded(b.model->parameters(), torch::optim::AdamWOptions(0.01));
  CheckpointStore::load(folder, *b.model, loaded);
  const auto pa = a.model->parameters(), pb = b.model->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(pb[i].equal(at_copy[i])) << i << ": the values at the copy";
    const std::vector<at::Tensor> sa = optimizer_state(adamw, pa[i]), sb = optimizer_state(loaded, pb[i]);
    ASSERT_EQ(sa.size(), 3u);
    ASSERT_EQ(sb.size(), 3u);
    for (size_t k = 0; k < 3; ++k) EXPECT_TRUE(sa[k].equal(sb[k])) << i << " state " << k;
  }
}

// A write the disk refuses partway through an archive (a file-size limit here, as a disk that
// fills after the space check): an error naming the file, nothing kept, the previous checkpoint
// whole, and the process alive (libtorch's archive writer ends it if told a write fell short).
TEST(Checkpoint, AWriteRefusedPartwayLeavesThePreviousCheckpoint) {
  TempDir dir;
  Fixture f;
  const CheckpointStore store(dir.path("ckpt"), 2);
  const std::string first = store.save(*f.model, f.sgd, TrainerState{1, {}, 0});
  struct rlimit before {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &before), 0);
  const auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead
  struct rlimit small = before;
  small.rlim_cur = 200;  // inside model.pt's first tensor record
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string error;
  try {
    store.save(*f.model, f.sgd, TrainerState{2, {}, 0});
  } catch (const UserError& e) {
    error = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &before);
  std::signal(SIGXFSZ, previous_handler);
  EXPECT_THAT(error, HasSubstr("the disk refused model.pt (File too large)"));
  EXPECT_THAT(error, HasSubstr("the previous checkpoint, " + first + ", is as it was"));
  EXPECT_EQ(store.list(), std::vector<std::string>{first});
  EXPECT_FALSE(std::filesystem::exists(dir.path("ckpt/.step_00000002.tmp")));
  EXPECT_EQ(CheckpointStore::verify(first), "");
}

TEST(Checkpoint, DamageIsDetected) {
  TempDir dir;
  Fixture f;
  CheckpointStore store(dir.path("ckpt"), 5);
  const std::string flipped = store.save(*f.model, f.sgd, TrainerState{1, {}, 0});
  flip_a_byte(flipped + "/model.pt");
  EXPECT_EQ(CheckpointStore::verify(flipped), "model.pt fails its checksum");
  const std::string truncated = store.save(*f.model, f.sgd, TrainerState{2, {}, 0});
  std::filesystem::resize_file(truncated + "/optimizer.pt", 10);
  EXPECT_THAT(CheckpointStore::verify(truncated), HasSubstr("optimizer.pt has 10 bytes, the manifest says"));
  const std::string no_manifest = store.save(*f.model, f.sgd, TrainerState{3, {}, 0});
  std::filesystem::remove(no_manifest + "/MANIFEST");
  EXPECT_THAT(CheckpointStore::verify(no_manifest), HasSubstr("no MANIFEST"));
}

TEST(Checkpoint, LatestFallsBackPastDamagedOnesWithAWarning) {
  TempDir dir;
  Fixture f;
  CheckpointStore store(dir.path("ckpt"), 5);
  const std::string good = store.save(*f.model, f.sgd, TrainerState{1, {}, 0});
  flip_a_byte(store.save(*f.model, f.sgd, TrainerState{2, {}, 0}) + "/trainer.pt");
  std::vector<std::string> warnings;
  EXPECT_EQ(resolve_resume("latest", dir.path("ckpt"), warnings), good);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("step_00000002: damaged checkpoint (trainer.pt fails its checksum); falling back"));
  // The fallen-back-past folder is replaced when the run saves its step again: said at the
  // resume and before it is replaced (issue 64: replaced without a word).
  EXPECT_THAT(warnings[0], HasSubstr("replacing this folder when the run saves its step again"));
  EXPECT_THAT(store.replacing(2), HasSubstr("replacing " + dir.path("ckpt/step_00000002") +
                                            ", a damaged checkpoint (trainer.pt fails its checksum)"));
  EXPECT_THAT(store.replacing(1), HasSubstr("replacing " + dir.path("ckpt/step_00000001") +
                                            ", the checkpoint of step 1 an earlier run wrote"));
  EXPECT_EQ(store.replacing(3), "") << "nothing there";
  warnings.clear();
  EXPECT_EQ(resolve_resume("latest", dir.path("empty"), warnings), std::nullopt);
  EXPECT_EQ(resolve_resume("", dir.path("ckpt"), warnings), std::nullopt);
  EXPECT_THROW(resolve_resume(dir.path("ckpt/step_00000002"), dir.path("ckpt"), warnings), UserError);
  EXPECT_THROW(resolve_resume(dir.path("nope"), dir.path("ckpt"), warnings), UserError);
}

TEST(Checkpoint, AnotherModelIsRefusedClearly) {
  TempDir dir;
  Fixture f;
  const std::string folder = CheckpointStore(dir.path("ckpt"), 1).save(*f.model, f.sgd, TrainerState{1, {}, 0});
  auto other = std::make_shared<Mlp>(MlpOptions{8, {5}, 3, 0.0});
  torch::optim::SGD sgd(other->parameters(), torch::optim::SGDOptions(0.1));
  try {
    CheckpointStore::load(folder, *other, sgd);
    FAIL() << "loading into another architecture must fail";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("does not fit the configured model or optimizer: hidden0.linear.weight "
                                    "is Float[4, 8] there but Float[5, 8] in the configured model"));
  }
}

// Another optimizer's state (issue 64): named with the key and the checkpoint's value, not left to
// a PyTorch internal assert, both ways.
TEST(Checkpoint, AnotherOptimizerIsRefusedNamingTheKey) {
  TempDir dir;
  Fixture f;
  const std::string sgd_folder = CheckpointStore(dir.path("sgd"), 1).save(*f.model, f.sgd, TrainerState{1, {}, 0});
  torch::optim::AdamW adamw(f.model->parameters(), torch::optim::AdamWOptions(0.1));
  for (auto& p : f.model->parameters()) p.mutable_grad() = at::ones_like(p);
  adamw.step();
  try {
    CheckpointStore::load(sgd_folder, *f.model, adamw);
    FAIL() << "an SGD state loaded into AdamW";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("its optimizer state is sgd's and training.optimizer = \"adamw\" "
                                    "(--training.optimizer=sgd resumes it)"));
  }
  const std::string adamw_folder = CheckpointStore(dir.path("adamw"), 1).save(*f.model, adamw, TrainerState{1, {}, 0});
  try {
    CheckpointStore::load(adamw_folder, *f.model, f.sgd);
    FAIL() << "an AdamW state loaded into SGD";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("its optimizer state is adamw's and training.optimizer = \"sgd\""));
  }
  EXPECT_NO_THROW(CheckpointStore::load(adamw_folder, *f.model, adamw)) << "its own optimizer resumes it";
}

}  // namespace
}  // namespace ht::test
