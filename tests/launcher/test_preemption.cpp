// Faults a run survives without losing work. SIGTERM and SIGINT (Slurm's preemption, a user's
// Ctrl-C): the run finishes its step, writes a checkpoint and ends with 128 + the signal; resumed,
// it trains on to the parameters of a run that was never stopped. A second signal ends it at once
// and leaves no half-written checkpoint; under mpirun, a signal to one rank stops every rank after
// the same step. A disk that fills while a checkpoint is written leaves the previous one intact.
// checkpoint.async: a kill while a checkpoint is written in the background, or a disk that fills
// then, leaves the previous one whole; and what it writes is what a run that waits writes.
#include "training/checkpoint.h"
#include "tests/support/mpi_job.h"
#include "tests/support/ranks.h"
#include "tests/support/run_binary.h"
#include "tests/support/temp_dir.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/mount.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <thread>

namespace ht::test {
namespace {

using ::testing::HasSubstr;

// A constant learning rate: the total step count changes only where a run stops.
const char* kJob = R"([model]
name = "mlp"
hidden = [64, 64]
[data]
dataset = "synthetic"
synthetic_samples = 512
synthetic_eval_samples = 64
synthetic_shape = [3, 8, 8]
synthetic_classes = 4
[training]
global_batch_size = 32
lr = 0.05
schedule = "constant"
threads = 1
[metrics]
log_interval = 1
)";

int train_records(const std::string& metrics) {
  const std::string text = read_file(metrics);
  int n = 0;
  for (size_t at = text.find("\"event\": \"train\""); at != std::string::npos; at = text.find("\"event\": \"train\"", at + 1)) ++n;
  return n;
}

// Polls `done` every 50 ms for up to `seconds`; whether it became true.
template <typename Done>
bool wait_for(Done&& done, double seconds) {
  const auto start = std::chrono::steady_clock::now();
  while (!done()) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

// A job in the background (under `launcher`, e.g. mpirun, or none), writing into `out`; the
// exit status lands in <out>.rc.
struct Background {
  Background(const std::string& launcher, const std::string& args, const std::string& out)
      : out(out), rc_file(out + ".rc"), log(out + ".log") {
    std::system(("(" + launcher + HT_BINARY + " " + args + " --job.output_dir=" + out + " > " + log +
                 " 2>&1; echo $? > " + rc_file + ") &").c_str());
  }
  ~Background() {
    for (pid_t pid : ranks_running(out)) ::kill(pid, SIGKILL);  // never leave one behind
  }
  // Once `records` steps are logged: the ranks' pids.
  std::vector<pid_t> training(int records, size_t ranks) {
    std::vector<pid_t> pids;
    wait_for([&] {
      pids = ranks_running(out);
      return pids.size() == ranks && train_records(out + "/metrics.jsonl") >= records;
    }, 300);
    return pids;
  }
  std::string wait_rc() {
    wait_for([&] { return !read_file(rc_file).empty(); }, 300);
    return read_file(rc_file);
  }
  std::string out, rc_file, log;
};

int64_t steps_in_summary(const std::string& out) {
  std::smatch m;
  const std::string summary = read_file(out + "/summary.json");
  if (!std::regex_search(summary, m, std::regex("\"steps\": ([0-9]+)"))) return -1;
  return std::stoll(m[1]);
}

std::string step_folder(const std::string& checkpoints, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return checkpoints + "/" + name;
}

TEST(Preemption, SigtermStopsAfterAStepAndTheResumedRunIsTheUninterruptedOne) {
  TempDir dir;
  const std::string config = dir.write("job.toml", kJob);
  Background job("", config + " --training.steps=1000000 --checkpoint.interval=0", dir.path("stopped"));
  const std::vector<pid_t> pids = job.training(3, 1);
  ASSERT_EQ(pids.size(), 1u) << read_file(job.log);
  ::kill(pids[0], SIGTERM);
  EXPECT_EQ(job.wait_rc(), "143\n") << read_file(job.log);
  EXPECT_THAT(read_file(job.log), HasSubstr("stopped by SIGTERM after step"));
  EXPECT_THAT(read_file(job.out + "/summary.json"), HasSubstr("\"stopped_by\": \"SIGTERM\""));
  const int64_t n = steps_in_summary(job.out);
  ASSERT_GE(n, 3);
  const std::string checkpoints = job.out + "/checkpoints";
  EXPECT_EQ(CheckpointStore::verify(step_folder(checkpoints, n)), "") << "a checkpoint of the last step";

  // Resumed from it, and a run never stopped, to the same step: the same bytes.
  const std::string to = " --training.steps=" + std::to_string(n + 3) + " --checkpoint.interval=1000000";
  const ProcessResult resumed = run_binary(config + to + " --checkpoint.resume=latest --checkpoint.dir=" + checkpoints +
                                           " --job.output_dir=" + dir.path("resumed"));
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  // It says the steps it ran, not the last step's number (issue 64: "done: 1500 steps" after 1000).
  EXPECT_THAT(resumed.output, HasSubstr("done: 3 steps (" + std::to_string(n + 1) + " to " + std::to_string(n + 3) +
                                        ", resumed from step " + std::to_string(n) + ")"));
  EXPECT_THAT(read_file(dir.path("resumed/summary.json")), HasSubstr("\"steps_run\": 3"));
  const ProcessResult plain = run_binary(config + to + " --job.output_dir=" + dir.path("plain"));
  ASSERT_EQ(plain.status, 0) << plain.output;
  const std::string a = read_file(step_folder(checkpoints, n + 3) + "/model.pt");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == read_file(step_folder(dir.path("plain/checkpoints"), n + 3) + "/model.pt"))
      << "resumed after the signal, the parameters are the uninterrupted run's";
}

// The second signal comes while the first stop (and a checkpoint every step) is under way.
TEST(Preemption, ASecondSignalEndsAtOnceAndLeavesNoHalfWrittenCheckpoint) {
  TempDir dir;
  const std::string config = dir.write("job.toml", kJob);
  Background job("", config + " --training.steps=1000000 --checkpoint.interval=1 --checkpoint.keep=1000",
                 dir.path("twice"));
  const std::vector<pid_t> pids = job.training(3, 1);
  ASSERT_EQ(pids.size(), 1u) << read_file(job.log);
  ::kill(pids[0], SIGTERM);
  ::kill(pids[0], SIGINT);
  const std::string rc = job.wait_rc();
  if (rc == "130\n") {
    EXPECT_THAT(read_file(job.log), HasSubstr("a second signal: ending now, without a checkpoint"));
  } else {
    EXPECT_EQ(rc, "143\n") << "the first stop was over before the second signal: " << read_file(job.log);
  }
  const std::vector<std::string> saved = CheckpointStore(job.out + "/checkpoints", 1000).list();
  ASSERT_FALSE(saved.empty());
  for (const std::string& folder : saved) EXPECT_EQ(CheckpointStore::verify(folder), "") << folder;
  const ProcessResult resumed = run_binary(config + " --training.steps=" + std::to_string(saved.size() + 5) +
                                           " --checkpoint.resume=latest --checkpoint.dir=" + job.out +
                                           "/checkpoints --job.output_dir=" + dir.path("resumed"));
  EXPECT_EQ(resumed.status, 0) << resumed.output;
}

TEST(Preemption, ASignalToOneRankStopsEveryRankAfterTheSameStep) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", kJob);
  Background job(mpirun(2), config + " --training.steps=1000000 --checkpoint.interval=0", dir.path("ranks"));
  const std::vector<pid_t> pids = job.training(3, 2);
  ASSERT_EQ(pids.size(), 2u) << read_file(job.log);
  ::kill(pids[1], SIGTERM);  // one rank only, whichever it is
  const std::string rc = job.wait_rc();
  EXPECT_NE(rc, "0\n");
  const std::string log = read_file(job.log);
  EXPECT_THAT(log, HasSubstr("stopped by SIGTERM after step")) << log;
  const int64_t n = steps_in_summary(job.out);
  ASSERT_GE(n, 3) << log;
  EXPECT_EQ(CheckpointStore::verify(step_folder(job.out + "/checkpoints", n)), "") << log;
}

int64_t step_of(const std::string& folder) {
  return std::stoll(std::filesystem::path(folder).filename().string().substr(5));  // step_00000042
}

// kill -9 of one rank mid-run: the job ends (mpirun ends the others) well within the collective
// timeout, and the whole job resumed from its newest checkpoint trains on to the parameters of a
// job never stopped.
TEST(Preemption, AKilledRankEndsTheJobAndTheResumedJobIsTheUninterruptedOne) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", kJob);
  Background job(mpirun(2), config + " --training.steps=1000000 --checkpoint.interval=2 --checkpoint.keep=1000 " +
                 "--parallel.timeout_s=20", dir.path("killed"));
  const std::vector<pid_t> pids = job.training(6, 2);
  ASSERT_EQ(pids.size(), 2u) << read_file(job.log);
  ::kill(pids[1], SIGKILL);
  const std::string rc = job.wait_rc();
  ASSERT_FALSE(rc.empty()) << "the job still ran 120 s after a rank was killed";
  EXPECT_NE(rc, "0\n");
  std::vector<std::string> warnings;
  const std::optional<std::string> latest = resolve_resume("latest", job.out + "/checkpoints", warnings);
  ASSERT_TRUE(latest.has_value()) << read_file(job.log);
  const int64_t n = step_of(*latest);
  ASSERT_GE(n, 2);

  const std::string to = " --training.steps=" + std::to_string(n + 3) + " --checkpoint.interval=1000000";
  ASSERT_EQ(run(mpirun(2) + HT_BINARY + " " + config + to + " --checkpoint.resume=latest --checkpoint.dir=" +
                job.out + "/checkpoints --job.output_dir=" + dir.path("resumed")), 0);
  ASSERT_EQ(run(mpirun(2) + HT_BINARY + " " + config + to + " --job.output_dir=" + dir.path("plain")), 0);
  const std::string a = read_file(step_folder(job.out + "/checkpoints", n + 3) + "/model.pt");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == read_file(step_folder(dir.path("plain/checkpoints"), n + 3) + "/model.pt"))
      << "resumed after a rank died, the parameters are those of a job never stopped";
}

// Saved by 2 ranks, resumed by 1 and by 4: the same step and data position (same global batch),
// so the losses go on alike; parameters differ only by the order fp32 sums the replicas' shares.
TEST(Preemption, ResumingWithAnotherNumberOfRanksGoesOnFromTheSameStepAndData) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", kJob);
  ASSERT_EQ(run(mpirun(2) + HT_BINARY + " " + config + " --training.steps=6 --checkpoint.interval=6 --job.output_dir=" +
                dir.path("two")), 0);
  const std::string saved = step_folder(dir.path("two/checkpoints"), 6);
  auto resume = [&](int ranks) {
    const std::string out = dir.path("on" + std::to_string(ranks));
    const std::string command = std::string(HT_BINARY) + " " + config + " --training.steps=9 --checkpoint.interval=9 " +
                                "--checkpoint.resume=" + saved + " --job.output_dir=" + out;
    EXPECT_EQ(run(ranks > 1 ? mpirun(ranks) + command : command), 0) << ranks << " ranks";
    return out;
  };
  const std::string on2 = resume(2), on1 = resume(1), on4 = resume(4);
  for (const std::string& out : {on1, on4}) {
    EXPECT_THAT(read_file(out + "/summary.json"), HasSubstr("\"resumed_from_step\": 6")) << out;
    for (int step = 7; step <= 9; ++step) {
      auto loss_at = [&](const std::string& o) {
        std::smatch m;
        const std::string metrics = read_file(o + "/metrics.jsonl");
        const std::regex record("\"step\": " + std::to_string(step) + ", \"epoch\": [0-9]+, \"loss\": ([0-9.e+-]+)");
        return std::regex_search(metrics, m, record) ? std::stod(m[1]) : -1.0;
      };
      EXPECT_NEAR(loss_at(out), loss_at(on2), 1e-4) << out << " step " << step;
      EXPECT_GE(loss_at(out), 0) << out << " step " << step;
    }
    const auto a = read_model(out + "/checkpoints/step_00000009/model.pt");
    const auto b = read_model(on2 + "/checkpoints/step_00000009/model.pt");
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [name, t] : a) EXPECT_TRUE(at::allclose(t, b.at(name), 1e-4, 1e-5)) << out << " " << name;
  }
}

// A folder on a tmpfs of its own size (root only: mount), unmounted when it goes.
struct SmallDisk {
  SmallDisk(const std::string& path, const std::string& size) : path(path) {
    std::filesystem::create_directories(path);
    mounted = ::mount("tmpfs", path.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0;
  }
  ~SmallDisk() {
    if (mounted) ::umount(path.c_str());
  }
  std::string path;
  bool mounted = false;
};

// After a checkpoint the disk refused: the one before is the only one, whole, and nothing of the
// refused one is left.
void expect_one_whole_checkpoint_and_no_temporary(const std::string& checkpoints) {
  const std::vector<std::string> saved = CheckpointStore(checkpoints, 10).list();
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(CheckpointStore::verify(saved[0]), "");
  for (const auto& entry : std::filesystem::directory_iterator(checkpoints)) {
    EXPECT_EQ(entry.path().filename().string().rfind(".", 0), std::string::npos) << "a temporary left: " << entry.path();
  }
}

TEST(CheckpointFaults, ADiskThatFillsKeepsThePreviousCheckpointAndSaysWhatItNeeds) {
  TempDir dir;
  // One checkpoint of this MLP takes about 140 KB (parameters and momentum): the first fits, the
  // second (written before the first is deleted) does not.
  SmallDisk disk(dir.path("disk"), "200k");
  if (!disk.mounted) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  const std::string config = dir.write("job.toml", kJob);
  const std::string checkpoints = disk.path + "/checkpoints";
  const ProcessResult full = run_binary(config + " --training.steps=5 --checkpoint.interval=1 --checkpoint.keep=1" +
                                        " --checkpoint.dir=" + checkpoints + " --job.output_dir=" + dir.path("run"));
  EXPECT_EQ(full.status, 2) << full.output;
  EXPECT_THAT(full.output, ::testing::ContainsRegex(checkpoints + ": not enough free space for writing the "
                                                   "checkpoint of step 2, which needs about [0-9]+ bytes \\([0-9]+ free now\\)"));
  EXPECT_THAT(full.output, HasSubstr("the previous checkpoint, " + step_folder(checkpoints, 1) + ", is as it was"));
  expect_one_whole_checkpoint_and_no_temporary(checkpoints);
  // resume = latest finds it (and stops again at the same wall: the disk is still full).
  const ProcessResult resumed = run_binary(config + " --training.steps=1 --checkpoint.resume=latest --checkpoint.dir=" +
                                           checkpoints + " --job.output_dir=" + dir.path("resumed"));
  EXPECT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_THAT(read_file(dir.path("resumed/summary.json")), HasSubstr("\"resumed_from_step\": 1"));
}


// A kill -9 while an async checkpoint's files are written (held there by the test's hook, so the
// kill never depends on timing): the previous checkpoint is the newest whole one, nothing was
// published of the one in flight, and the run resumed from the previous one trains on to the bytes
// of a run never stopped.
TEST(AsyncCheckpoint, AKillDuringItsWriteLeavesThePreviousOneAndTheResumeIsTheUninterruptedRun) {
  TempDir dir;
  const std::string config = dir.write("job.toml", kJob);
  const std::string writing = dir.path("writing");
  Background job("HT_TEST_HOLD_CHECKPOINT_WRITE=4:" + writing + " ",
                 config + " --training.steps=8 --checkpoint.interval=2 --checkpoint.keep=10 --checkpoint.async=true",
                 dir.path("killed"));
  ASSERT_TRUE(wait_for([&] { return std::filesystem::exists(writing); }, 300)) << read_file(job.log);
  const std::vector<pid_t> pids = ranks_running(job.out);
  ASSERT_EQ(pids.size(), 1u) << read_file(job.log);
  ::kill(pids[0], SIGKILL);
  EXPECT_EQ(job.wait_rc(), "137\n") << read_file(job.log);
  const std::string checkpoints = job.out + "/checkpoints";
  EXPECT_EQ(CheckpointStore(checkpoints, 10).list(), std::vector<std::string>{step_folder(checkpoints, 2)});
  EXPECT_EQ(CheckpointStore::verify(step_folder(checkpoints, 2)), "");
  EXPECT_TRUE(std::filesystem::exists(checkpoints + "/.step_00000004.tmp/MANIFEST")) << "held after its files";

  const std::string to = " --training.steps=8 --checkpoint.interval=8";
  const ProcessResult resumed = run_binary(config + to + " --checkpoint.async=true --checkpoint.resume=latest " +
                                           "--checkpoint.dir=" + checkpoints + " --job.output_dir=" + dir.path("resumed"));
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("resumed from " + step_folder(checkpoints, 2) + " at step 2"));
  const ProcessResult plain = run_binary(config + to + " --job.output_dir=" + dir.path("plain"));
  ASSERT_EQ(plain.status, 0) << plain.output;
  const std::string a = read_file(step_folder(checkpoints, 8) + "/model.pt");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == read_file(step_folder(dir.path("plain/checkpoints"), 8) + "/model.pt"));
  EXPECT_FALSE(std::filesystem::exists(checkpoints + "/.step_00000004.tmp")) << "the resumed run's first checkpoint deletes the killed run's temporary folder";
}

// A disk that fills while an async checkpoint is written: the run ends (exit 2) at the step where
// it learns so, naming the checkpoint, the steps that ran meanwhile and what the write needed; the
// previous checkpoint is as it was and nothing of the new one is left.
TEST(AsyncCheckpoint, ADiskThatFillsDuringItsWriteEndsTheRunAndKeepsThePreviousOne) {
  TempDir dir;
  SmallDisk disk(dir.path("disk"), "200k");
  if (!disk.mounted) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  const std::string config = dir.write("job.toml", kJob);
  const std::string checkpoints = disk.path + "/checkpoints";
  const ProcessResult full = run_binary(config + " --training.steps=5 --checkpoint.interval=1 --checkpoint.keep=1" +
                                        " --checkpoint.async=true --checkpoint.dir=" + checkpoints +
                                        " --job.output_dir=" + dir.path("run"));
  EXPECT_EQ(full.status, 2) << full.output;
  EXPECT_THAT(full.output, ::testing::ContainsRegex("checkpoint.async: the checkpoint of step 2, written while steps? "
                                                    "[0-9 to]+ trained, was not written: " + checkpoints +
                                                    ": not enough free space for writing the checkpoint of step 2"));
  EXPECT_THAT(full.output, HasSubstr("the previous checkpoint, " + step_folder(checkpoints, 1) + ", is as it was"));
  expect_one_whole_checkpoint_and_no_temporary(checkpoints);
}

// Two sharded ranks (every rank writes its slices): the async checkpoints are, file for file, those
// a run that waits for each writes; and resumed from one, the run trains on to the bytes of the
// run never stopped. Two replicas' whole checkpoints (rank 0 writes) too.
TEST(AsyncCheckpoint, ItsFilesAreTheWaitingRunsAndItsResumeIsTheUninterruptedRun) {
  if (run("mpirun --version") != 0) GTEST_SKIP() << "no mpirun on this machine";
  TempDir dir;
  const std::string config = dir.write("job.toml", kJob);
  const std::string job = std::string(HT_BINARY) + " " + config + " --parallel.shard=optimizer --training.steps=6 ";
  ASSERT_EQ(run(mpirun(2) + job + "--checkpoint.interval=2 --checkpoint.async=true --job.output_dir=" + dir.path("async")), 0);
  ASSERT_EQ(run(mpirun(2) + job + "--checkpoint.interval=2 --job.output_dir=" + dir.path("sync")), 0);
  const std::string resume_from = step_folder(dir.path("async/checkpoints"), 4);
  ASSERT_EQ(run(mpirun(2) + job + "--checkpoint.interval=6 --checkpoint.async=true --checkpoint.resume=" + resume_from +
                " --job.output_dir=" + dir.path("resumed")), 0);
  for (int step : {2, 4, 6}) {
    const std::string async = step_folder(dir.path("async/checkpoints"), step);
    const std::string sync = step_folder(dir.path("sync/checkpoints"), step);
    ASSERT_EQ(CheckpointStore::verify(async), "") << async;
    for (const char* file : {"rank_00000.slices", "rank_00001.slices", "rank_00000.index", "rank_00001.index", "MANIFEST"}) {
      const std::string bytes = read_file(async + "/" + file);
      EXPECT_FALSE(bytes.empty()) << async << "/" << file;
      EXPECT_TRUE(bytes == read_file(sync + "/" + file)) << async << "/" << file;
      if (step == 6) {
        EXPECT_TRUE(bytes == read_file(step_folder(dir.path("resumed/checkpoints"), 6) + "/" + file)) << file;
      }
    }
  }
  // Replicas without sharding: rank 0 writes a whole checkpoint, and the other rank takes part in
  // publishing it (the agreement after each step, the outcome gathered).
  const std::string replicas = std::string(HT_BINARY) + " " + config + " --training.steps=6 --checkpoint.interval=2 ";
  ASSERT_EQ(run(mpirun(2) + replicas + "--checkpoint.async=true --job.output_dir=" + dir.path("dp_async")), 0);
  ASSERT_EQ(run(mpirun(2) + replicas + "--job.output_dir=" + dir.path("dp_sync")), 0);
  for (int step : {2, 4, 6}) {
    const std::string async = step_folder(dir.path("dp_async/checkpoints"), step);
    EXPECT_EQ(CheckpointStore::verify(async), "") << async;
    const std::string bytes = read_file(async + "/model.pt");
    EXPECT_FALSE(bytes.empty()) << async;
    EXPECT_TRUE(bytes == read_file(step_folder(dir.path("dp_sync/checkpoints"), step) + "/model.pt")) << async;
  }
  const std::string metrics = read_file(dir.path("async/metrics.jsonl"));
  EXPECT_THAT(metrics, HasSubstr("\"event\": \"checkpoint\", \"step\": 4"));
  EXPECT_THAT(metrics, HasSubstr("\"async\": true"));
}

}  // namespace
}  // namespace ht::test
