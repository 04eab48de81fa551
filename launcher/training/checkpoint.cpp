#include "launcher/training/checkpoint.h"

#include "launcher/user_error.h"
#include "alloc/cpu_device_allocator.h"
#include "base/remove_tree.h"

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <unistd.h>

namespace ht {
namespace {

namespace fs = std::filesystem;
constexpr const char* kFiles[] = {"model.pt", "optimizer.pt", "trainer.pt"};

void fsync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw UserError(path.string() + ": cannot open to flush it to disk");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw UserError(path.string() + ": fsync failed; is the disk full?");
}

// CRC-32 and size of a file.
std::pair<uint64_t, uint32_t> checksum(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> buffer(1 << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  uint64_t bytes = 0;
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const std::streamsize got = in.gcount();
    crc = crc32(crc, reinterpret_cast<const Bytef*>(buffer.data()), static_cast<uInt>(got));
    bytes += static_cast<uint64_t>(got);
  }
  return {bytes, static_cast<uint32_t>(crc)};
}

std::string folder_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return name;
}

// Every parameter and buffer under its full name ("blocks.0.linear.weight"). libtorch's
// Module::load would silently take a tensor of another shape; this checks names, shapes and dtypes.
// Each tensor is written from a host copy with a storage of its own, so the file is the same
// whatever the tensors' layout in device memory (under a budget they share one block:
// launcher/training/compact.h) and the copy takes no device memory.
at::Tensor standalone(const at::Tensor& t) {
  HostAllocationScope host;
  return t.detach().clone().requires_grad_(t.requires_grad());
}

// An archive's bytes, in memory: the checkpoint's size is known before anything is written.
std::string bytes_of(torch::serialize::OutputArchive& archive) {
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

std::string model_bytes(const Model& model) {
  torch::serialize::OutputArchive archive;
  for (const auto& p : model.named_parameters()) archive.write(p.key(), standalone(p.value()));
  for (const auto& b : model.named_buffers()) archive.write(b.key(), standalone(b.value()), /*is_buffer=*/true);
  return bytes_of(archive);
}

void read_model(Model& model, const fs::path& path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path.string());
  const std::vector<std::string> keys = archive.keys();
  size_t expected = 0;
  auto read_into = [&](const std::string& name, at::Tensor& target, bool is_buffer) {
    ++expected;
    at::Tensor saved;
    if (!archive.try_read(name, saved, is_buffer)) throw UserError("it has no tensor " + name);
    if (saved.sizes() != target.sizes() || saved.scalar_type() != target.scalar_type()) {
      throw UserError(name + " is " + c10::str(saved.scalar_type(), saved.sizes()) + " there but " +
                      c10::str(target.scalar_type(), target.sizes()) + " in the configured model");
    }
    at::NoGradGuard no_grad;
    target.copy_(saved);
  };
  for (auto& p : model.named_parameters()) read_into(p.key(), p.value(), false);
  for (auto& b : model.named_buffers()) read_into(b.key(), b.value(), true);
  if (keys.size() != expected) {
    throw UserError("it holds " + std::to_string(keys.size()) + " tensors, the configured model " +
                    std::to_string(expected));
  }
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
  return static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()),
                                     static_cast<uInt>(bytes.size())));
}

TrainerState read_trainer_state(const fs::path& path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path.string());
  auto read = [&](const char* key) {
    c10::IValue v;
    archive.read(key, v);
    return v.toInt();
  };
  TrainerState s;
  s.step = read("step");
  s.sampler.epoch = read("epoch");
  s.sampler.batch = read("batch");
  s.seed_counter = static_cast<uint64_t>(read("seed_counter"));
  // Only fp16 runs have a loss scaler; a run that had none resumes with the configured scale.
  c10::IValue scale;
  if (archive.try_read("loss_scale", scale)) {
    s.loss_scaler = LossScalerState{scale.toDouble(), read("loss_scale_good_steps"), read("skipped_steps")};
  }
  return s;
}

}  // namespace

std::string CheckpointStore::save(const Model& model, const torch::optim::Optimizer& optimizer,
                                  const TrainerState& state) const {
  const fs::path dir(dir_);
  fs::create_directories(dir);
  const fs::path tmp = dir / ("." + folder_name(state.step) + ".tmp");
  const fs::path final_path = dir / folder_name(state.step);
  // Every file's bytes first, in memory: what the checkpoint needs is known before the disk is
  // touched, and a disk that fills while it is written leaves the previous checkpoint as it was.
  std::string optimizer_bytes;
  {
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    optimizer_bytes = bytes_of(archive);
  }
  const std::string files[] = {model_bytes(model), optimizer_bytes, trainer_state_bytes(state)};
  std::ostringstream manifest;
  uint64_t needed = 0;
  for (size_t i = 0; i < std::size(kFiles); ++i) {
    manifest << kFiles[i] << ' ' << files[i].size() << ' ' << crc_of(files[i]) << '\n';
    needed += files[i].size();
  }
  needed += manifest.str().size();
  auto no_room = [&](const std::string& what) {
    std::error_code ignored;
    remove_tree(tmp, ignored);
    const std::vector<std::string> previous = list();
    return UserError(dir.string() + ": " + what + " writing the checkpoint of step " + std::to_string(state.step) +
                     ", which needs " + std::to_string(needed) + " bytes (" + std::to_string(fs::space(dir, ignored).available) +
                     " free now); nothing of it was kept, and " +
                     (previous.empty() ? std::string("there is no earlier checkpoint")
                                       : "the previous checkpoint, " + previous.front() + ", is as it was") +
                     ". Free space there, or set checkpoint.dir to a disk with room (a new checkpoint is written whole "
                     "before those beyond checkpoint.keep are deleted)");
  };
  std::error_code ec;
  const fs::space_info space = fs::space(dir, ec);
  if (!ec && space.available < needed) throw no_room("not enough free space for");
  try {
    remove_tree(tmp);
    fs::create_directories(tmp);
    auto write = [&](const char* name, const std::string& bytes) {
      if (!write_file(tmp / name, bytes)) throw std::runtime_error(std::string("the disk refused ") + name + " (full, or a quota)");
      fsync_path(tmp / name, false);
    };
    for (size_t i = 0; i < std::size(kFiles); ++i) write(kFiles[i], files[i]);
    write("MANIFEST", manifest.str());
    fsync_path(tmp, true);
  } catch (const std::exception& e) {  // the space went meanwhile (another writer), or a quota
    throw no_room(e.what() + std::string(";"));
  }
  remove_tree(final_path);
  fs::rename(tmp, final_path);
  fsync_path(dir, true);
  // Keep the newest `keep`.
  const std::vector<std::string> all = list();
  for (size_t i = static_cast<size_t>(keep_); i < all.size(); ++i) remove_tree(all[i]);
  return final_path.string();
}

std::vector<std::string> CheckpointStore::list() const {
  std::vector<std::string> folders;
  if (!fs::is_directory(dir_)) return folders;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind("step_", 0) == 0) folders.push_back(entry.path().string());
  }
  std::sort(folders.rbegin(), folders.rend());  // zero-padded step: newest first
  return folders;
}

std::string CheckpointStore::verify(const std::string& folder) {
  std::ifstream manifest(fs::path(folder) / "MANIFEST");
  if (!manifest) return "no MANIFEST (incomplete or not a checkpoint)";
  std::string file;
  uint64_t bytes = 0;
  uint32_t crc = 0;
  int entries = 0;
  while (manifest >> file >> bytes >> crc) {
    ++entries;
    const fs::path path = fs::path(folder) / file;
    if (!fs::exists(path)) return file + " is missing";
    const auto [actual_bytes, actual_crc] = checksum(path);
    if (actual_bytes != bytes) {
      return file + " has " + std::to_string(actual_bytes) + " bytes, the manifest says " + std::to_string(bytes);
    }
    if (actual_crc != crc) return file + " fails its checksum";
  }
  if (entries != 3) return "MANIFEST lists " + std::to_string(entries) + " files, expected 3";
  return "";
}

TrainerState CheckpointStore::load(const std::string& folder, Model& model, torch::optim::Optimizer& optimizer) {
  const fs::path dir(folder);
  auto does_not_fit = [&](const std::string& why) {
    return UserError(folder + ": this checkpoint does not fit the configured model or optimizer: " + why +
                     "; resume with the config it was saved with");
  };
  try {
    read_model(model, dir / "model.pt");
    torch::serialize::InputArchive optimizer_archive;
    optimizer_archive.load_from((dir / "optimizer.pt").string());
    optimizer.load(optimizer_archive);
    return read_trainer_state(dir / "trainer.pt");
  } catch (const UserError& e) {
    throw does_not_fit(e.what());
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    throw does_not_fit(what.substr(0, what.find('\n')));
  }
}

void CheckpointStore::load_model(const std::string& folder, Model& model) {
  try {
    read_model(model, fs::path(folder) / "model.pt");
  } catch (const UserError& e) {
    throw UserError(folder + ": this checkpoint does not fit the model its run's config describes: " + e.what());
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    throw UserError(folder + "/model.pt: cannot read it: " + what.substr(0, what.find('\n')));
  }
}

std::optional<std::string> resolve_resume(const std::string& resume, const std::string& dir,
                                          std::vector<std::string>& warnings) {
  if (resume.empty()) return std::nullopt;
  if (resume != "latest") {
    if (!fs::is_directory(resume)) {
      throw UserError("checkpoint.resume = \"" + resume + "\": no such checkpoint folder; use \"latest\" or a "
                      "step_<N> folder under " + dir);
    }
    const std::string why = CheckpointStore::verify(resume);
    if (!why.empty()) throw UserError(resume + ": damaged checkpoint: " + why + "; use an older one or \"latest\"");
    return resume;
  }
  for (const std::string& folder : CheckpointStore(dir, 1).list()) {
    const std::string why = CheckpointStore::verify(folder);
    if (why.empty()) return folder;
    warnings.push_back(folder + ": damaged checkpoint (" + why + "); falling back to the previous one");
  }
  return std::nullopt;
}

}  // namespace ht
