#pragma once
// A log that a flood cannot fill: at most `burst` lines per `window` pass;
// the rest are counted and reported as one "(N more suppressed)" line with
// the next line that passes. Thread-safe; the clock is injectable so tests
// are deterministic.
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <utility>

namespace rlsync {

class rate_limited_log {
public:
  using clock = std::chrono::steady_clock;
  using sink = std::function<void(const std::string&)>;

  rate_limited_log(sink out, std::size_t burst = 10, std::chrono::milliseconds window = std::chrono::seconds(10),
                   std::function<clock::time_point()> now = [] { return clock::now(); })
      : out_(std::move(out)), burst_(burst), window_(window), now_(std::move(now)) {}

  /// Writes `line` unless this window's burst is spent; returns whether it was written.
  bool operator()(const std::string& line) {
    std::string text;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto t = now_();
      if (t - window_start_ >= window_) {
        window_start_ = t;
        passed_ = 0;
      }
      if (passed_ >= burst_) {
        ++suppressed_;
        ++suppressed_total_;
        return false;
      }
      ++passed_;
      text = line;
      if (suppressed_ > 0)
        text += " (" + std::to_string(suppressed_) + " similar lines suppressed)";
      suppressed_ = 0;
    }
    if (out_)
      out_(text);
    return true;
  }

  /// Lines dropped since construction.
  std::uint64_t suppressed_total() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return suppressed_total_;
  }

private:
  sink out_;
  std::size_t burst_;
  clock::duration window_;
  std::function<clock::time_point()> now_;
  mutable std::mutex mutex_;
  clock::time_point window_start_{};
  std::size_t passed_ = 0;
  std::uint64_t suppressed_ = 0;
  std::uint64_t suppressed_total_ = 0;
};

} // namespace rlsync
