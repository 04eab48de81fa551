#pragma once
// One setting for every pool of compute threads a rank uses. at::set_num_threads governs ATen's
// intra-op pool (OpenMP in Debian's libtorch) and, through OpenMP, oneDNN's; it does not govern
// OpenBLAS, which keeps a pool of its own, sized at load time to every core. On a 2-core machine
// with `threads = 1` that pool's second thread spins in sched_yield between BLAS calls, and two
// ranks on two cores each bring one: four busy threads on two cores. Here the same count goes
// to all of them (OpenBLAS through openblas_set_num_threads, found at run time, so a build
// against another BLAS still links), and to ATen's inter-op pool, which can be set only once.

#include <string>

namespace ht {

struct ThreadPools {
  int intra_op = 0;   // ATen's at::get_num_threads() after the change
  int inter_op = 0;   // ATen's inter-op pool (sized once per process: the first job's count)
  int blas = 0;       // OpenBLAS's threads; -1: the BLAS library is not OpenBLAS
  std::string describe() const;  // for the plan line: "1 (ATen 1, inter-op 1, OpenBLAS 1)"
};

// Threads a rank should use when the config says 0: the CPUs it may use, at least 1. That is the
// least of the host's hardware threads shared among its ranks, the CPUs this process is bound to
// (mpirun's --bind-to, Slurm's task affinity, a container's cpuset) and a container's CPU quota
// shared among the ranks (Kubernetes' cpu limit, docker --cpus: cgroup v2's cpu.max, or v1's
// cpu.cfs_quota_us). Without the last two, a rank in a 16-CPU pod on a 128-core node ran 128
// threads, throttled.
int default_thread_count(int ranks_on_this_host);
// The CPUs the job's `ranks_on_this_host` ranks may use together: the host's, fewer under a
// container's quota, and where this process is bound to fewer, its binding times the ranks
// (mpirun and Slurm bind each rank to cores of its own). What a rank's planner takes for the
// host: its own binding alone (one core of two) priced its two ranks as sharing one core, at
// twice the step.
int host_cpus_of_ranks(int ranks_on_this_host);

// The CPUs that a quota and period allow (cgroup v2's cpu.max text, "150000 100000": 2, rounded
// up); 0 for no quota ("max 100000", v1's "-1 100000") or a text that is not one.
int cpus_from_cgroup_quota(const std::string& cpu_max);

// OpenMP's workers (ATen's and oneDNN's pool) spin after each parallel region by default, taking
// the cores OpenBLAS's threads need next: a 2-thread GPT step measured 2x slower than a 1-thread
// one. libgomp reads its wait policy once, from OMP_WAIT_POLICY, when it is loaded, before main.
// So a program that wants PASSIVE must set it and start again: when OMP_WAIT_POLICY is unset,
// this sets it to PASSIVE and re-executes the program with the same arguments (same process id,
// so mpirun and srun see nothing). A user's own OMP_WAIT_POLICY is kept. Call first in main().
void restart_with_passive_openmp(char** argv);

// Sets every pool to `threads` (>= 1) and reports what each now has.
ThreadPools set_compute_threads(int threads);

}  // namespace ht
