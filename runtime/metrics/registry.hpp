#pragma once
// Metrics in Prometheus text exposition format 0.0.4: counters, gauges and
// histograms with fixed buckets, each a family of series told apart by
// label values.
//
// The hot path (inc, set, observe on a series already looked up) is a few
// relaxed atomic operations and takes no lock; looking a series up by its
// label values takes the family's mutex, so callers keep the reference they
// get (series are never freed while their registry lives). A family holds at
// most `max_series` label sets: past that, updates go to a sink that is never
// rendered, and `rlsync_metrics_dropped_series_total` counts them, so that a
// label fed from peer input cannot grow a scrape without bound.
//
// Rendering takes a consistent-enough snapshot: each value is read
// atomically, a histogram's buckets, sum and count each on their own (a
// scrape during an observation may see the count one ahead of a bucket,
// as with every lock-free Prometheus client).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace rlsync::metrics {

/// Label sets one family may hold before updates are dropped.
constexpr std::size_t default_max_series = 256;

/// A metric name: [a-zA-Z_:][a-zA-Z0-9_:]* (the colon allows vLLM's `vllm:` names).
bool valid_metric_name(const std::string& name);
/// A label name: [a-zA-Z_][a-zA-Z0-9_]*, and not starting with "__" (reserved).
bool valid_label_name(const std::string& name);
/// A label value as it appears between quotes: backslash, quote and newline escaped.
std::string escape_label_value(const std::string& value);
/// HELP text: backslash and newline escaped.
std::string escape_help(const std::string& text);
/// A sample value: integers without exponent, "+Inf", "-Inf", "NaN", else
/// the shortest decimal that reads back as the same double.
std::string format_value(double v);

/// One value that only goes up.
class counter {
public:
  /// Adds `by` (negative, NaN or infinite: ignored; counters never go down).
  void inc(double by = 1.0);
  double value() const { return value_.load(std::memory_order_relaxed); }

private:
  std::atomic<double> value_{0.0};
};

/// One value that goes up and down.
class gauge {
public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void inc(double by = 1.0);
  void dec(double by = 1.0) { inc(-by); }
  double value() const { return value_.load(std::memory_order_relaxed); }

private:
  std::atomic<double> value_{0.0};
};

/// Observations counted into fixed buckets (upper bounds, ascending).
class histogram {
public:
  explicit histogram(std::vector<double> bounds);
  /// NaN is ignored.
  void observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  /// Cumulative counts per bound, then the +Inf bucket (== count).
  std::vector<std::uint64_t> cumulative() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }
  std::uint64_t count() const { return count_.load(std::memory_order_relaxed); }

private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> buckets_; // bounds_.size() + 1, not cumulative
  std::atomic<double> sum_{0.0};
  std::atomic<std::uint64_t> count_{0};
};

enum class metric_type { counter, gauge, histogram };

/// Series of one metric, by label values (in the order of its label names).
template <class Series>
class family {
public:
  family(std::string name, std::string help, std::vector<std::string> label_names, std::size_t max_series,
         std::function<std::unique_ptr<Series>()> make, std::atomic<std::uint64_t>* dropped);

  /// The series of these label values (as many as the family's label names,
  /// else std::invalid_argument), made at first use. Past max_series new
  /// label sets: a shared sink that is never rendered.
  Series& with(const std::vector<std::string>& values);
  /// The family's one series when it has no labels.
  Series& only() { return with({}); }

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  /// Every series, ordered by label values.
  void visit(const std::function<void(const std::vector<std::string>&, const Series&)>& f) const;

private:
  std::string name_;
  std::string help_;
  std::vector<std::string> label_names_;
  std::size_t max_series_;
  std::function<std::unique_ptr<Series>()> make_;
  std::atomic<std::uint64_t>* dropped_;
  mutable std::mutex mutex_;
  std::map<std::vector<std::string>, std::unique_ptr<Series>> series_;
  std::unique_ptr<Series> sink_;
};

using counter_family = family<counter>;
using gauge_family = family<gauge>;
using histogram_family = family<histogram>;

/// Every family of a process (or of one server), rendered together.
class registry {
public:
  registry();
  registry(const registry&) = delete;
  registry& operator=(const registry&) = delete;

  /// A family by name; asking again with the same name, type, labels (and
  /// buckets) returns the same family. A bad name or label name, or the name
  /// taken with another type or labels: std::invalid_argument.
  counter_family& counters(const std::string& name, const std::string& help,
                           std::vector<std::string> label_names = {}, std::size_t max_series = default_max_series);
  gauge_family& gauges(const std::string& name, const std::string& help, std::vector<std::string> label_names = {},
                       std::size_t max_series = default_max_series);
  /// Bounds must be finite and strictly ascending; +Inf is implied.
  histogram_family& histograms(const std::string& name, const std::string& help, std::vector<double> bounds,
                               std::vector<std::string> label_names = {},
                               std::size_t max_series = default_max_series);

  /// Called at the start of every render, e.g. to set gauges from a status
  /// asked for just then. Keep it short: the scrape waits for it.
  void add_collector(std::function<void()> collect);

  /// Every family in exposition format 0.0.4, by name; families without a
  /// series print their HELP and TYPE only.
  std::string render() const;

  /// Updates that went to a full family's sink.
  std::uint64_t dropped_series() const { return dropped_.load(std::memory_order_relaxed); }

private:
  struct entry {
    metric_type type;
    std::vector<std::string> labels;
    std::vector<double> bounds;
    std::unique_ptr<counter_family> c;
    std::unique_ptr<gauge_family> g;
    std::unique_ptr<histogram_family> h;
  };
  entry& find_or_add(const std::string& name, metric_type type, const std::vector<std::string>& labels,
                     const std::vector<double>& bounds);

  mutable std::mutex mutex_;
  std::map<std::string, entry> families_;
  std::vector<std::function<void()>> collectors_;
  std::atomic<std::uint64_t> dropped_{0};
};

/// The content type of render()'s output.
inline constexpr const char* exposition_content_type = "text/plain; version=0.0.4; charset=utf-8";

} // namespace rlsync::metrics
