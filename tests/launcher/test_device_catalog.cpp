// The device catalog (configs/devices.toml, built in; a user's file over it) and
// `hybrid_train plan --cluster KIND:NODESxDEVICES`.
#include "launcher/planning/device_catalog.h"
#include "base/user_error.h"
#include "tests/support/run_binary.h"
#include "tests/support/temp_dir.h"

#include <gmock/gmock.h>

#include <filesystem>
#include <fstream>
#include <tuple>
#include <vector>

namespace ht::test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const char* kMine = R"([h100-sxm]
name = "an H100 as our cloud rents it"
memory = "80GB"
memory_gbps = 3350
bf16_tflops = 989
fp16_tflops = 989
fp32_tflops = 67
intra_node_gbps = 450
inter_node_gbps = 25
devices_per_node = 8
source = "our provider's page"

[mi300x]
name = "AMD Instinct MI300X"
memory = "192GB"
memory_gbps = 5300
bf16_tflops = 1307.4
fp16_tflops = 1307.4
fp32_tflops = 163.4
intra_node_gbps = 448
inter_node_gbps = 50
devices_per_node = 8
source = "AMD Instinct MI300X data sheet"
)";

TEST(DeviceCatalog, TheBuiltInKindsHaveEveryFigureWithItsSource) {
  const auto catalog = device_catalog();
  for (const char* kind : {"h100-sxm", "h100-pcie", "h200", "a100-80gb", "a100-40gb", "l40s", "b200"}) {
    SCOPED_TRACE(kind);
    ASSERT_EQ(catalog.count(kind), 1u);
    const DeviceKind& d = catalog.at(kind);
    EXPECT_FALSE(d.source.empty());
    EXPECT_GT(d.memory_bytes, 0);
    EXPECT_GE(d.bf16_tflops, d.fp32_tflops) << "tensor cores' bf16 is never below plain fp32";
    EXPECT_GT(d.intra_node_gbps, d.inter_node_gbps) << "within a node faster than between nodes";
  }
  EXPECT_EQ(catalog.at("h100-sxm").memory_bytes, 80000000000);
  EXPECT_EQ(catalog.at("h100-sxm").bf16_tflops, 989);
  EXPECT_EQ(catalog.at("h200").memory_bytes, 141000000000);
}

TEST(DeviceCatalog, AUsersFileAddsKindsAndReplacesThem) {
  TempDir dir;
  const auto catalog = device_catalog(dir.write("mine.toml", kMine));
  EXPECT_EQ(catalog.at("mi300x").memory_bytes, 192000000000);
  EXPECT_EQ(catalog.at("h100-sxm").inter_node_gbps, 25) << "replaced";
  EXPECT_EQ(catalog.at("a100-80gb").bf16_tflops, 312) << "the built-in ones stay";
}

TEST(DeviceCatalog, AMalformedEntryNamesTheFileTheKindAndTheKey) {
  struct Case {
    std::string from, to, message;
  };
  for (const Case& c : std::vector<Case>{
           {"memory_gbps = 5300", "memory_gbps = -1", "[mi300x]: memory_gbps is missing or not a positive number"},
           {"fp32_tflops = 163.4\n", "", "[mi300x]: fp32_tflops is missing"},
           {"memory = \"192GB\"", "memory = \"lots\"", "memory = \"lots\" is not a memory size"},
           {"devices_per_node = 8\nsource = \"AMD", "devices_per_node = 8\nnvlink = 1\nsource = \"AMD", "unknown key nvlink"},
           {"devices_per_node = 8\nsource = \"AMD", "devices_per_node = 7.5\nsource = \"AMD", "devices_per_node must be a whole number"}}) {
    SCOPED_TRACE(c.message);
    std::string text = kMine;
    text.replace(text.rfind(c.from), c.from.size(), c.to);
    TempDir dir;
    const std::string path = dir.write("mine.toml", text);
    EXPECT_THAT(user_error_of([&] { device_catalog(path); }), HasSubstr(path + ": " + (c.message[0] == '[' ? "" : "[mi300x]: ") + c.message));
  }
  EXPECT_THAT(user_error_of([] { device_catalog("/nowhere.toml"); }), HasSubstr("--devices /nowhere.toml: cannot read it"));
}

TEST(DeviceCatalog, AClusterIsAKindAndItsNodes) {
  const auto catalog = device_catalog();
  ClusterOfKind c = parse_cluster("h100-sxm:8x8", catalog);
  EXPECT_EQ(c.device.kind, "h100-sxm");
  EXPECT_EQ(c.nodes, 8);
  EXPECT_EQ(c.devices_per_node, 8);
  // One number could be nodes or devices (issue 64: "h100-sxm:8" was read as 64 GPUs without a
  // word): refused, with both readings written out.
  EXPECT_THAT(user_error_of([&] { parse_cluster("l40s:2", catalog); }),
              HasSubstr("--cluster l40s:2: give nodes and devices per node as NODESxDEVICES, e.g. --cluster l40s:1x2 "
                        "(one node of 2 devices) or --cluster l40s:2x8 (2 nodes of 8, a l40s node's usual count)"));
  const std::vector<ConfigOverride> keys = cluster_overrides(parse_cluster("h200:4x8", catalog), "--cluster h200:4x8");
  ASSERT_EQ(keys.size(), 6u);
  EXPECT_EQ(keys[0].path, "cluster.device");
  EXPECT_EQ(keys[0].value, "\"h200\"");
  EXPECT_EQ(keys[3].path, "cluster.device_memory");
  EXPECT_EQ(keys[3].value, "\"141000000000\"");
  EXPECT_THAT(user_error_of([&] { parse_cluster("h100:2", catalog); }),
              HasSubstr("no device kind \"h100\" in the catalog; kinds: a100-40gb, a100-80gb, b200, h100-pcie, h100-sxm"));
  EXPECT_THAT(user_error_of([&] { parse_cluster("h100-sxm", catalog); }), HasSubstr("say how many nodes, e.g. --cluster h100-sxm:8x8"));
  EXPECT_THAT(user_error_of([&] { parse_cluster("h100-sxm:2x0", catalog); }), HasSubstr("the devices per node \"0\""));
  EXPECT_EQ(parse_cluster("h100-sxm:2x8", catalog).warning, "") << "the catalog's own shape needs no word";
  EXPECT_EQ(parse_cluster("h100-sxm:1x4", catalog).warning, "") << "part of a node needs none either";
}

// More devices in a node than the catalog's kind holds (issue 64: h100-sxm:1x16 was priced as
// NVLink across 16 without a word): read as asked, with a warning that says what it was priced as
// and the shape likely meant; the plan command prints it.
TEST(DeviceCatalog, ANodeLargerThanTheCatalogsIsReadAsAskedWithAWarning) {
  const auto catalog = device_catalog();
  const ClusterOfKind c = parse_cluster("h100-sxm:1x16", catalog);
  EXPECT_EQ(c.nodes, 1);
  EXPECT_EQ(c.devices_per_node, 16);
  EXPECT_EQ(c.warning, "--cluster h100-sxm:1x16: a h100-sxm node holds 8 devices (the device catalog's devices_per_node); "
                       "priced as asked, 16 devices in one node linked at 450 GB/s each; for nodes of 8 say --cluster "
                       "h100-sxm:2x8 (or describe a larger node with --devices FILE)");
  EXPECT_THAT(parse_cluster("h100-sxm:3x12", catalog).warning, Not(HasSubstr("say --cluster"))) << "12 is no multiple of 8";
  TempDir dir;
  const ProcessResult r = run_binary("plan " + std::string(HT_SOURCE_DIR) + "/configs/quickstart.toml --job.output_dir=" +
                                     dir.path("plan") + " --cluster h100-sxm:1x16 --ranks 1 --precisions off");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("hybrid_train: warning: --cluster h100-sxm:1x16: a h100-sxm node holds 8 devices"));
}

// `plan --cluster` plans for that cluster's devices (their memory, its links); a bad kind is
// refused with exit 2, listing the kinds.
// `plan` with training.device = "cuda" plans for the local GPU as a kind of the catalog: the names
// drivers give (nvidia-smi's), each to its kind; a card the catalog does not describe to none.
TEST(DeviceCatalog, ALocalGpuIsTheKindItsDriverNameAndMemorySay) {
  const auto catalog = device_catalog();
  const int64_t gb = 1000LL * 1000 * 1000;
  for (const auto& [name, memory, kind] : std::vector<std::tuple<std::string, int64_t, std::string>>{
           {"NVIDIA H200", 150 * gb, "h200"},
           {"NVIDIA H100 80GB HBM3", 85 * gb, "h100-sxm"},
           {"NVIDIA H100 PCIe", 85 * gb, "h100-pcie"},
           {"NVIDIA A100-SXM4-80GB", 85 * gb, "a100-80gb"},
           {"NVIDIA A100-SXM4-40GB", 42 * gb, "a100-40gb"},
           {"NVIDIA A100-PCIE-40GB", 42 * gb, "a100-40gb"},
           {"NVIDIA L40S", 48 * gb, "l40s"},
           {"NVIDIA B200", 190 * gb, "b200"},
           {"NVIDIA GeForce RTX 4090", 25 * gb, ""},
           {"Tesla V100-SXM2-16GB", 17 * gb, ""}}) {
    EXPECT_EQ(catalog_kind_of_gpu(catalog, name, memory), kind) << name;
  }
}

// Without a GPU (this build, or none visible) `plan` on "cuda" is refused before anything is
// written, naming what would work.
TEST(DeviceCatalog, PlanOnCudaWithoutAGpuSaysWhatWouldWork) {
  TempDir dir;
  const ProcessResult r = run_binary("plan " + std::string(HT_SOURCE_DIR) + "/configs/quickstart.toml --training.device=cuda --job.output_dir=" +
                                     dir.path("out"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir.path("out")));
}

TEST(DeviceCatalog, PlanForAClusterOfAKind) {
  TempDir dir;
  const std::string config = std::string(HT_SOURCE_DIR) + "/configs/quickstart.toml --job.output_dir=" + dir.path("plan");
  const ProcessResult r = run_binary("plan " + config + " --cluster h200:2x4 --ranks 1,8 --precisions off");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("2 node(s) x 4 devices of 131.3 GiB (the runtime holds 1.00 GiB, and 700.0 MiB a "
                                  "communicator), 450 GB/s within a node, 50 GB/s between"));
  const ProcessResult bad = run_binary("plan " + config + " --cluster tpu-v5:2");
  EXPECT_EQ(bad.status, 2);
  EXPECT_THAT(bad.output, HasSubstr("--cluster tpu-v5:2: no device kind \"tpu-v5\""));
  const ProcessResult shorthand = run_binary("plan " + std::string(HT_SOURCE_DIR) + "/configs/quickstart.toml --job.output_dir=" +
                                             dir.path("shorthand") + " --cluster h100-sxm:8");
  EXPECT_EQ(shorthand.status, 2);
  EXPECT_THAT(shorthand.output, HasSubstr("--cluster h100-sxm:8: give nodes and devices per node as NODESxDEVICES"));
  EXPECT_FALSE(std::filesystem::exists(dir.path("shorthand"))) << "nothing written";
  // What the runtime holds beside the tensors: a negative size is refused, naming the key.
  const ProcessResult negative = run_binary("plan " + config + " --cluster h200:1x2 --cluster.communicator_mib=-5");
  EXPECT_EQ(negative.status, 2);
  EXPECT_THAT(negative.output, HasSubstr("cluster.communicator_mib: -5.0 is out of range: must be >= 0.0"));
}

}  // namespace
}  // namespace ht::test
