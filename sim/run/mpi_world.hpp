// The processes that run one kvsim command: this process alone, or, when it was started by an MPI
// launcher (`mpirun -n N kvsim ...`) and kvsim was built with MPI, the N ranks of the job. The
// commands that distribute work (sweep, live capture, live evaluate) hold one World for their
// lifetime; everything else in kvsim never sees MPI.
#pragma once

#include <cstddef>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvsim {

// An error every rank has already printed (World::settle): the caller exits non-zero quietly.
struct ReportedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class World {
 public:
  // Joins the MPI job when launched by mpirun/PMI (MPI_Init costs ~0.4 s as a singleton, so a
  // plain start never calls it); a world of one process otherwise.
  World();
  ~World();  // MPI_Finalize, when joined
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // This rank's index among the ranks on its node (which GPU it takes).
  int local_rank() const { return local_rank_; }
  bool distributed() const { return size_ > 1; }

  // Collective: every rank passes what its own share of the work threw (null when it finished).
  // Rethrows this rank's error; when only another rank failed, throws an error naming the lowest
  // failing rank, so that every rank leaves with a non-zero status and none waits for the others.
  // Distributed, each rank prints its message and waits for the others to have printed theirs
  // before throwing ReportedError (mpirun ends the whole job as soon as one rank exits non-zero,
  // so a rank that printed after another had exited could be cut off).
  void settle(const std::exception_ptr& mine, const std::string& what_is_kept) const;

  // Ends every rank at once (an error outside a collective, where settle cannot be reached).
  [[noreturn]] void abort() const;

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  bool joined_ = false;
};

// A fixed split of `costs.size()` work items over `ranks`: the largest first, each to the rank with
// the least work so far (lowest rank on ties). Returns each item's rank. The same inputs give the
// same split on every rank, so no messages are needed to agree on it.
std::vector<int> split_by_cost(const std::vector<double>& costs, int ranks);

}  // namespace kvsim
