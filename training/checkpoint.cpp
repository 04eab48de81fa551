// Reading checkpoints: verifying, loading either layout, finding the one to resume (the writing
// half is training/checkpoint_write.cpp).
#include "training/checkpoint.h"

#include "training/checkpoint_files.h"
#include "training/optimizer.h"
#include "training/optimizer_shard.h"
#include "base/user_error.h"

#include <torch/serialize/input-archive.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace ht {
namespace {

using checkpoint_files::folder_name;
namespace fs = std::filesystem;

// Which optimizer wrote an optimizer.pt: its first parameter group's options carry "betas" for
// AdamW, "momentum" for SGD (torch/optim/serialize.h); "" where the archive says neither. Loading
// one into the other stops in a PyTorch internal assert, so it is asked first.
std::string archived_optimizer(torch::serialize::InputArchive& archive) {
  torch::serialize::InputArchive groups, group, options;
  if (!archive.try_read("param_groups", groups) || !groups.try_read("param_groups/0", group) ||
      !group.try_read("options", options)) {
    return "";
  }
  c10::IValue value;
  if (options.try_read("betas", value)) return "adamw";
  if (options.try_read("momentum", value)) return "sgd";
  return "";
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

// A checkpoint's model tensors by name, from either layout: {name, is buffer} -> the tensor, or
// undefined where it has none; and how many it holds.
struct ModelSource {
  std::function<at::Tensor(const std::string&, bool)> read;
  size_t count = 0;
};

ModelSource archive_source(const fs::path& path) {
  auto archive = std::make_shared<torch::serialize::InputArchive>();
  archive->load_from(path.string());
  ModelSource source;
  source.count = archive->keys().size();
  source.read = [archive](const std::string& name, bool is_buffer) {
    at::Tensor saved;
    return archive->try_read(name, saved, is_buffer) ? saved : at::Tensor();
  };
  return source;
}

ModelSource slice_source(const std::string& folder) {
  auto index = std::make_shared<SliceIndex>(folder);
  ModelSource source;
  source.count = index->names("param").size() + index->names("buffer").size();
  source.read = [index](const std::string& name, bool is_buffer) {
    const char* kind = is_buffer ? "buffer" : "param";
    return index->find(kind, name) != nullptr ? index->whole(kind, name) : at::Tensor();
  };
  return source;
}

ModelSource model_source(const std::string& folder) {
  return SliceIndex::present(folder) ? slice_source(folder) : archive_source(fs::path(folder) / "model.pt");
}

void read_model(Model& model, const ModelSource& source) {
  size_t expected = 0;
  auto read_into = [&](const std::string& name, at::Tensor& target, bool is_buffer) {
    ++expected;
    const at::Tensor saved = source.read(name, is_buffer);
    if (!saved.defined()) throw UserError("it has no tensor " + name);
    if (saved.sizes() != target.sizes() || saved.scalar_type() != target.scalar_type()) {
      throw UserError(name + " is " + c10::str(saved.scalar_type(), saved.sizes()) + " there but " +
                      c10::str(target.scalar_type(), target.sizes()) + " in the configured model");
    }
    at::NoGradGuard no_grad;
    target.copy_(saved);
  };
  for (auto& p : model.named_parameters()) read_into(p.key(), p.value(), false);
  for (auto& b : model.named_buffers()) read_into(b.key(), b.value(), true);
  if (source.count != expected) {
    throw UserError("it holds " + std::to_string(source.count) + " tensors, the configured model " +
                    std::to_string(expected));
  }
}

// The optimizer state of sliced checkpoints into an optimizer over the whole parameters.
void read_optimizer_slices(const SliceIndex& index, const Model& model, torch::optim::Optimizer& optimizer) {
  if (index.optimizer() != optimizer_name(optimizer)) {
    throw UserError("its optimizer state is " + index.optimizer() + "'s, the configured optimizer " +
                    optimizer_name(optimizer));
  }
  for (const auto& p : model.named_parameters()) {
    const std::vector<at::Tensor> state = read_sliced_state(index, p.key(), 0, p.value());
    if (!state.empty()) set_optimizer_state(optimizer, p.value(), state);  // none: never stepped
  }
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

std::vector<at::Tensor> read_sliced_state(const SliceIndex& index, const std::string& name, int64_t offset,
                                          const at::Tensor& like) {
  return read_sliced_state(index, name, like,
                           [&](const char* kind) { return index.read(kind, name, offset, like.numel()); });
}

std::vector<at::Tensor> read_sliced_state(const SliceIndex& index, const std::string& name, const at::Tensor& like,
                                          const std::function<at::Tensor(const char* kind)>& read) {
  if (index.find("state0", name) == nullptr) return {};
  std::vector<at::Tensor> state;
  const bool adamw = index.optimizer() == "adamw";
  if (adamw) {
    const std::optional<int64_t> step = index.step(name);
    if (!step) throw UserError(index.folder() + ": the checkpoint has no step count for " + name + "'s AdamW state");
    state.push_back(at::scalar_tensor(*step, at::kLong));
  }
  for (const char* kind : {"state0", "state1"}) {
    if (!adamw && std::string(kind) == "state1") break;
    // Where the optimizer keeps it (the device, or the arena under a budget), not the reader's host copy.
    at::Tensor t = at::empty_like(like);
    memory_order(t).copy_(read(kind));
    state.push_back(t);
  }
  return state;
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
  // Whole: model.pt, optimizer.pt and trainer.pt. Sliced: trainer.pt and two files a rank.
  const bool sliced = SliceIndex::present(folder);
  if (!sliced && entries != 3) return "MANIFEST lists " + std::to_string(entries) + " files, expected 3";
  if (sliced && (entries < 3 || entries % 2 == 0)) {
    return "MANIFEST lists " + std::to_string(entries) + " files, expected trainer.pt and two a rank";
  }
  return "";
}

TrainerState CheckpointStore::load(const std::string& folder, Model& model, torch::optim::Optimizer& optimizer) {
  const fs::path dir(folder);
  auto does_not_fit = [&](const std::string& why) {
    return UserError(folder + ": this checkpoint does not fit the configured model or optimizer: " + why +
                     "; resume with the config it was saved with");
  };
  try {
    read_model(model, model_source(folder));
    if (SliceIndex::present(folder)) {
      read_optimizer_slices(SliceIndex(folder), model, optimizer);
    } else {
      torch::serialize::InputArchive optimizer_archive;
      optimizer_archive.load_from((dir / "optimizer.pt").string());
      const std::string saved = archived_optimizer(optimizer_archive), configured = optimizer_name(optimizer);
      if (!saved.empty() && saved != configured) {
        throw UserError("its optimizer state is " + saved + "'s and training.optimizer = \"" + configured +
                        "\" (--training.optimizer=" + saved + " resumes it)");
      }
      optimizer.load(optimizer_archive);
      keep_moments_in_their_dtype(optimizer);
    }
    return read_trainer_state(dir / "trainer.pt");
  } catch (const UserError& e) {
    throw does_not_fit(e.what());
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    throw does_not_fit(what.substr(0, what.find('\n')));
  }
}

TrainerState CheckpointStore::load_trainer_state(const std::string& folder) {
  try {
    return read_trainer_state(fs::path(folder) / "trainer.pt");
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    throw UserError(folder + "/trainer.pt: cannot read it: " + what.substr(0, what.find('\n')));
  }
}

std::map<std::string, at::Tensor> CheckpointStore::model_tensors(const std::string& folder) {
  std::map<std::string, at::Tensor> tensors;
  if (SliceIndex::present(folder)) {
    const SliceIndex index(folder);
    for (const char* kind : {"param", "buffer"}) {
      for (const std::string& name : index.names(kind)) tensors[name] = index.whole(kind, name);
    }
    return tensors;
  }
  torch::serialize::InputArchive archive;
  archive.load_from((fs::path(folder) / "model.pt").string());
  for (const std::string& key : archive.keys()) {
    at::Tensor t;
    if (archive.try_read(key, t) || archive.try_read(key, t, true)) tensors[key] = t;
  }
  return tensors;
}

void CheckpointStore::load_model(const std::string& folder, Model& model) {
  try {
    read_model(model, model_source(folder));
  } catch (const UserError& e) {
    throw UserError(folder + ": this checkpoint does not fit the model its run's config describes: " + e.what());
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    throw UserError(folder + ": cannot read its model: " + what.substr(0, what.find('\n')));
  }
}

std::string CheckpointStore::replacing(int64_t step) const {
  const fs::path folder = fs::path(dir_) / folder_name(step);
  std::error_code ec;
  if (!fs::exists(folder, ec)) return {};
  const std::string why = verify(folder.string());
  return "replacing " + folder.string() +
         (why.empty() ? ", the checkpoint of step " + std::to_string(step) +
                            " an earlier run wrote (this one resumed from an earlier step)"
                      : ", a damaged checkpoint (" + why + ")");
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
    warnings.push_back(folder + ": damaged checkpoint (" + why + "); falling back to the previous one, and replacing "
                       "this folder when the run saves its step again (move it away to keep it)");
  }
  return std::nullopt;
}

}  // namespace ht
