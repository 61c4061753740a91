#pragma once
// Transport lists a topology may name, with what each means for the ucx
// data plane: whether groups may be lent in shared memory
// (ucx_lends_shared_memory) and whether bench sync's MPI_Bcast baseline
// runs over tcp (mpi_over_tcp: only where the engines' bytes surely do). One table, so that the two rules are read
// side by side.
#include "runtime/config/topology.hpp"

#include <vector>

namespace rlsync::test {

struct ucx_transport_case {
  const char* name;
  transfer_backend backend;
  std::vector<ucx_transport> transports;
  bool lends_shared_memory;
  bool mpi_over_tcp;

  transfer_spec spec() const {
    transfer_spec t;
    t.backend = backend;
    t.ucx_transports = transports;
    return t;
  }
};

inline std::vector<ucx_transport_case> ucx_transport_cases() {
  using u = ucx_transport;
  const auto ucx = transfer_backend::ucx;
  return {
      {"UCX decides", ucx, {}, true, false},
      {"shm, cma and tcp", ucx, {u::shm, u::cma, u::tcp}, true, false},
      {"shm alone", ucx, {u::shm}, true, false},
      {"tcp alone: the path between hosts, on one", ucx, {u::tcp}, false, true},
      // cma copies between processes of one host: nothing lent, and MPI keeps its single copy
      {"cma and tcp", ucx, {u::cma, u::tcp}, false, false},
      // UCX may take rdma on one host too: MPI keeps its shared-memory runs
      {"rdma and tcp", ucx, {u::rdma, u::tcp}, false, false},
      {"rdma alone", ucx, {u::rdma}, false, false},
      {"rdma, shm and cma: a cluster's list that still lends on one host", ucx, {u::rdma, u::shm, u::cma}, true, false},
      {"another backend", transfer_backend::local, {u::tcp}, false, false},
  };
}

} // namespace rlsync::test
