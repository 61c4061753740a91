// rlsync-mpi-bcast: the classic broadcast baseline rlsync bench sync compares with.
//
// Every figure rlsync reports sits next to a baseline; for weight sync the classic one is
// a plain MPI_Bcast of the whole weights from the trainer (rank 0) to every engine.
// `rlsync bench sync` runs this program as a subprocess, when it was built (MPI is
// optional), and sets its JSON line beside rlsync's own transfer:
//
//   mpirun --allow-run-as-root --oversubscribe -np R rlsync-mpi-bcast --bytes N --iterations K [--warmup W]
//          [--huge-pages]
//
// Every rank allocates and pre-touches N bytes, rank 0 filled with a pattern
// (--huge-pages: 2 MiB aligned and advised MADV_HUGEPAGE, the transparent
// huge pages the kernel gives in its `madvise` mode, so that the baseline
// has the page size rlsync's shared buffers get from the hugetlb pool). After W
// warm-up broadcasts, K broadcasts are timed on rank 0 from just before MPI_Bcast to just
// after a following MPI_Barrier (so every rank has its copy). Every broadcast, warm-up
// included, is verified on every receiver against rank 0's checksum, and the receive
// buffer is cleared before the next one; a mismatch aborts the job. N > INT_MAX is sent in
// chunks of at most 1 GiB (MPI counts are int). Rank 0 prints one JSON line on stdout.
// Exit status: 0 ok, 1 failure (MPI_Abort), 2 bad usage.

#define OMPI_SKIP_MPICXX 1   // the C API is all we use; skip the deprecated C++ bindings
#define MPICH_SKIP_MPICXX 1
#include "runtime/base/stats.hpp"

#include <mpi.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <sys/mman.h>

namespace {

constexpr const char* usage =
    "usage: mpirun [--allow-run-as-root] [--oversubscribe] -np R rlsync-mpi-bcast "
    "--bytes N --iterations K [--warmup W] [--huge-pages]\n"
    "  --bytes N       bytes broadcast from rank 0 to every other rank (N >= 1)\n"
    "  --iterations K  timed broadcasts (K >= 1)\n"
    "  --warmup W      untimed broadcasts first (default 1)\n"
    "  --huge-pages    buffers in transparent huge pages (2 MiB aligned, MADV_HUGEPAGE)\n"
    "prints one JSON line on rank 0: bytes, ranks, iterations, median_s, min_s, gbps\n"
    "(N*(R-1)/median_s/1e9), gbps_per_receiver (N/median_s/1e9)\n";

constexpr std::size_t max_chunk = std::size_t{1} << 30;  // 1 GiB, fits an int count

struct options {
  std::uint64_t bytes = 0, iterations = 0, warmup = 1;
  bool have_bytes = false, have_iterations = false, help = false, huge_pages = false;
};

// Parses argv into o; returns an empty string or an error message naming the flag.
std::string parse(int argc, char** argv, options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      o.help = true;
      return {};
    }
    if (flag == "--huge-pages") {
      o.huge_pages = true;
      continue;
    }
    std::uint64_t* target = nullptr;
    std::uint64_t min = 0;
    if (flag == "--bytes") {
      target = &o.bytes, min = 1, o.have_bytes = true;
    } else if (flag == "--iterations") {
      target = &o.iterations, min = 1, o.have_iterations = true;
    } else if (flag == "--warmup") {
      target = &o.warmup, min = 0;
    } else {
      return "unknown flag '" + flag + "'";
    }
    if (i + 1 >= argc) return flag + " needs a value";
    const char* s = argv[++i];
    char* end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(s, &end, 10);
    if (*s < '0' || *s > '9' || *end != '\0' || errno == ERANGE)
      return flag + ": '" + s + "' is not a non-negative integer";
    if (v < min) return flag + " must be at least " + std::to_string(min) + " (got " + s + ")";
    *target = v;
  }
  if (!o.have_bytes) return "missing --bytes N";
  if (!o.have_iterations) return "missing --iterations K";
  return {};
}

// The pattern: 64-bit words of a multiplicative sequence, so misplaced chunks show.
void fill_pattern(unsigned char* p, std::size_t n) {
  std::size_t words = n / 8;
  for (std::size_t i = 0; i < words; ++i) {
    std::uint64_t w = (i + 1) * 0x9E3779B97F4A7C15ull;
    std::memcpy(p + i * 8, &w, 8);
  }
  std::uint64_t w = (words + 1) * 0x9E3779B97F4A7C15ull;
  std::memcpy(p + words * 8, &w, n % 8);
}

// Fletcher-style checksum over 64-bit words: position-dependent and fast.
std::uint64_t checksum(const unsigned char* p, std::size_t n) {
  std::uint64_t a = 0, b = 0;
  std::size_t words = n / 8;
  for (std::size_t i = 0; i < words; ++i) {
    std::uint64_t w;
    std::memcpy(&w, p + i * 8, 8);
    a += w;
    b += a;
  }
  std::uint64_t tail = 0;
  std::memcpy(&tail, p + words * 8, n % 8);
  a += tail;
  b += a;
  return a ^ (b * 0xff51afd7ed558ccdull) ^ n;
}

void bcast(unsigned char* p, std::size_t n) {
  for (std::size_t off = 0; off < n; off += max_chunk) {
    int count = static_cast<int>(std::min(max_chunk, n - off));
    MPI_Bcast(p + off, count, MPI_BYTE, 0, MPI_COMM_WORLD);
  }
}

// Kilobytes of this process's memory in transparent huge pages (smaps_rollup's
// AnonHugePages); 0 when none or unknown.
std::uint64_t anon_huge_kb() {
  std::ifstream f("/proc/self/smaps_rollup");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("AnonHugePages:", 0) == 0)
      return std::strtoull(line.c_str() + 14, nullptr, 10);
  return 0;
}

[[noreturn]] void fail(int rank, const std::string& what) {
  std::fprintf(stderr, "rlsync-mpi-bcast: rank %d: %s\n", rank, what.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);

  // Every rank parses the same argv and reaches the same verdict; rank 0 speaks.
  options o;
  std::string err = parse(argc, argv, o);
  if (err.empty() && !o.help && ranks < 2)
    err = "needs at least 2 ranks (mpirun -np R, R >= 2), got " + std::to_string(ranks);
  if (o.help || !err.empty()) {
    if (rank == 0) {
      if (!err.empty()) std::fprintf(stderr, "rlsync-mpi-bcast: %s\n", err.c_str());
      std::fputs(usage, err.empty() ? stdout : stderr);
    }
    MPI_Finalize();
    return err.empty() ? 0 : 2;
  }

  const std::size_t n = o.bytes;
  std::unique_ptr<unsigned char, void (*)(unsigned char*)> buf(nullptr, [](unsigned char* p) { std::free(p); });
  {
    constexpr std::size_t huge = std::size_t{2} << 20;
    const std::size_t align = o.huge_pages ? huge : 64;
    void* p = nullptr;
    if (n > SIZE_MAX - huge || posix_memalign(&p, align, (n + align - 1) / align * align) != 0)
      fail(rank, "cannot allocate " + std::to_string(n) + " bytes");
    if (o.huge_pages)
      madvise(p, (n + align - 1) / align * align, MADV_HUGEPAGE); // advisory: the kernel may say no
    buf.reset(static_cast<unsigned char*>(p));
  }
  // Pre-touch: the pattern on rank 0, zeros elsewhere, so no page faults are timed.
  if (rank == 0)
    fill_pattern(buf.get(), n);
  else
    std::memset(buf.get(), 0, n);

  // A baseline that says huge pages must have them: the advice is only advice.
  if (o.huge_pages && rank == 0 && anon_huge_kb() == 0)
    fail(rank, "--huge-pages: the kernel gave the buffer no transparent huge pages "
               "(/sys/kernel/mm/transparent_hugepage/enabled must be always or madvise)");

  std::uint64_t expected = rank == 0 ? checksum(buf.get(), n) : 0;
  MPI_Bcast(&expected, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);

  std::vector<double> times;
  for (std::uint64_t it = 0; it < o.warmup + o.iterations; ++it) {
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = std::chrono::steady_clock::now();
    bcast(buf.get(), n);
    MPI_Barrier(MPI_COMM_WORLD);
    auto t1 = std::chrono::steady_clock::now();
    if (it >= o.warmup) times.push_back(std::chrono::duration<double>(t1 - t0).count());
    if (rank != 0) {
      std::uint64_t got = checksum(buf.get(), n);
      if (got != expected) {
        char msg[160];
        std::snprintf(msg, sizeof msg,
                      "broadcast %" PRIu64 " corrupt: checksum %016" PRIx64
                      ", expected %016" PRIx64,
                      it + 1, got, expected);
        fail(rank, msg);
      }
      std::memset(buf.get(), 0, n);  // the next broadcast must deliver everything again
    }
  }
  if (rank == 0 && checksum(buf.get(), n) != expected)
    fail(rank, "the source buffer changed during the broadcasts");
  MPI_Barrier(MPI_COMM_WORLD);  // every receiver has verified every broadcast

  if (rank == 0) {
    std::size_t k = times.size();
    const double median = rlsync::median(times);
    std::sort(times.begin(), times.end());
    double gb = static_cast<double>(n) / 1e9;
    nlohmann::ordered_json out = {{"bytes", n},
                                  {"ranks", ranks},
                                  {"iterations", k},
                                  {"median_s", median},
                                  {"min_s", times.front()},
                                  {"gbps", gb * (ranks - 1) / median},
                                  {"gbps_per_receiver", gb / median}};
    std::printf("%s\n", out.dump().c_str());
    std::fflush(stdout);
  }
  MPI_Finalize();
  return 0;
}
