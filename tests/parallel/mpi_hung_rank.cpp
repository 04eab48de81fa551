// A rank that stops answering inside a sharded collective, for ctest (tests/CMakeLists.txt):
// under mpirun with 2 ranks, rank 1 stops itself (SIGSTOP: neither dead nor progressing, which
// mpirun cannot see) or dies (exits 3) before the collective named by the argument
// ("all-gather" or "reduce-scatter"); rank 0 enters it with a 2 s timeout in "step 7". The job
// must end: with a stopped rank, by rank 0's watchdog naming its rank, the step and the
// collective (ctest matches that line); with a dead one, by mpirun, non-zero.
#include "parallel/process_grid.h"

#include <ATen/ATen.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "all-gather") != 0 && std::strcmp(argv[1], "reduce-scatter") != 0) ||
      (std::strcmp(argv[2], "stops") != 0 && std::strcmp(argv[2], "dies") != 0)) {
    std::fprintf(stderr, "usage: mpi_hung_rank all-gather|reduce-scatter stops|dies\n");
    return 2;
  }
  ht::ProcessGrid grid = ht::make_process_grid();
  ht::Communicator& c = *grid.data_parallel_group;
  if (c.size() != 2) {
    std::fprintf(stderr, "mpi_hung_rank: run it with 2 ranks, not %d\n", c.size());
    return 2;
  }
  c.set_timeout(2);
  c.set_context("step 7");
  c.barrier("the start");
  if (c.rank() == 1) {
    if (std::strcmp(argv[2], "dies") == 0) std::_Exit(3);
    std::raise(SIGSTOP);  // mpirun ends it when rank 0 exits (continuing it first, to end it)
    std::_Exit(0);
  }
  const std::vector<int64_t> counts{5, 4};  // uneven: the padded path
  at::Tensor full = at::ones({9}), shard = at::zeros({counts[static_cast<size_t>(c.rank())]});
  if (std::strcmp(argv[1], "all-gather") == 0) {
    c.all_gather(shard, full, counts, "the parameters");
  } else {
    c.reduce_scatter_sum(full, shard, counts, "the gradients");
  }
  std::fprintf(stderr, "mpi_hung_rank: the %s completed without rank 1\n", argv[1]);
  ht::finalize_process_grid();
  return 0;  // the collective must not complete without rank 1: ctest fails on a missing line
}
