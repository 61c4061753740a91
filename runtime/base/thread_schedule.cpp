#include "runtime/base/thread_schedule.hpp"

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <ctime>

#include <fcntl.h>
#include <unistd.h>

namespace rlsync {

namespace {

std::optional<std::uint64_t> number_at(std::string_view& s) {
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end == s.data())
    return std::nullopt;
  s.remove_prefix(static_cast<std::size_t>(end - s.data()));
  return v;
}

} // namespace

std::optional<std::chrono::nanoseconds> schedstat_queued(std::string_view line) {
  std::optional<std::uint64_t> fields[3];
  for (auto& f : fields) {
    if (!(f = number_at(line)))
      return std::nullopt;
    if (!line.empty() && line.front() == ' ')
      line.remove_prefix(1);
  }
  if (!line.empty() && line != "\n")
    return std::nullopt;
  if (*fields[1] > static_cast<std::uint64_t>(std::chrono::nanoseconds::max().count()))
    return std::nullopt;
  return std::chrono::nanoseconds(static_cast<std::int64_t>(*fields[1]));
}

thread_schedule thread_schedule::now() {
  thread_schedule s;
  timespec ts{};
  if (::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0)
    s.ran = std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
  // The kernel updates the wait when the thread next gets a core, so the
  // figure of a running thread (this one) is current.
  if (int fd = ::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC); fd >= 0) {
    char buf[128];
    ssize_t n;
    do
      n = ::read(fd, buf, sizeof buf);
    while (n < 0 && errno == EINTR);
    ::close(fd);
    if (n > 0)
      if (auto q = schedstat_queued(std::string_view(buf, static_cast<std::size_t>(n)))) {
        s.queued = *q;
        s.queued_known = true;
      }
  }
  return s;
}

thread_schedule thread_schedule::since(const thread_schedule& earlier) const {
  thread_schedule d;
  d.ran = ran > earlier.ran ? ran - earlier.ran : std::chrono::nanoseconds(0);
  d.queued_known = queued_known && earlier.queued_known;
  if (d.queued_known && queued > earlier.queued)
    d.queued = queued - earlier.queued;
  return d;
}

} // namespace rlsync
