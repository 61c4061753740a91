#include "actors/jobs/main_job.hpp"

#include "actors/assembly/local_deployment.hpp"
#include "actors/jobs/job_report.hpp"
#include "actors/jobs/speed_of_light.hpp"
#include "runtime/checkpoint/safetensors.hpp"

#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <deque>
#include <fstream>
#include <future>
#include <iostream>
#include <optional>
#include <thread>

namespace rlsync::jobs {

namespace {

using clock_type = std::chrono::steady_clock;

std::atomic<bool> interrupted{false};
std::atomic<int> stop_signal{0}; // the first of SIGINT/SIGTERM received

extern "C" void on_job_stop_signal(int sig) {
  int none = 0;
  stop_signal.compare_exchange_strong(none, sig);
  interrupted = true;
}

/// After a stop signal, how long requests in flight get to finish before
/// the driver gives up on them. Well inside `rlsync launch`'s default 10 s
/// grace, so that the summary is printed before a SIGKILL could come.
constexpr auto drain_deadline = std::chrono::seconds(5);

/// Serialises writes to stderr from the coordinator's and the driver's threads.
class console {
public:
  explicit console(bool bar) : bar_(bar) {}

  void line(const std::string& text) {
    std::lock_guard<std::mutex> lock(mutex_);
    clear_bar();
    std::cerr << text << "\n";
    draw_bar();
  }

  void progress(const workload_progress& p, std::uint32_t total) {
    std::lock_guard<std::mutex> lock(mutex_);
    last_ = p;
    total_ = total;
    clear_bar();
    draw_bar();
  }

  void done() {
    std::lock_guard<std::mutex> lock(mutex_);
    clear_bar();
    bar_ = false;
  }

private:
  void clear_bar() {
    if (bar_ && drawn_)
      std::cerr << "\r\033[K";
    drawn_ = false;
  }
  void draw_bar() {
    if (!bar_ || total_ == 0)
      return;
    auto finished = last_.completed + last_.failed + last_.rejected;
    int width = 30, filled = static_cast<int>(width * finished / total_);
    std::cerr << "[" << std::string(static_cast<std::size_t>(filled), '#')
              << std::string(static_cast<std::size_t>(width - filled), '.') << "] " << finished << "/" << total_
              << " requests, " << last_.tokens << " tokens" << std::flush;
    drawn_ = true;
  }

  std::mutex mutex_;
  bool bar_;
  bool drawn_ = false;
  workload_progress last_{};
  std::uint32_t total_ = 0;
};

} // namespace

std::optional<topology> load_topology_or_report(const std::string& path) {
  try {
    return load_topology(path);
  } catch (const topology_error& e) {
    for (auto& err : e.errors)
      std::cerr << err << "\n";
    return std::nullopt;
  }
}

namespace {
std::uint32_t u32_field(std::uint64_t v, const char* name) {
  if (v > UINT32_MAX)
    throw std::invalid_argument(std::string(name) + ": " + std::to_string(v) + " is beyond " + std::to_string(UINT32_MAX));
  return static_cast<std::uint32_t>(v);
}
} // namespace

workload_options workload_from(const topology& t, const workload_overrides& o) {
  workload_options w;
  w.prompts = u32_field(o.prompts.value_or(static_cast<std::uint64_t>(t.workload.prompts)), "prompts");
  w.concurrency = u32_field(o.concurrency.value_or(static_cast<std::uint64_t>(t.workload.concurrency)), "concurrency");
  w.max_tokens = u32_field(o.max_tokens.value_or(static_cast<std::uint64_t>(t.workload.max_tokens)), "max_tokens");
  w.temperature = static_cast<float>(t.workload.temperature);
  w.top_p = static_cast<float>(t.workload.top_p);
  w.seed = t.workload.seed;
  w.queue_deadline = t.workload.request_deadline;
  if (w.concurrency == 0 || w.max_tokens == 0)
    throw std::invalid_argument("concurrency and max_tokens must be positive");
  return w;
}

struct job_console::impl {
  explicit impl(bool bar) : out(bar) {}
  console out;
  bool quiet = false;
  mutable std::mutex mutex;
  std::optional<sync_report> cold; ///< the first round that moved weights
  std::deque<sync_report> recent;  ///< the last kept_rounds rounds
  std::uint64_t cold_round = 0;    ///< its number, from 1
  std::uint64_t rounds = 0;
  std::uint64_t dropped = 0;
};

job_console::job_console(bool progress_bar, bool quiet_syncs)
  : impl_(std::make_unique<impl>(progress_bar)), memcpy_gbps_(measure_memcpy_gbps()) {
  impl_->quiet = quiet_syncs;
}

job_console::~job_console() = default;

void job_console::on_sync(const sync_report& r) {
  std::size_t n;
  bool cold = false; // the first round that moved weights
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    auto& st = *impl_;
    n = ++st.rounds;
    cold = r.engines_synced > 0 && !st.cold;
    if (cold) {
      st.cold = r;
      st.cold_round = n;
    }
    st.recent.push_back(r);
    if (st.recent.size() > kept_rounds) {
      st.recent.pop_front();
      ++st.dropped;
    }
  }
  if (impl_->quiet)
    return;
  if (r.aborted && r.engines_synced == 0 && r.evicted.empty())
    return; // the coordinator's "sync round ... ABORTED (why)" line said it
  if (r.engines_synced == 0 && r.evicted.empty()) {
    line("sync " + std::to_string(n) + " v" + std::to_string(r.version) + ": every engine already current");
    return;
  }
  auto f = figures_of(r);
  std::string text = "sync " + std::to_string(n) + " v" + std::to_string(r.version) + (cold ? " (cold)" : "")
                     + ": " + std::to_string(r.engines_synced) + " engines, stall " + fixed(f.stall_ms)
                     + " ms, transfer " + fixed(f.transfer_ms) + " ms, " + fixed(f.gbps, 2) + " GB/s ("
                     + fixed(100 * f.gbps / memcpy_gbps_) + "% of memcpy), control " + fixed(f.control_ms)
                     + " ms (" + fixed(f.stall_ms > 0 ? 100 * f.control_ms / f.stall_ms : 0, 0) + "% of stall)";
  for (auto& e : r.evicted)
    text += ", evicted " + e;
  line(text);
}

void job_console::on_log(const std::string& text) {
  // Round lines come through on_sync; membership and failures are worth a line.
  if (text.rfind("sync round", 0) == 0 && text.find("ABORTED") == std::string::npos)
    return;
  line(text);
}

void job_console::line(const std::string& text) { impl_->out.line(text); }

void job_console::progress(const workload_progress& p, std::uint32_t total) { impl_->out.progress(p, total); }

void job_console::done() { impl_->out.done(); }

std::vector<sync_report> job_console::reports() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::vector<sync_report> out;
  // The cold round leads while it has been dropped from the recent ones.
  if (impl_->cold && impl_->cold_round <= impl_->dropped)
    out.push_back(*impl_->cold);
  out.insert(out.end(), impl_->recent.begin(), impl_->recent.end());
  return out;
}

std::uint64_t job_console::dropped_rounds() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->dropped;
}

std::uint64_t job_console::total_rounds() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->rounds;
}

job_end finish_job(caf::actor_system& sys, const topology& t, const job_handles& h) {
  job_end end;
  caf::scoped_actor self{sys};
  // The trainer freezes first (no new versions), then one last round brings
  // every engine to its final version, which the check compares against.
  auto trainers = h.ranks.empty() ? std::vector<trainer_actor>{h.trainer} : h.ranks;
  for (std::size_t i = 0; i < trainers.size(); ++i)
    if (trainers[i]) // a rank of another process stops publishing once its node stops
      self->request(trainers[i], std::chrono::seconds(30), freeze_atom::value)
        .receive([&](const version_info& vi) { // ranks: the newest version all of them hold
                   end.frozen_version = std::min(end.frozen_version.value_or(vi.version), vi.version);
                 },
                 [&](caf::error& err) {
                   end.error += (end.error.empty() ? "" : "; ")
                                + (trainers.size() == 1 ? std::string("trainer") : "trainer rank " + std::to_string(i))
                                + " did not freeze: " + sys.render(err);
                 });
  if (!t.trainer.ranks.empty()) // the ranks in other processes: through the coordinator, which knows them
    self->request(h.coordinator, std::chrono::seconds(30), freeze_atom::value)
      .receive([](std::uint32_t) {},
               [&](caf::error& err) {
                 end.error += (end.error.empty() ? "" : "; ") + std::string("trainer ranks did not freeze: ")
                              + sys.render(err);
               });
  const auto& dl = t.sync.deadlines;
  auto round_deadline = dl.pause + dl.flush + dl.start + dl.transfer + dl.finish + dl.resume + std::chrono::seconds(5);
  self->request(h.coordinator, round_deadline, sync_atom::value)
    .receive([&](const sync_report& r) { end.last = r; },
             [&](caf::error& err) { end.error += (end.error.empty() ? "" : "; ") + sys.render(err); });
  std::vector<weight_digest> digests;
  self->request(h.coordinator, std::chrono::seconds(30), digest_atom::value)
    .receive([&](std::vector<weight_digest>& d) { digests = std::move(d); },
             [&](caf::error& err) { end.check_error += "digests: " + sys.render(err); });
  std::vector<const transfer::weight_source*> sources;
  for (const auto& s : h.sources)
    sources.push_back(s.get());
  if (sources.empty() && h.source)
    sources.push_back(h.source.get());
  std::uint64_t newest = 0;
  for (const auto& d : digests)
    newest = std::max(newest, d.version);
  for (const auto& s : h.replayed) { // each version derives from the one before: step through them
    try {
      while (newest > 0 && (!s->latest() || s->latest()->version() < newest))
        s->produce_next();
      sources.push_back(s.get());
    } catch (const std::exception& e) {
      end.check_error += (end.check_error.empty() ? "" : "; ") + std::string("replaying a trainer rank: ") + e.what();
    }
  }
  if (!end.check_error.empty())
    end.error += (end.error.empty() ? "" : "; ") + end.check_error;
  end.checks = verify_weights(t, sources, digests);
  self->request(h.coordinator, std::chrono::seconds(10), status_atom::value)
    .receive([&](coordinator_status& s) { end.status = std::move(s); }, [](caf::error&) {});
  return end;
}

int run_main_job(caf::actor_system& sys, const topology& t, const std::string& path, const workload_options& w,
                 const job_handles& h, job_console& out, const std::optional<std::string>& json_file) {
  const double memcpy_gbps = out.memcpy_gbps();
  caf::scoped_actor self{sys};
  // From here a stop signal drains the job, even while it waits for engines.
  auto previous_int = std::signal(SIGINT, on_job_stop_signal);
  auto previous_term = std::signal(SIGTERM, on_job_stop_signal);
  // The workload starts once every engine has completed its cold sync, so
  // that it measures the fleet, not the first engine to be ready. Bounded.
  {
    const auto& dl = t.sync.deadlines;
    auto ready_by = clock_type::now() + 2 * (dl.pause + dl.flush + dl.start + dl.transfer + dl.finish + dl.resume);
    std::size_t routable = 0;
    while (clock_type::now() < ready_by) {
      self->request(h.coordinator, std::chrono::seconds(5), status_atom::value)
        .receive([&](const coordinator_status& s) { routable = s.routable.size(); }, [](caf::error&) {});
      if (routable >= t.engines.size() || interrupted)
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20)); // polling the coordinator's status
    }
    if (routable < t.engines.size())
      out.line("only " + std::to_string(routable) + " of " + std::to_string(t.engines.size())
               + " engines are routable; starting the workload anyway");
  }
  auto t0 = clock_type::now();
  auto done = std::make_shared<std::promise<workload_result>>();
  auto result_future = done->get_future();
  auto latest = std::make_shared<std::atomic<std::uint32_t>>(0); // requests in flight
  auto driver = spawn_workload(
    sys, h.router, w,
    [&out, latest, total = w.prompts](const workload_progress& p) {
      latest->store(p.sent - std::min(p.sent, p.completed + p.failed + p.rejected));
      out.progress(p, total);
    },
    done);
  // Bounded: every request has a deadline; this is the backstop for a bug.
  const auto give_up = clock_type::now() + std::chrono::minutes(30);
  bool stop_sent = false;
  std::optional<clock_type::time_point> drain_until;
  std::string drain;
  std::uint32_t in_flight_at_stop = 0;
  while (result_future.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) {
    if (interrupted && !stop_sent) {
      // Drain: admit nothing new, give the requests in flight a bounded time.
      in_flight_at_stop = latest->load();
      out.line(std::string(stop_signal == SIGTERM ? "SIGTERM" : "interrupted") + ": no new requests; waiting up to "
               + std::to_string(std::chrono::milliseconds(drain_deadline).count()) + " ms for the "
               + std::to_string(in_flight_at_stop) + " in flight");
      stop_workload(driver);
      stop_sent = true;
      drain_until = clock_type::now() + drain_deadline;
    }
    if (drain_until && clock_type::now() > *drain_until) {
      // No engine may be left to answer them: the driver counts them failed.
      drain = std::to_string(in_flight_at_stop) + " in flight at the signal; " + std::to_string(latest->load())
              + " still unanswered after "
              + std::to_string(std::chrono::milliseconds(drain_deadline).count()) + " ms, abandoned (failed)";
      caf::anon_send_exit(driver, caf::exit_reason::user_shutdown);
      if (result_future.wait_for(std::chrono::seconds(5)) != std::future_status::ready)
        return 1;
      break;
    }
    if (clock_type::now() > give_up) {
      out.line("rlsync run: the workload did not finish within 30 minutes");
      stop_workload(driver);
      if (result_future.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
        std::signal(SIGINT, previous_int);
        std::signal(SIGTERM, previous_term);
        return 1;
      }
      break;
    }
  }
  std::signal(SIGINT, previous_int);
  std::signal(SIGTERM, previous_term);
  auto result = result_future.get();
  out.done();
  double seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  if (stop_sent && drain.empty())
    drain = std::to_string(in_flight_at_stop) + " in flight at the signal, all answered";

  // After SIGTERM the job ends now: no final round (there may be no engine
  // left to sync, and whoever sent it waits only a grace period).
  job_end end;
  if (stop_signal == SIGTERM) {
    end.error = "skipped after SIGTERM";
    caf::scoped_actor status_self{sys};
    status_self->request(h.coordinator, std::chrono::seconds(2), status_atom::value)
      .receive([&](coordinator_status& s) { end.status = std::move(s); }, [](caf::error&) {});
  } else {
    end = finish_job(sys, t, h);
  }
  job_outcome o;
  o.label = path;
  o.interrupted = interrupted;
  o.stop_signal = stop_signal;
  o.drain = drain;
  o.requests = w.prompts;
  o.workload = std::move(result);
  o.seconds = seconds;
  o.memcpy_gbps = memcpy_gbps;
  o.syncs = out.reports();
  o.total_syncs = out.total_rounds();
  o.last = end.last;
  o.last_error = end.error;
  o.last_check_error = end.check_error;
  o.checks = end.checks;
  o.min_live_engines = t.sync.min_live_engines;
  o.below_min_live_events = end.status.below_min_live_events;
  o.retired = end.status.retired.size();
  o.ranks = end.status.ranks;
  std::cout << job_summary_text(o) << std::flush;
  if (json_file) {
    std::ofstream f(*json_file);
    f << job_summary_json(o);
    if (!f)
      std::cerr << "rlsync run: cannot write " << *json_file << "\n";
  }
  return job_exit_status(o);
}

} // namespace rlsync::jobs
