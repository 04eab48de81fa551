#include "launcher/planning/device_catalog.h"

#include "base/user_error.h"
#include "alloc/byte_size.h"
#include "alloc/cuda_arena.h"
#include "launcher/planning/device_measure.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <tuple>

namespace ht {

// configs/devices.toml, as CMake read it when the binary was built (device_catalog_text.cpp.in).
extern const char* const kBuiltInDeviceCatalog;

namespace {

std::string kinds_of(const std::map<std::string, DeviceKind>& catalog) {
  std::string out;
  for (const auto& [kind, d] : catalog) out += (out.empty() ? "" : ", ") + kind;
  return out;
}

DeviceKind parse_kind(const std::string& kind, const toml::table& t, const std::string& where) {
  const std::string at = where + ": [" + kind + "]";
  static const std::set<std::string> keys{"name", "source", "memory", "memory_gbps", "bf16_tflops", "fp16_tflops",
                                          "fp32_tflops", "intra_node_gbps", "inter_node_gbps", "devices_per_node"};
  for (auto&& [key, node] : t) {
    if (keys.count(std::string(key.str())) == 0) {
      throw UserError(at + ": unknown key " + std::string(key.str()) + "; a device has name, source, memory, "
                      "memory_gbps, bf16_tflops, fp16_tflops, fp32_tflops, intra_node_gbps, inter_node_gbps, "
                      "devices_per_node");
    }
  }
  DeviceKind d;
  d.kind = kind;
  auto text = [&](const char* key) {
    const std::optional<std::string> v = t[key].value<std::string>();
    if (!v || v->empty()) throw UserError(at + ": " + key + " is missing or not a string");
    return *v;
  };
  auto positive = [&](const char* key) {
    const std::optional<double> v = t[key].value<double>();
    if (!v || !(*v > 0)) throw UserError(at + ": " + key + " is missing or not a positive number (see configs/devices.toml)");
    return *v;
  };
  d.name = text("name");
  d.source = text("source");
  const std::string memory = text("memory");
  const std::optional<int64_t> bytes = parse_byte_size(memory, 0);
  if (!bytes || *bytes <= 0) throw UserError(at + ": memory = \"" + memory + "\" is not a memory size, e.g. \"80GB\"");
  d.memory_bytes = *bytes;
  d.memory_gbps = positive("memory_gbps");
  d.bf16_tflops = positive("bf16_tflops");
  d.fp16_tflops = positive("fp16_tflops");
  d.fp32_tflops = positive("fp32_tflops");
  d.intra_node_gbps = positive("intra_node_gbps");
  d.inter_node_gbps = positive("inter_node_gbps");
  const double per_node = positive("devices_per_node");
  if (per_node != static_cast<double>(static_cast<int>(per_node))) {
    throw UserError(at + ": devices_per_node must be a whole number");
  }
  d.devices_per_node = static_cast<int>(per_node);
  return d;
}

int whole_number(const std::string& text, const std::string& what, const std::string& argument) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v <= 0 || v > 100000) {
    throw UserError(argument + ": " + what + " \"" + text + "\" is not a positive whole number");
  }
  return static_cast<int>(v);
}

}  // namespace

std::map<std::string, DeviceKind> parse_device_catalog(const std::string& text, const std::string& where) {
  toml::table root;
  try {
    root = toml::parse(text, where);
  } catch (const toml::parse_error& e) {
    throw UserError(where + ":" + std::to_string(e.source().begin.line) + ": TOML syntax error: " +
                    std::string(e.description()));
  }
  std::map<std::string, DeviceKind> catalog;
  for (auto&& [key, node] : root) {
    const std::string kind(key.str());
    const toml::table* table = node.as_table();
    if (table == nullptr) throw UserError(where + ": " + kind + " is not a [kind] table of a device's figures");
    catalog[kind] = parse_kind(kind, *table, where);
  }
  return catalog;
}

namespace {

// The kinds this process measured (add_measured_kind), behind a lock of their own.
std::mutex& measured_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, DeviceKind>& measured_kinds() {
  static std::map<std::string, DeviceKind> kinds;
  return kinds;
}

}  // namespace

void add_measured_kind(const DeviceKind& kind) {
  std::lock_guard<std::mutex> lock(measured_mutex());
  measured_kinds()[kind.kind] = kind;
}

std::map<std::string, DeviceKind> device_catalog(const std::string& user_file) {
  std::map<std::string, DeviceKind> catalog = parse_device_catalog(kBuiltInDeviceCatalog, "configs/devices.toml (built in)");
  {
    std::lock_guard<std::mutex> lock(measured_mutex());
    for (const auto& [key, kind] : measured_kinds()) catalog[key] = kind;
  }
  if (user_file.empty()) return catalog;
  std::ifstream in(user_file);
  if (!in) throw UserError("--devices " + user_file + ": cannot read it; give a TOML file of [kind] tables as configs/devices.toml");
  std::stringstream text;
  text << in.rdbuf();
  for (auto& [kind, d] : parse_device_catalog(text.str(), user_file)) catalog[kind] = std::move(d);
  return catalog;
}

DeviceKind catalog_kind(const std::string& kind, const std::string& user_file, const std::string& where) {
  const std::map<std::string, DeviceKind> catalog = device_catalog(user_file);
  const auto it = catalog.find(kind);
  if (it == catalog.end()) {
    throw UserError(where + ": no device kind \"" + kind + "\" in the catalog; kinds: " + kinds_of(catalog) +
                    " (add yours with --devices FILE, in the format of configs/devices.toml)");
  }
  return it->second;
}

ClusterOfKind parse_cluster(const std::string& text, const std::map<std::string, DeviceKind>& catalog) {
  const std::string argument = "--cluster " + text;
  const size_t colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  const auto it = catalog.find(kind);
  if (it == catalog.end()) {
    throw UserError(argument + ": no device kind \"" + kind + "\" in the catalog; kinds: " + kinds_of(catalog) +
                    " (add yours with --devices FILE, in the format of configs/devices.toml)");
  }
  ClusterOfKind c;
  c.device = it->second;
  c.devices_per_node = c.device.devices_per_node;
  if (colon == std::string::npos) {
    throw UserError(argument + ": say how many nodes, e.g. --cluster " + kind + ":8x" +
                    std::to_string(c.devices_per_node) + " (8 nodes of " + std::to_string(c.devices_per_node) + ")");
  }
  const std::string shape = text.substr(colon + 1);
  const size_t x = shape.find('x');
  c.nodes = whole_number(shape.substr(0, x), "the node count", argument);
  if (x == std::string::npos) {
    // One number could be nodes or devices (it was read as nodes without a word): both, always.
    const std::string n = std::to_string(c.nodes), per = std::to_string(c.devices_per_node);
    throw UserError(argument + ": give nodes and devices per node as NODESxDEVICES, e.g. --cluster " + kind + ":1x" + n +
                    " (one node of " + n + " devices) or --cluster " + kind + ":" + n + "x" + per + " (" + n +
                    " nodes of " + per + ", a " + kind + " node's usual count)");
  }
  c.devices_per_node = whole_number(shape.substr(x + 1), "the devices per node", argument);
  const int usual = c.device.devices_per_node;
  if (c.devices_per_node > usual) {
    // A node of more than the catalog's count exists (a rack-scale NVLink domain), so it is priced
    // as asked; but a user who meant nodes x devices should hear what was read.
    char gbps[32];
    std::snprintf(gbps, sizeof gbps, "%g", c.device.intra_node_gbps);
    const std::string per = std::to_string(c.devices_per_node);
    const int nodes_meant = c.nodes * ((c.devices_per_node + usual - 1) / usual);
    c.warning = argument + ": a " + kind + " node holds " + std::to_string(usual) +
                " devices (the device catalog's devices_per_node); priced as asked, " + per +
                " devices in one node linked at " + gbps + " GB/s each" +
                (c.devices_per_node % usual == 0
                     ? "; for nodes of " + std::to_string(usual) + " say --cluster " + kind + ":" +
                           std::to_string(nodes_meant) + "x" + std::to_string(usual)
                     : "") +
                " (or describe a larger node with --devices FILE)";
  }
  return c;
}

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// "NVIDIA A100-SXM4-80GB" -> {"nvidia", "a100", "sxm4", "80gb"}
std::set<std::string> words_of(const std::string& name) {
  std::set<std::string> out;
  std::string word;
  for (char c : lower(name) + " ") {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      word += c;
    } else if (!word.empty()) {
      out.insert(word);
      word.clear();
    }
  }
  return out;
}

}  // namespace

std::string catalog_kind_of_gpu(const std::map<std::string, DeviceKind>& catalog, const std::string& gpu_name,
                                int64_t memory_bytes) {
  const std::set<std::string> words = words_of(gpu_name);
  const bool pcie = words.count("pcie") > 0;
  std::string best;
  std::tuple<bool, int64_t> best_score{true, 0};  // (variant differs, memory's distance): least wins
  for (const auto& [kind, d] : catalog) {
    if (words.count(lower(kind.substr(0, kind.find('-')))) == 0) continue;
    const bool kind_pcie = lower(kind + " " + d.name).find("pcie") != std::string::npos;
    const std::tuple<bool, int64_t> score{kind_pcie != pcie, std::llabs(d.memory_bytes - memory_bytes)};
    if (best.empty() || score < best_score) {
      best = kind;
      best_score = score;
    }
  }
  return best;
}

DeviceKind measured_gpu_kind(int device, const std::string& name, int64_t memory_bytes) {
  {
    std::lock_guard<std::mutex> lock(measured_mutex());
    if (auto it = measured_kinds().find(measured_kind_key(name)); it != measured_kinds().end()) return it->second;
  }
  // The measurement is the first thing this process runs on the GPU through ATen: hybrid_train's
  // allocator goes in front first, so that a memory.budget decided after it can still be held
  // (alloc/cuda_arena.h); the blocks it used go back to the driver before free memory is read.
  if (cuda_budgets_built()) {
    try {
      install_cuda_allocator();
    } catch (const std::runtime_error&) {
      // ATen allocated on the GPU already: a budget will say so where it is installed.
    }
  }
  const MeasuredKind measured = measure_device_kind(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device)), name,
                                                    memory_bytes);
  const DeviceKind& k = measured.kind;
  std::printf("the device catalog has no kind for \"%s\": measured here as \"%s\": %.0f TFLOP/s bf16, %.0f fp32, "
              "%.0f GB/s (peaks through the H200's efficiency curves; describe it with --devices FILE to skip this)\n",
              name.c_str(), k.kind.c_str(), k.bf16_tflops, k.fp32_tflops, k.memory_gbps);
  for (const std::string& note : measured.notes) std::printf("  %s\n", note.c_str());
  release_cached_cuda_memory();
  add_measured_kind(k);
  return k;
}

ClusterOfKind local_gpu_cluster(const std::map<std::string, DeviceKind>& catalog, int64_t runtime_bytes) {
  const int gpus = cuda_device_count();
  if (gpus == 0) {
    throw UserError("plan with training.device = \"cuda\": this process sees no GPU (or this build's libtorch has "
                    "no CUDA); check CUDA_VISIBLE_DEVICES, plan for a catalog kind with --cluster KIND:1xN, or plan "
                    "with --training.device=cpu");
  }
  const std::string name = cuda_device_name(0);
  const int64_t total = cuda_device_memory_bytes(0);
  const std::string kind = catalog_kind_of_gpu(catalog, name, total);
  ClusterOfKind c;
  c.device = kind.empty() ? measured_gpu_kind(0, name, total) : catalog.at(kind);
  c.nodes = 1;
  c.devices_per_node = gpus;
  // What a job can take on it now: the driver's free memory (another process's share is not ours).
  const int64_t free = cuda_free_memory_bytes(0);
  if (free > 0) c.device.memory_bytes = std::min(c.device.memory_bytes, free + runtime_bytes);
  return c;
}

std::vector<ConfigOverride> cluster_overrides(const ClusterOfKind& cluster, const std::string& argument) {
  char intra[32], inter[32];
  std::snprintf(intra, sizeof intra, "%g", cluster.device.intra_node_gbps);
  std::snprintf(inter, sizeof inter, "%g", cluster.device.inter_node_gbps);
  std::vector<ConfigOverride> out;
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"cluster.device", "\"" + cluster.device.kind + "\""},
           {"cluster.nodes", std::to_string(cluster.nodes)},
           {"cluster.devices_per_node", std::to_string(cluster.devices_per_node)},
           {"cluster.device_memory", "\"" + std::to_string(cluster.device.memory_bytes) + "\""},
           {"cluster.intra_node_gbps", intra},
           {"cluster.inter_node_gbps", inter}}) {
    out.push_back({key, value, argument + " (" + key + " = " + value + ")"});
  }
  return out;
}

}  // namespace ht
