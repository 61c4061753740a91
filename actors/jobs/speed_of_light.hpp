#pragma once
// The speeds of light the benches compare against, measured in the same run
// on the same machine: memcpy for engines in the trainer's process, a raw
// UCX tag transfer (ucx_perftest tag_bw over the same transports) for
// engines in other processes, and MPI_Bcast (Open MPI) as the classic
// broadcast baseline. Each probe says why when it cannot measure.
#include "runtime/config/topology.hpp"

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace rlsync::jobs {

/// memcpy bandwidth into pre-touched memory, best of three copies of
/// `bytes`: the in-process data plane's speed of light.
double measure_memcpy_gbps(std::size_t bytes = std::size_t(64) << 20);

/// A measured bandwidth or duration, or why there is none.
struct probe_result {
  double value = 0; ///< 0: not measured
  std::string why;  ///< set when value is 0
};

/// UCX_TLS for `transports`, in their order ("shm" is UCX's "sm"); empty:
/// UCX decides.
std::string ucx_tls(const std::vector<ucx_transport>& transports);

/// The overall bandwidth in GB/s (10^9 bytes) of ucx_perftest's "Final:"
/// line (iterations, latency 50%, average, overall, bandwidth average,
/// overall in MB/s meaning MiB/s, message rates); nullopt without one.
std::optional<double> parse_ucx_perftest_gbps(const std::string& output);

/// The raw UCX bandwidth (GB/s) between two processes of this machine over
/// `transports` (empty: UCX decides): ucx_perftest tag_bw with messages of
/// `message_bytes` (clamped to 1..256 MiB), moving about `total_bytes`
/// (8 to 256 messages). Each ucx_perftest runs at most 60 s.
probe_result measure_ucx_gbps(const std::vector<ucx_transport>& transports, std::uint64_t message_bytes,
                              std::uint64_t total_bytes);
/// The same over UCX_TLS `tls` as UCX names transports ("sysv,cma": the
/// transports a data plane's connection log shows); empty: UCX decides.
probe_result measure_ucx_gbps(const std::string& tls, std::uint64_t message_bytes, std::uint64_t total_bytes);

/// UCX_TLS for the data transports a connection log named, sorted and
/// without duplicates; empty for none.
std::string ucx_tls_of(const std::set<std::string>& data_transports);

/// The median seconds of the "median_s" field of rlsync-mpi-bcast's JSON
/// line; nullopt without one.
std::optional<double> parse_mpi_bcast_median_s(const std::string& output);

/// MPI_Bcast's median seconds, run three times: with Open MPI's defaults,
/// with the shared-memory transport's single-copy mechanism off (vader's
/// CMA/XPMEM copy is not always the faster one), and with its buffers in
/// huge pages (as rlsync's shared buffers may be); the fastest counts.
/// Over tcp instead (the data plane's transports are tcp alone): once,
/// with Open MPI's tcp transport alone.
struct mpi_bcast_result {
  double defaults_s = 0;       ///< 0: not measured
  double no_single_copy_s = 0; ///< --mca btl_vader_single_copy_mechanism none; 0: not measured
  double huge_pages_s = 0;     ///< defaults, buffers in transparent huge pages; 0: not measured
  double tcp_s = 0;            ///< --mca pml ob1 --mca btl tcp,self on loopback; 0: not measured
  std::string why;             ///< set when none was measured

  /// The fastest measured; 0 when none was.
  double best_s() const {
    double best = 0;
    for (double s : {defaults_s, no_single_copy_s, huge_pages_s, tcp_s})
      if (s > 0 && (best == 0 || s < best))
        best = s;
    return best;
  }
};

/// Why the MPI_Bcast baseline cannot run here (mpirun or rlsync-mpi-bcast
/// beside `exe` missing) and how to get it; empty when it can.
std::string mpi_bcast_missing(const std::string& exe);

/// MPI_Bcast of `bytes` from one rank to `receivers`, `iterations` times
/// (tools/mpi_bcast_bench.cpp, built as rlsync-mpi-bcast beside `exe` when
/// MPI is found), in three configurations: defaults, vader's single copy
/// off, buffers in huge pages; `over_tcp`: once, over Open MPI's tcp
/// transport on loopback (a data plane kept off shared memory is compared
/// with an MPI kept off it too). Each run takes at most 300 s.
mpi_bcast_result measure_mpi_bcast(const std::string& exe, std::uint64_t bytes, std::size_t receivers,
                                   std::uint64_t iterations, bool over_tcp = false);

} // namespace rlsync::jobs
