// Writing checkpoints: a whole one's copy taken, written and published; a sliced one's folder,
// every rank's files and the publish (the reading half is training/checkpoint.cpp).
#include "training/checkpoint.h"

#include "training/checkpoint_files.h"
#include "training/optimizer.h"
#include "training/per_rank.h"
#include "base/user_error.h"
#include "alloc/cpu_device_allocator.h"
#include "base/remove_tree.h"

#include <torch/serialize/output-archive.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <unistd.h>

namespace ht {
namespace {

using checkpoint_files::folder_name;
using checkpoint_files::kFiles;
using checkpoint_files::step_of_folder;
namespace fs = std::filesystem;

void fsync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw UserError(path.string() + ": cannot open to flush it to disk");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw UserError(path.string() + ": fsync failed; is the disk full?");
}

// Every parameter and buffer under its full name ("blocks.0.linear.weight"). libtorch's
// Module::load would silently take a tensor of another shape; this checks names, shapes and dtypes.
// Each tensor is written from a host copy with a storage of its own, so the file is the same
// whatever the tensors' layout in device memory (under a budget they share one block:
// training/compact.h) and the copy takes no device memory.
at::Tensor standalone(const at::Tensor& t) {
  HostAllocationScope host;
  return t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).requires_grad_(t.requires_grad());
}

// An archive's bytes, in memory: the checkpoint's size is known before anything is written.
std::string bytes_of(torch::serialize::OutputArchive& archive) {
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}


// CRC-32 of `bytes` more, in pieces zlib's 32-bit lengths take.
uLong crc_more(uLong crc, const void* data, size_t bytes) {
  for (const auto* p = static_cast<const Bytef*>(data); bytes > 0;) {
    const auto n = static_cast<uInt>(std::min<size_t>(bytes, size_t{1} << 30));
    crc = crc32(crc, p, n);
    p += n;
    bytes -= n;
  }
  return crc;
}

// Writes `archive` into `path` as it serializes (no copy of its bytes in memory), counting its
// size and CRC-32 on the way, fsyncs and closes it; std::runtime_error where the disk refused
// some of it. The archive's writer is always told every byte went: told otherwise, libtorch 1.13's
// PyTorchStreamWriter throws again from its destructor, which ends the process.
std::pair<uint64_t, uint32_t> save_archive(torch::serialize::OutputArchive& archive, const fs::path& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + path.string());
  uLong crc = crc32(0L, Z_NULL, 0);
  uint64_t bytes = 0;
  int error = 0;  // the first write's errno that failed; later writes are not tried
  try {
    archive.save_to([&](const void* data, size_t n) -> size_t {
      const char* p = static_cast<const char*>(data);
      for (size_t left = n; left > 0 && error == 0;) {
        const ssize_t wrote = ::write(fd, p, left);
        if (wrote < 0 && errno == EINTR) continue;
        if (wrote <= 0) {
          error = wrote < 0 ? errno : ENOSPC;
          break;
        }
        p += wrote;
        left -= static_cast<size_t>(wrote);
      }
      crc = crc_more(crc, data, n);
      bytes += n;
      return n;
    });
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0) error = errno;  // a network file system reports here
  if (error != 0) {
    throw std::runtime_error("the disk refused " + path.filename().string() + " (" + std::strerror(error) + ")");
  }
  return {bytes, static_cast<uint32_t>(crc)};
}

std::string trainer_state_bytes(const TrainerState& s) {
  torch::serialize::OutputArchive archive;
  archive.write("step", c10::IValue(s.step));
  archive.write("epoch", c10::IValue(s.sampler.epoch));
  archive.write("batch", c10::IValue(s.sampler.batch));
  archive.write("seed_counter", c10::IValue(static_cast<int64_t>(s.seed_counter)));
  if (s.loss_scaler) {
    archive.write("loss_scale", c10::IValue(s.loss_scaler->scale));
    archive.write("loss_scale_good_steps", c10::IValue(s.loss_scaler->good_steps));
    archive.write("skipped_steps", c10::IValue(s.loss_scaler->skipped_steps));
  }
  return bytes_of(archive);
}

// Writes `bytes` to `path`; false if the file system refused some of it (full, or a quota).
bool write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.flush();
  return static_cast<bool>(out);
}

uint32_t crc_of(const std::string& bytes) {
  return static_cast<uint32_t>(crc_more(crc32(0L, Z_NULL, 0), bytes.data(), bytes.size()));
}

}  // namespace

std::string CheckpointStore::temporary(int64_t step) const {
  return (fs::path(dir_) / ("." + folder_name(step) + ".tmp")).string();
}

std::string CheckpointStore::previous_kept() const {
  const std::vector<std::string> previous = list();
  return previous.empty() ? std::string("there is no earlier checkpoint")
                          : "the previous checkpoint, " + previous.front() + ", is as it was";
}

std::string CheckpointStore::save(const Model& model, torch::optim::Optimizer& optimizer,
                                  const TrainerState& state) const {
  WholeCheckpoint taken = take(model, optimizer, state);
  write_unpublished(taken);
  return publish(state.step);
}

WholeCheckpoint CheckpointStore::take(const Model& model, torch::optim::Optimizer& optimizer,
                                      const TrainerState& state) const {
  HostAllocationScope host;
  WholeCheckpoint c;
  c.state = state;
  for (const auto& p : model.named_parameters()) c.parameters.emplace_back(p.key(), standalone(p.value()));
  for (const auto& b : model.named_buffers()) c.buffers.emplace_back(b.key(), standalone(b.value()));
  c.optimizer = host_copy_of(optimizer);
  for (const auto* list : {&c.parameters, &c.buffers}) {
    for (const auto& [name, t] : *list) c.bytes += static_cast<int64_t>(t.nbytes());
  }
  for (const at::Tensor& p : c.optimizer->param_groups()[0].params()) {
    for (const at::Tensor& t : optimizer_state(*c.optimizer, p)) c.bytes += static_cast<int64_t>(t.nbytes());
  }
  return c;
}

void CheckpointStore::write_unpublished(WholeCheckpoint& c) const {
  HostAllocationScope host;
  const int64_t step = c.state.step;
  const fs::path dir(dir_), tmp(temporary(step));
  // The tensors' bytes and what the archives add around them: a record's headers and alignment a
  // tensor (about 1 KB), and each archive's pickled index (a few KB; an MLP's two archives and
  // trainer.pt: 14.8 KB beside 134 KB of tensors).
  const auto needed = static_cast<uint64_t>(c.bytes) + 1536 * 2 * (c.parameters.size() + c.buffers.size()) + 16384;
  auto no_room = [&](const std::string& what) {
    std::error_code ignored;
    remove_tree(tmp, ignored);
    return UserError(dir.string() + ": " + what + " writing the checkpoint of step " + std::to_string(step) +
                     ", which needs about " + std::to_string(needed) + " bytes (" +
                     std::to_string(fs::space(dir, ignored).available) + " free now); nothing of it was kept, and " +
                     previous_kept() + ". Free space there, or set checkpoint.dir to a disk with room (a new checkpoint "
                     "is written whole before those beyond checkpoint.keep are deleted)");
  };
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UserError(dir.string() + ": cannot create the checkpoint folder (" + ec.message() + "); set checkpoint.dir to a writable folder");
  const fs::space_info space = fs::space(dir, ec);
  if (!ec && space.available < needed) throw no_room("not enough free space for");
  try {
    remove_tree(tmp);
    fs::create_directories(tmp);
    std::pair<uint64_t, uint32_t> files[3];
    {  // each archive is written straight to its file, and its copies go once it is
      torch::serialize::OutputArchive archive;
      for (const auto& [name, t] : c.parameters) archive.write(name, t);
      for (const auto& [name, t] : c.buffers) archive.write(name, t, /*is_buffer=*/true);
      files[0] = save_archive(archive, tmp / kFiles[0]);
    }
    c.parameters.clear();
    c.buffers.clear();
    {
      torch::serialize::OutputArchive archive;
      c.optimizer->save(archive);
      files[1] = save_archive(archive, tmp / kFiles[1]);
    }
    c.optimizer.reset();
    const std::string trainer = trainer_state_bytes(c.state);
    if (!write_file(tmp / kFiles[2], trainer)) {
      throw std::runtime_error(std::string("the disk refused ") + kFiles[2] + " (full, or a quota)");
    }
    fsync_path(tmp / kFiles[2], false);
    files[2] = {trainer.size(), crc_of(trainer)};
    std::ostringstream manifest;
    for (size_t i = 0; i < std::size(kFiles); ++i) manifest << kFiles[i] << ' ' << files[i].first << ' ' << files[i].second << '\n';
    if (!write_file(tmp / "MANIFEST", manifest.str())) throw std::runtime_error("the disk refused MANIFEST (full, or a quota)");
    fsync_path(tmp / "MANIFEST", false);
    fsync_path(tmp, true);
  } catch (const c10::Error& e) {  // the archive's writer: the space went meanwhile, or a quota
    const std::string what = e.what_without_backtrace();
    throw no_room(what.substr(0, what.find('\n')) + ";");
  } catch (const std::exception& e) {
    throw no_room(e.what() + std::string(";"));
  }
}

std::string CheckpointStore::publish(int64_t step) const {
  const fs::path dir(dir_), final_path = dir / folder_name(step);
  remove_tree(final_path);
  fs::rename(temporary(step), final_path);
  fsync_path(dir, true);
  // Keep the newest `keep` up to this one. A later step's folder is an earlier run's (this run
  // resumed from before it): it is not counted, and not deleted here (saving its step replaces it,
  // with a warning); counting it, keep = 1 deleted the checkpoint just written.
  int64_t kept = 0;
  for (const std::string& folder : list()) {
    if (step_of_folder(folder) > step) continue;
    if (++kept > keep_) remove_tree(folder);
  }
  // A killed run's temporary folders (a checkpoint being written, never published): none of this
  // run's is in flight now.
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind(".step_", 0) == 0 && name.size() > 4 &&
        name.compare(name.size() - 4, 4, ".tmp") == 0) {
      std::error_code ignored;
      remove_tree(entry.path(), ignored);
    }
  }
  return final_path.string();
}

// Rank 0, once every rank's files are written: trainer.pt and the MANIFEST (every rank's sizes
// and CRC-32s: `all` is gather_per_rank's table, rows ok, data bytes, data CRC, index bytes,
// index CRC), then the rename and the rotation.
void CheckpointStore::publish_sliced(const std::string& folder, const TrainerState& state,
                                     const std::vector<std::vector<double>>& all) const {
  const fs::path dir(dir_), tmp(folder);
  const std::string trainer = trainer_state_bytes(state);
  std::ostringstream manifest;
  manifest << "trainer.pt " << trainer.size() << ' ' << crc_of(trainer) << '\n';
  for (size_t at = 0; at < all[0].size(); ++at) {
    const int r = static_cast<int>(at);
    manifest << slice_file_stem(r) << ".slices " << static_cast<uint64_t>(all[1][at]) << ' '
             << static_cast<uint32_t>(all[2][at]) << '\n';
    manifest << slice_file_stem(r) << ".index " << static_cast<uint64_t>(all[3][at]) << ' '
             << static_cast<uint32_t>(all[4][at]) << '\n';
  }
  for (const auto& [name, bytes] : {std::pair<const char*, std::string>{"trainer.pt", trainer},
                                    std::pair<const char*, std::string>{"MANIFEST", manifest.str()}}) {
    if (!write_file(tmp / name, bytes)) {
      std::error_code ignored;
      remove_tree(tmp, ignored);
      throw UserError(dir.string() + ": the disk refused " + name + " of the checkpoint of step " +
                      std::to_string(state.step) + " (full, or a quota); nothing of it was kept");
    }
    fsync_path(tmp / name, false);
  }
  fsync_path(tmp, true);
  publish(state.step);
}

std::string CheckpointStore::save_sliced(Communicator& group, const TrainerState& state, const std::string& optimizer,
                                         const std::function<void(SliceFileWriter&)>& write) const {
  const std::string tmp = begin_sliced(group, state.step);
  RankFiles mine;
  try {
    SliceFileWriter writer(tmp, group.rank(), optimizer);
    write(writer);
    mine.files = writer.finish();
  } catch (const std::exception& e) {
    mine.why = e.what();
  }
  return finish(group, state, mine, /*sliced=*/true);
}

std::string CheckpointStore::begin_sliced(Communicator& group, int64_t step) const {
  const fs::path dir(dir_), tmp(temporary(step));
  std::string why;
  if (group.rank() == 0) {
    try {
      fs::create_directories(dir);
      remove_tree(tmp);
      fs::create_directories(tmp);
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  // No rank writes before the folder is made (or known not to be).
  if (gather_per_rank(group, {why.empty() ? 1.0 : 0.0}, "the checkpoint's folder")[0][0] == 0) {
    throw UserError(dir.string() + ": cannot make the folder of the checkpoint of step " + std::to_string(step) + " (" +
                    (why.empty() ? "rank 0's own message says why" : why) +
                    "); set checkpoint.dir to a writable folder with room");
  }
  return tmp.string();
}

std::string CheckpointStore::finish(Communicator& group, const TrainerState& state, const RankFiles& mine, bool sliced,
                                    const std::string& late) const {
  const fs::path dir(dir_), tmp(temporary(state.step)), final_path = dir / folder_name(state.step);
  const bool first = group.rank() == 0;
  std::vector<double> row{mine.why.empty() ? 1.0 : 0.0};
  for (uint64_t v : mine.files) row.push_back(static_cast<double>(v));  // sizes and CRC-32s: exact in a double
  const std::vector<std::vector<double>> all = gather_per_rank(group, row, "the checkpoint's file sizes");
  const auto failed = std::find(all[0].begin(), all[0].end(), 0.0);
  if (failed != all[0].end()) {
    std::error_code ignored;
    if (first) remove_tree(tmp, ignored);
    const int rank = !mine.why.empty() ? group.rank() : static_cast<int>(failed - all[0].begin());
    const std::string when = late.empty() ? "" : "checkpoint.async: the checkpoint of step " + std::to_string(state.step) +
                                                     ", " + late + ", was not written: ";
    // A lone writer's own message says all (a whole checkpoint's rank 0: what it needed, what was free).
    if (!sliced && !mine.why.empty()) throw UserError(when + mine.why);
    throw UserError(when + dir.string() + ": rank " + std::to_string(rank) + " could not write its part of the checkpoint of step " +
                    std::to_string(state.step) + " (" + (mine.why.empty() ? "its own message says why" : mine.why) +
                    "); nothing of it was kept, and " + previous_kept() +
                    ". Free space there, or set checkpoint.dir to a disk with room");
  }
  std::string why;
  if (first) {
    try {
      if (sliced) {
        publish_sliced(tmp.string(), state, all);
      } else {
        publish(state.step);
      }
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  // Every rank returns a complete checkpoint, or ends with rank 0's reason (not at a barrier
  // rank 0 never reaches).
  if (gather_per_rank(group, {why.empty() ? 1.0 : 0.0}, "the checkpoint's rename")[0][0] == 0) {
    if (!first) why = dir.string() + ": rank 0 could not finish the checkpoint of step " + std::to_string(state.step) +
                      " (its own message says why)";
    throw UserError(why);
  }
  return final_path.string();
}

}  // namespace ht
