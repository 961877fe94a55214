#include "sim/run/mpi_world.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <stdexcept>

#ifdef KVSIM_WITH_MPI
#include <mpi.h>
#endif

namespace kvsim {

namespace {

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

}  // namespace

World::World() {
#ifdef KVSIM_WITH_MPI
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized || !launched_by_mpi()) return;
  MPI_Init(nullptr, nullptr);
  joined_ = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm node;  // the ranks that share this node's memory, hence its GPUs
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank_);
  MPI_Comm_free(&node);
#endif
}

World::~World() {
#ifdef KVSIM_WITH_MPI
  if (joined_) MPI_Finalize();
#endif
}

void World::settle(const std::exception_ptr& mine, const std::string& what_is_kept) const {
  int first_failed = mine ? rank_ : size_;
#ifdef KVSIM_WITH_MPI
  if (joined_) {
    const int local = first_failed;
    MPI_Allreduce(&local, &first_failed, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  }
#endif
  const std::string of_size = " of " + std::to_string(size_);
  if (mine && !distributed()) std::rethrow_exception(mine);
  if (first_failed == size_) return;
  std::string message = "rank " + std::to_string(first_failed) + of_size +
                        " failed (its own message says why); " + what_is_kept;
  if (mine) {
    try {
      std::rethrow_exception(mine);
    } catch (const std::exception& e) {
      message = "rank " + std::to_string(rank_) + of_size + ": " + e.what();
    }
  }
  std::fprintf(stderr, "kvsim: error: %s\n", message.c_str());
  std::fflush(stderr);
#ifdef KVSIM_WITH_MPI
  if (joined_) MPI_Barrier(MPI_COMM_WORLD);  // every rank has printed before any exits
#endif
  throw ReportedError(message);
}

void World::abort() const {
#ifdef KVSIM_WITH_MPI
  if (joined_) MPI_Abort(MPI_COMM_WORLD, 1);
#endif
  std::exit(1);
}

std::vector<int> split_by_cost(const std::vector<double>& costs, int ranks) {
  if (ranks < 1) throw std::invalid_argument("split_by_cost: ranks must be positive");
  std::vector<std::size_t> order(costs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return costs[a] > costs[b]; });
  std::vector<double> load(ranks, 0.0);
  std::vector<int> owner(costs.size(), 0);
  for (std::size_t i : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = r;
    load[r] += costs[i];
  }
  return owner;
}

}  // namespace kvsim
