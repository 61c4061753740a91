#include "runtime/base/thread_schedule.hpp"

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <ctime>
#include <string>

#include <fcntl.h>
#include <unistd.h>

namespace rlsync {

namespace {

std::optional<std::chrono::nanoseconds> nanoseconds_at(std::string_view& s) {
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end == s.data() || v > static_cast<std::uint64_t>(std::chrono::nanoseconds::max().count()))
    return std::nullopt;
  s.remove_prefix(static_cast<std::size_t>(end - s.data()));
  return std::chrono::nanoseconds(static_cast<std::int64_t>(v));
}

std::optional<thread_schedule> read_schedstat(const char* path) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return std::nullopt;
  char buf[128];
  ssize_t n;
  do
    n = ::read(fd, buf, sizeof buf);
  while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n <= 0)
    return std::nullopt;
  return parse_schedstat(std::string_view(buf, static_cast<std::size_t>(n)));
}

} // namespace

std::optional<thread_schedule> parse_schedstat(std::string_view line) {
  std::optional<std::chrono::nanoseconds> fields[3];
  for (auto& f : fields) {
    if (!(f = nanoseconds_at(line)))
      return std::nullopt;
    if (!line.empty() && line.front() == ' ')
      line.remove_prefix(1);
  }
  if (!line.empty() && line != "\n")
    return std::nullopt;
  thread_schedule s;
  s.ran = *fields[0];
  s.queued = *fields[1];
  s.queued_known = true;
  return s;
}

thread_schedule thread_schedule::now() {
  thread_schedule s;
  // The kernel adds to the wait when a thread gets a core, so the running
  // thread's (this one's) is current.
  if (auto read = read_schedstat("/proc/thread-self/schedstat")) {
    s.queued = read->queued;
    s.queued_known = true;
  }
  timespec ts{};
  if (::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0)
    s.ran = std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
  return s;
}

thread_schedule thread_schedule::of_task(long tid) {
  const std::string path = "/proc/self/task/" + std::to_string(tid) + "/schedstat";
  return read_schedstat(path.c_str()).value_or(thread_schedule{});
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
