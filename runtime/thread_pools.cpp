#include "runtime/thread_pools.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

namespace ht {
namespace {

using SetThreads = void (*)(int);
using GetThreads = int (*)();

// OpenBLAS's own entry points, if the BLAS that libtorch loaded is OpenBLAS.
template <typename Fn>
Fn openblas_symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace

std::string ThreadPools::describe() const {
  std::string s = std::to_string(intra_op) + " (ATen and oneDNN " + std::to_string(intra_op);
  s += ", inter-op " + std::to_string(inter_op);
  s += blas >= 0 ? ", OpenBLAS " + std::to_string(blas) : ", BLAS not OpenBLAS: its own threads";
  return s + ")";
}

int cpus_from_cgroup_quota(const std::string& cpu_max) {
  std::istringstream in(cpu_max);
  std::string quota;
  long long period = 0;
  if (!(in >> quota >> period) || quota == "max" || period <= 0) return 0;
  char* end = nullptr;
  const long long q = std::strtoll(quota.c_str(), &end, 10);
  if (end == quota.c_str() || *end != '\0' || q <= 0) return 0;
  return static_cast<int>((q + period - 1) / period);
}

namespace {

// The CPUs this process may run on (its affinity mask), or the hardware's when unknown.
int cpus_bound_to(int hardware) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return hardware;
  return std::max(1, CPU_COUNT(&set));
}

std::string first_line(const std::string& file) {
  std::ifstream in(file);
  std::string text;
  return in && std::getline(in, text) ? text : std::string();
}

// The CPU quota of this process's cgroup, 0 for none. cgroup v2: cpu.max in the path that
// /proc/self/cgroup gives ("0::/kubepods/..."; "0::/" in a container's own cgroup namespace).
// cgroup v1: cpu.cfs_quota_us and cpu.cfs_period_us of the cpu controller's path (-1: none).
int cgroup_cpu_quota() {
  std::string v2, v1;
  std::ifstream self("/proc/self/cgroup");
  for (std::string line; std::getline(self, line);) {
    if (line.rfind("0::", 0) == 0) v2 = line.substr(3);
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",";
    if (controllers.find(",cpu,") != std::string::npos) v1 = line.substr(b + 1);
  }
  for (const std::string& dir : {"/sys/fs/cgroup" + v2, std::string("/sys/fs/cgroup")}) {
    const std::string text = first_line(dir + "/cpu.max");
    if (!text.empty()) return cpus_from_cgroup_quota(text);
  }
  for (const std::string& dir : {"/sys/fs/cgroup/cpu" + v1, "/sys/fs/cgroup/cpu,cpuacct" + v1, std::string("/sys/fs/cgroup/cpu")}) {
    const std::string quota = first_line(dir + "/cpu.cfs_quota_us");
    if (!quota.empty()) return cpus_from_cgroup_quota(quota + " " + first_line(dir + "/cpu.cfs_period_us"));
  }
  return 0;
}

}  // namespace

int default_thread_count(int ranks_on_this_host) {
  const int ranks = std::max(1, ranks_on_this_host);
  const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int threads = std::min(hardware / ranks, cpus_bound_to(hardware));
  if (const int quota = cgroup_cpu_quota(); quota > 0) threads = std::min(threads, quota / ranks);
  return std::max(1, threads);
}

int host_cpus_of_ranks(int ranks_on_this_host) {
  const int ranks = std::max(1, ranks_on_this_host);
  const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int cpus = std::min(hardware, cpus_bound_to(hardware) * ranks);
  if (const int quota = cgroup_cpu_quota(); quota > 0) cpus = std::min(cpus, quota);
  return std::max(1, cpus);
}

void restart_with_passive_openmp(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  // The program's own path, not /proc/self/exe: the process keeps its name (ps, /proc/PID/comm).
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return;  // no /proc: run on with OpenMP's default policy
  path[n] = '\0';
  setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/0);
  execv(path, argv);
  // Only returns on failure: run on with OpenMP's default policy.
}

ThreadPools set_compute_threads(int threads) {
  TORCH_CHECK(threads >= 1, "set_compute_threads: ", threads, " threads");
  ThreadPools pools;
  at::set_num_threads(threads);
  pools.intra_op = at::get_num_threads();
  // The inter-op pool can be sized once per process, before it starts; a second job in the same
  // process (tests) finds it sized and leaves it.
  static const bool inter_op_sized = [threads] {
    try {
      at::set_num_interop_threads(threads);
    } catch (const c10::Error&) {
    }
    return true;
  }();
  (void)inter_op_sized;
  pools.inter_op = at::get_num_interop_threads();
  const auto set_blas = openblas_symbol<SetThreads>("openblas_set_num_threads");
  const auto get_blas = openblas_symbol<GetThreads>("openblas_get_num_threads");
  pools.blas = -1;
  if (set_blas != nullptr && get_blas != nullptr) {
    set_blas(threads);
    pools.blas = get_blas();
  }
  return pools;
}

}  // namespace ht
