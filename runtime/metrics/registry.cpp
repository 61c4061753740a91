#include "runtime/metrics/registry.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <stdexcept>

namespace rlsync::metrics {

namespace {

bool name_start(char c, bool colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
}

bool name_rest(char c, bool colon) {
  return name_start(c, colon) || (c >= '0' && c <= '9');
}

bool valid_name(const std::string& name, bool colon) {
  if (name.empty() || !name_start(name[0], colon))
    return false;
  return std::all_of(name.begin() + 1, name.end(), [&](char c) { return name_rest(c, colon); });
}

void add_double(std::atomic<double>& a, double by) {
  double old = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(old, old + by, std::memory_order_relaxed))
    ;
}

std::string label_block(const std::vector<std::string>& names, const std::vector<std::string>& values,
                        const char* extra_name = nullptr, const std::string& extra_value = {}) {
  if (names.empty() && !extra_name)
    return {};
  std::string out = "{";
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i)
      out += ',';
    out += names[i] + "=\"" + escape_label_value(values[i]) + '"';
  }
  if (extra_name) {
    if (!names.empty())
      out += ',';
    out += std::string{extra_name} + "=\"" + escape_label_value(extra_value) + '"';
  }
  return out + "}";
}

void header(std::string& out, const std::string& name, const std::string& help, const char* type) {
  out += "# HELP " + name + ' ' + escape_help(help) + '\n';
  out += "# TYPE " + name + ' ' + type + '\n';
}

} // namespace

bool valid_metric_name(const std::string& name) { return valid_name(name, true); }

bool valid_label_name(const std::string& name) {
  return valid_name(name, false) && name.rfind("__", 0) != 0;
}

std::string escape_label_value(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

std::string escape_help(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

std::string format_value(double v) {
  if (std::isnan(v))
    return "NaN";
  if (std::isinf(v))
    return v > 0 ? "+Inf" : "-Inf";
  // Whole numbers within 2^53 print as integers (counts, bytes, versions).
  if (v == std::floor(v) && std::fabs(v) <= 9007199254740992.0)
    return std::to_string(static_cast<std::int64_t>(v));
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// -- values -----------------------------------------------------------------------

void counter::inc(double by) {
  if (!(by >= 0) || std::isinf(by))
    return;
  add_double(value_, by);
}

void gauge::inc(double by) {
  if (std::isnan(by))
    return;
  add_double(value_, by);
}

histogram::histogram(std::vector<double> bounds)
  : bounds_(std::move(bounds)), buckets_(new std::atomic<std::uint64_t>[bounds_.size() + 1]) {
  for (std::size_t i = 0; i <= bounds_.size(); ++i)
    buckets_[i].store(0, std::memory_order_relaxed);
}

void histogram::observe(double v) {
  if (std::isnan(v))
    return;
  // `le`: a value equal to a bound counts in that bound's bucket.
  auto i = static_cast<std::size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  add_double(sum_, v);
  count_.fetch_add(1, std::memory_order_relaxed);
}

std::vector<std::uint64_t> histogram::cumulative() const {
  std::vector<std::uint64_t> out(bounds_.size() + 1);
  std::uint64_t total = 0;
  for (std::size_t i = 0; i <= bounds_.size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    out[i] = total;
  }
  return out;
}

// -- families ---------------------------------------------------------------------

template <class Series>
family<Series>::family(std::string name, std::string help, std::vector<std::string> label_names,
                       std::size_t max_series, std::function<std::unique_ptr<Series>()> make,
                       std::atomic<std::uint64_t>* dropped)
  : name_(std::move(name)), help_(std::move(help)), label_names_(std::move(label_names)),
    max_series_(max_series), make_(std::move(make)), dropped_(dropped), sink_(make_()) {}

template <class Series>
Series& family<Series>::with(const std::vector<std::string>& values) {
  if (values.size() != label_names_.size())
    throw std::invalid_argument(name_ + ": " + std::to_string(values.size()) + " label values for "
                                + std::to_string(label_names_.size()) + " labels");
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto i = series_.find(values); i != series_.end())
    return *i->second;
  if (series_.size() >= max_series_) {
    dropped_->fetch_add(1, std::memory_order_relaxed);
    return *sink_;
  }
  return *series_.emplace(values, make_()).first->second;
}

template <class Series>
void family<Series>::visit(const std::function<void(const std::vector<std::string>&, const Series&)>& f) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [values, s] : series_)
    f(values, *s);
}

template class family<counter>;
template class family<gauge>;
template class family<histogram>;

// -- registry ---------------------------------------------------------------------

registry::registry() = default;

registry::entry& registry::find_or_add(const std::string& name, metric_type type,
                                       const std::vector<std::string>& labels, const std::vector<double>& bounds) {
  if (!valid_metric_name(name))
    throw std::invalid_argument("metric name '" + name + "' is not [a-zA-Z_:][a-zA-Z0-9_:]*");
  for (auto& l : labels) {
    if (!valid_label_name(l))
      throw std::invalid_argument(name + ": label name '" + l + "' is not [a-zA-Z_][a-zA-Z0-9_]* or starts with __");
    if (type == metric_type::histogram && l == "le")
      throw std::invalid_argument(name + ": a histogram may not have a label named 'le'");
  }
  for (std::size_t i = 0; i < labels.size(); ++i)
    for (std::size_t j = i + 1; j < labels.size(); ++j)
      if (labels[i] == labels[j])
        throw std::invalid_argument(name + ": label '" + labels[i] + "' named twice");
  auto i = families_.find(name);
  if (i != families_.end()) {
    if (i->second.type != type || i->second.labels != labels || i->second.bounds != bounds)
      throw std::invalid_argument("metric '" + name + "' is registered already with another type, labels or buckets");
    return i->second;
  }
  auto& e = families_[name];
  e.type = type;
  e.labels = labels;
  e.bounds = bounds;
  return e;
}

counter_family& registry::counters(const std::string& name, const std::string& help,
                                   std::vector<std::string> label_names, std::size_t max_series) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& e = find_or_add(name, metric_type::counter, label_names, {});
  if (!e.c)
    e.c = std::make_unique<counter_family>(name, help, std::move(label_names), max_series,
                                           [] { return std::make_unique<counter>(); }, &dropped_);
  return *e.c;
}

gauge_family& registry::gauges(const std::string& name, const std::string& help,
                               std::vector<std::string> label_names, std::size_t max_series) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& e = find_or_add(name, metric_type::gauge, label_names, {});
  if (!e.g)
    e.g = std::make_unique<gauge_family>(name, help, std::move(label_names), max_series,
                                         [] { return std::make_unique<gauge>(); }, &dropped_);
  return *e.g;
}

histogram_family& registry::histograms(const std::string& name, const std::string& help, std::vector<double> bounds,
                                       std::vector<std::string> label_names, std::size_t max_series) {
  if (bounds.empty())
    throw std::invalid_argument(name + ": a histogram needs at least one bucket bound");
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]))
      throw std::invalid_argument(name + ": bucket bounds must be finite (+Inf is implied)");
    if (i && !(bounds[i - 1] < bounds[i]))
      throw std::invalid_argument(name + ": bucket bounds must ascend strictly");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto& e = find_or_add(name, metric_type::histogram, label_names, bounds);
  if (!e.h)
    e.h = std::make_unique<histogram_family>(name, help, std::move(label_names), max_series,
                                             [bounds] { return std::make_unique<histogram>(bounds); }, &dropped_);
  return *e.h;
}

void registry::add_collector(std::function<void()> collect) {
  std::lock_guard<std::mutex> lock(mutex_);
  collectors_.push_back(std::move(collect));
}

std::string registry::render() const {
  std::vector<std::function<void()>> collectors;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    collectors = collectors_;
  }
  for (auto& c : collectors) // unlocked: a collector may register families
    c();
  std::string out;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [name, e] : families_) {
    switch (e.type) {
      case metric_type::counter:
        header(out, name, e.c->help(), "counter");
        e.c->visit([&, &name = name, &e = e](const std::vector<std::string>& values, const counter& c) {
          out += name + label_block(e.labels, values) + ' ' + format_value(c.value()) + '\n';
        });
        break;
      case metric_type::gauge:
        header(out, name, e.g->help(), "gauge");
        e.g->visit([&, &name = name, &e = e](const std::vector<std::string>& values, const gauge& g) {
          out += name + label_block(e.labels, values) + ' ' + format_value(g.value()) + '\n';
        });
        break;
      case metric_type::histogram:
        header(out, name, e.h->help(), "histogram");
        e.h->visit([&, &name = name, &e = e](const std::vector<std::string>& values, const histogram& h) {
          auto counts = h.cumulative();
          for (std::size_t i = 0; i < counts.size(); ++i) {
            auto le = i < h.bounds().size() ? format_value(h.bounds()[i]) : std::string{"+Inf"};
            out += name + "_bucket" + label_block(e.labels, values, "le", le) + ' ' + std::to_string(counts[i]) + '\n';
          }
          // The +Inf bucket is the count: one read, so that they agree.
          out += name + "_sum" + label_block(e.labels, values) + ' ' + format_value(h.sum()) + '\n';
          out += name + "_count" + label_block(e.labels, values) + ' ' + std::to_string(counts.back()) + '\n';
        });
        break;
    }
  }
  if (auto d = dropped_series()) {
    header(out, "rlsync_metrics_dropped_series_total", "Updates dropped because their family held too many label sets",
           "counter");
    out += "rlsync_metrics_dropped_series_total " + std::to_string(d) + '\n';
  }
  return out;
}

} // namespace rlsync::metrics
