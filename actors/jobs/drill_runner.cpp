// Every fault runs on the drill's own thread. A fault due at a round's phase
// is handed over from the coordinator's hook, which waits (bounded) until it
// has fired, so that it lands exactly as that phase goes out.
#include "actors/jobs/drill_runner.hpp"
#include "actors/jobs/process_drill.hpp"
#include "actors/jobs/process_faults.hpp"

#include "actors/assembly/head_node.hpp"
#include "actors/assembly/local_deployment.hpp"
#include "actors/jobs/drill_faults.hpp"
#include "actors/jobs/drill_figures.hpp"
#include "actors/jobs/drill_injector.hpp"
#include "actors/jobs/drill_timeline.hpp"
#include "actors/jobs/main_job.hpp"
#include "actors/system_config.hpp"
#include "actors/workload.hpp"
#include "runtime/drill/drill_check.hpp"

#include <caf/scoped_actor.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <filesystem>
#include <future>
#include <iostream>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

namespace rlsync::jobs {

namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// How long the drill waits for things that should happen by themselves.
constexpr milliseconds fault_deadline{60000};    ///< a fault's round to come
constexpr milliseconds recovery_deadline{30000}; ///< every replica back after the last fault
constexpr milliseconds settle_window{3000};      ///< throughput measured over this, before and after
constexpr milliseconds ramp_up{1000};            ///< the workload's first second is not a baseline
constexpr int after_windows = 4;                 ///< windows after recovery for throughput to return
constexpr milliseconds sample_every{100};
constexpr std::size_t max_samples = 100000; ///< 100 ms apart: hours, far past every deadline above
constexpr std::size_t max_log_lines = 2000; ///< a report stays readable
constexpr double plot_window_ms = 500;      ///< the throughput plot's smoothing

class drill_runner {
public:
  drill_runner(caf::actor_system& sys, const topology& t, std::string source, throughput_verdict throughput)
    : sys_(sys), t_(t), throughput_(throughput), t0_(clock_type::now()), faults_(t.drill.faults) {
    rec_.name = t.name;
    rec_.source = std::move(source);
    for (auto& e : t.engines)
      rec_.engines.push_back(e.name);
  }

  drill_runner(const drill_runner&) = delete;
  drill_runner& operator=(const drill_runner&) = delete;

  /// Stops every actor and waits for them (bounded): their hooks call into this object.
  ~drill_runner() {
    std::vector<caf::actor> actors{caf::actor_cast<caf::actor>(d_.trainer.actor),
                                   caf::actor_cast<caf::actor>(d_.coordinator),
                                   caf::actor_cast<caf::actor>(d_.router), driver_};
    for (auto& e : d_.engines)
      actors.push_back(caf::actor_cast<caf::actor>(e));
    actors.erase(std::remove(actors.begin(), actors.end(), caf::actor{}), actors.end());
    stop_and_await(sys_, std::move(actors));
  }

  /// Runs the drill; fills the report and the check. Never hangs: every wait is bounded.
  void run() {
    deploy();
    wait_until_routable();
    start_workload();
    drive_faults();
    wait_for_recovery();
    finish();
  }

  /// The report so far (a copy taken under the lock).
  drill_record record_copy() {
    std::lock_guard<std::mutex> lock(mu_);
    return rec_;
  }

private:
  // -- the recorder (called from the coordinator, router, workload and drill threads) --

  double now_ms() const { return std::chrono::duration<double, std::milli>(clock_type::now() - t0_).count(); }

  /// Time since the workload started: the fault schedule's clock.
  clock_type::duration since_workload() const { return clock_type::now() - workload_t0_; }

  void lane(const std::string& engine, lane_state s) {
    std::lock_guard<std::mutex> lock(mu_);
    timeline_.lane(now_ms(), engine, s);
  }

  void mark(const std::string& kind, const std::string& label) {
    std::lock_guard<std::mutex> lock(mu_);
    timeline_.mark(now_ms(), kind, label);
  }

  void note(const std::string& line) {
    char at[32];
    std::snprintf(at, sizeof at, "[%9.1f ms] ", now_ms());
    std::cerr << (at + line + '\n');
    std::lock_guard<std::mutex> lock(mu_);
    if (rec_.log.size() < max_log_lines)
      rec_.log.push_back(at + line);
  }

  // -- deployment and its hooks ---------------------------------------------------------

  void deploy() {
    deployment_options opts;
    opts.fault_gates = true;
    opts.log = [this](const std::string& line) { note(line); };
    opts.router_log = [this](const std::string& line) { on_router_line(line); };
    opts.on_sync = [this](const sync_report& r) {
      std::lock_guard<std::mutex> lock(mu_);
      timeline_.on_sync(now_ms(), r);
    };
    opts.on_member = [this](const std::string& engine, const std::string& what) {
      std::lock_guard<std::mutex> lock(mu_);
      timeline_.on_member(now_ms(), engine, what, workload_started_);
    };
    opts.on_phase = [this](std::uint64_t round, std::uint64_t, sync_phase phase, const std::vector<std::string>& engines) {
      on_phase(round, phase, engines);
    };
    d_ = deploy_local(sys_, t_, opts);
    fault_injector::hooks h;
    h.note = [this](const std::string& line) { note(line); };
    h.lane = [this](const std::string& engine, lane_state state) { lane(engine, state); };
    h.mark = [this](const std::string& kind, const std::string& label) { mark(kind, label); };
    h.hit = [this](const std::string& engine, fault_action action) {
      std::lock_guard<std::mutex> lock(mu_);
      timeline_.on_fault(now_ms(), engine, action);
    };
    injector_ = std::make_unique<fault_injector>(sys_, t_, d_, driver_, std::move(h));
  }

  void on_phase(std::uint64_t round, sync_phase phase, const std::vector<std::string>& engines) {
    std::unique_lock<std::mutex> lock(mu_);
    timeline_.on_phase(now_ms(), phase, engines);
    auto due = faults_.take_at_phase(round, phase);
    if (due.empty())
      return;
    for (auto i : due)
      handed_over_.push_back(i);
    wake_.notify_all();
    // Wait (bounded) until they fired, so that they land as this phase goes
    // out; a restart does not wait: it needs this coordinator to register.
    wake_.wait_for(lock, std::chrono::seconds(1), [&] { return faults_.landed(due); });
  }

  void on_router_line(const std::string& line) {
    note(line);
    if (auto r = parse_reroute_line(line)) {
      std::lock_guard<std::mutex> lock(mu_);
      timeline_.on_reroute(*r);
    }
  }

  void on_token(const token_event& ev) {
    tokens_.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu_);
    timeline_.on_token(now_ms(), ev.request_id, ev.index);
  }

  // -- phases of the drill ------------------------------------------------------------

  void wait_until_routable() {
    caf::scoped_actor self{sys_};
    const auto& dl = t_.sync.deadlines;
    auto until = clock_type::now() + 2 * (dl.pause + dl.flush + dl.start + dl.transfer + dl.finish + dl.resume);
    while (clock_type::now() < until) {
      std::size_t routable = 0;
      self->request(d_.coordinator, std::chrono::seconds(5), status_atom::value)
        .receive([&](const coordinator_status& s) { routable = s.routable.size(); }, [](caf::error&) {});
      if (routable >= t_.engines.size())
        return;
      std::this_thread::sleep_for(milliseconds(20)); // polling the coordinator's status
    }
    note("drill: not every engine became routable after the cold sync; going on");
  }

  void start_workload() {
    auto w = to_workload_options(t_.workload);
    w.prompts = prompts_; // runs until the drill stops it
    w.on_token = [this](const token_event& ev) { on_token(ev); };
    done_ = std::make_shared<std::promise<workload_result>>();
    result_ = done_->get_future();
    workload_t0_ = clock_type::now();
    workload_started_ = true;
    note("drill: workload started (concurrency " + std::to_string(w.concurrency) + ", " + std::to_string(w.max_tokens)
         + " tokens per request)");
    driver_ = spawn_workload(sys_, d_.router, w, {}, done_);
  }

  void sample_tokens() {
    std::lock_guard<std::mutex> lock(mu_);
    if (samples_.size() < max_samples)
      samples_.push_back({now_ms(), tokens_.load()});
  }

  double throughput(time_span span) {
    std::lock_guard<std::mutex> lock(mu_);
    return tokens_per_second(samples_, span.from_ms, span.to_ms);
  }

  /// Fires fault `index` now (drill thread only) and schedules its end. False: skipped.
  bool fire(std::size_t index) {
    fault_spec spec;
    {
      std::lock_guard<std::mutex> lock(mu_);
      spec = faults_.spec(index); // a copy: the schedule is shared with the coordinator's hook
    }
    if (auto why = unsupported_fault(spec); !why.empty()) {
      note("drill: fault " + std::to_string(index) + " (" + fault_label(spec) + ") skipped: " + why);
      return false;
    }
    injector_->fire(spec);
    if (fault_has_end(spec)) {
      std::lock_guard<std::mutex> lock(mu_);
      faults_.end_at(index, since_workload() + *spec.duration);
    }
    return true;
  }

  void end_fault(std::size_t index) {
    fault_spec spec;
    {
      std::lock_guard<std::mutex> lock(mu_);
      spec = faults_.spec(index);
    }
    injector_->end(spec);
  }

  /// Fires every fault at its round's phase or its time, ends the ones with a
  /// duration, until all fired and ended (or their rounds never came).
  void drive_faults() {
    // A timed fault is due at its at_ms: the wait for it starts there.
    milliseconds latest{0};
    for (const auto& f : t_.drill.faults)
      if (f.at)
        latest = std::max(latest, *f.at);
    auto give_up = clock_type::now() + latest + fault_deadline;
    auto next_sample = clock_type::now();
    for (;;) {
      auto now = clock_type::now();
      if (now >= next_sample) {
        sample_tokens();
        next_sample = now + sample_every;
      }
      std::vector<std::size_t> ready;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait_for(lock, milliseconds(5), [&] { return !handed_over_.empty(); });
        ready.assign(handed_over_.begin(), handed_over_.end());
        handed_over_.clear();
        for (auto i : faults_.take_due_by(since_workload()))
          ready.push_back(i);
      }
      for (auto i : ready) {
        if (first_fault_ms_ < 0)
          first_fault_ms_ = now_ms();
        bool fired = fire(i);
        std::lock_guard<std::mutex> lock(mu_);
        faults_.settle(i, fired);
        wake_.notify_all(); // the coordinator's hook waits for it
      }
      std::vector<std::size_t> ends;
      bool settled, ends_pending;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ends = faults_.take_ends_due(since_workload());
      }
      for (auto i : ends)
        end_fault(i);
      {
        std::lock_guard<std::mutex> lock(mu_);
        settled = faults_.all_settled();
        ends_pending = faults_.ends_pending();
      }
      if (settled && !ends_pending)
        break;
      if (clock_type::now() > give_up && !ends_pending) {
        std::vector<std::string> lost;
        {
          std::lock_guard<std::mutex> lock(mu_);
          for (auto i : faults_.never_fired())
            lost.push_back("drill: fault " + std::to_string(i) + " (" + fault_label(faults_.spec(i))
                           + ") never fired: its round did not come within "
                           + std::to_string(fault_deadline.count() / 1000) + " s");
        }
        for (auto& line : lost)
          note(line);
        break;
      }
    }
    faults_end_ms_ = now_ms();
  }

  /// Every replica that should serve is routable again (or the deadline
  /// passed); then the throughput after healing is measured.
  void wait_for_recovery() {
    caf::scoped_actor self{sys_};
    auto until = clock_type::now() + recovery_deadline;
    bool back = false;
    while (!back && clock_type::now() < until) {
      sample_tokens();
      self->request(d_.coordinator, std::chrono::seconds(5), status_atom::value)
        .receive(
          [&](const coordinator_status& s) {
            back = s.unreachable.empty() && s.routable.size() == s.members.size() && !s.members.empty();
          },
          [](caf::error&) {});
      std::this_thread::sleep_for(milliseconds(50)); // polling the coordinator's status
    }
    recovered_ms_ = now_ms();
    note(back ? "drill: every member is routable again"
              : "drill: not every member came back within " + std::to_string(recovery_deadline.count() / 1000) + " s");
    mark("heal", back ? "all members routable" : "recovery deadline");
    double workload_from = std::chrono::duration<double, std::milli>(workload_t0_ - t0_).count();
    throughput_before_ = throughput(baseline_window(first_fault_ms_, faults_end_ms_, workload_from,
                                                    static_cast<double>(ramp_up.count()),
                                                    static_cast<double>(settle_window.count())));
    for (int k = 0; measure_another_window(throughput_before_, throughput_after_, k, after_windows); ++k) {
      double from = now_ms();
      auto settle_end = clock_type::now() + settle_window;
      while (clock_type::now() < settle_end) {
        sample_tokens();
        std::this_thread::sleep_for(sample_every);
      }
      sample_tokens();
      double to = now_ms();
      throughput_after_ = throughput({from, to});
      note("drill: throughput " + std::to_string(static_cast<long long>(throughput_after_)) + " tokens/s over "
           + std::to_string(static_cast<long long>(from - recovered_ms_)) + "-"
           + std::to_string(static_cast<long long>(to - recovered_ms_)) + " ms after recovery (before the faults "
           + std::to_string(static_cast<long long>(throughput_before_)) + ")");
    }
  }

  /// One engine as the drill finds it at the end.
  drill_engine_end engine_end(std::size_t i, const job_end& end, caf::scoped_actor& self) {
    const auto& cs = end.status;
    drill_engine_end e;
    e.name = t_.engines[i].name;
    std::optional<engine_status> st;
    self->request(d_.engines[i], std::chrono::seconds(2), status_atom::value)
      .receive([&](engine_status& s) { st = s; }, [](caf::error&) {});
    e.alive = st.has_value();
    if (st) {
      e.dirty_tokens = st->dirty_tokens;
      note("drill: " + e.name + " generated " + std::to_string(st->tokens_generated) + " tokens in this incarnation, "
           + std::to_string(st->running) + " running, " + std::to_string(st->waiting) + " waiting");
    }
    e.retired = std::count(cs.retired.begin(), cs.retired.end(), e.name) > 0;
    e.reachable = std::count(cs.unreachable.begin(), cs.unreachable.end(), e.name) == 0;
    e.routable = std::count(cs.routable.begin(), cs.routable.end(), e.name) > 0;
    bool member = false;
    for (auto& m : cs.members)
      if (m.name == e.name) {
        member = true;
        e.version = m.version;
        e.dirty = m.dirty;
      }
    e.alive = e.alive && member;
    for (auto& c : end.checks)
      if (c.engine == e.name && !c.ok())
        e.weights_problem = !c.error.empty() ? c.error
                            : c.dirty        ? "dirty"
                                             : std::to_string(c.mismatched) + " of " + std::to_string(c.shards) + " shards differ";
    std::lock_guard<std::mutex> lock(mu_);
    e.faulted = timeline_.faulted(e.name);
    return e;
  }

  void finish() {
    stop_workload(driver_);
    workload_result wr;
    if (result_.wait_for(std::chrono::seconds(120)) == std::future_status::ready) {
      wr = result_.get();
    } else {
      note("drill: the workload did not finish its outstanding requests within 120 s");
      wr.failed = 1;
    }
    job_handles handles{d_.router, d_.coordinator, d_.trainer.actor, d_.trainer.source, {}, {}, {}};
    for (const auto& r : d_.ranks) { // several ranks: each frozen, all together the reference
      handles.ranks.push_back(r.trainer.actor);
      handles.sources.push_back(r.trainer.source);
    }
    auto end = finish_job(sys_, t_, handles);
    if (!end.error.empty())
      note("drill: the final round: " + end.error);
    caf::scoped_actor self{sys_};

    drill_observation o;
    // Requests handed out, counted apart from their answers: one the
    // workload lost track of shows as never answered.
    o.sent = prompts_ - std::min(prompts_, wr.not_sent);
    o.completed = wr.completed;
    o.rejected = wr.rejected;
    o.failed = wr.failed;
    o.stream_mismatches = wr.stream_mismatches;
    o.tokens = wr.tokens;
    o.streamed_tokens = wr.streamed_tokens;
    o.tokens_by_version = wr.tokens_by_version;
    o.synced_version = end.status.version;
    if (end.error.empty())
      o.trainer_version = end.frozen_version;
    o.final_round_problem = end.error;
    o.final_check_problem = end.check_error;
    o.trainer_lost_by_design = trainer_lost_by_design(t_);
    o.lost_by_design = engines_lost_by_design(t_);
    o.min_live_engines = t_.sync.min_live_engines;
    o.below_min_live_events = end.status.below_min_live_events;
    o.engines_killed_at_once = engines_killed_at_once(t_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      o.completed_versions = timeline_.completed_versions();
    }
    for (std::size_t i = 0; i < t_.engines.size(); ++i)
      o.engines.push_back(engine_end(i, end, self));
    o.throughput_before = throughput_before_;
    o.throughput_after = throughput_after_;
    o.judge_throughput = throughput_ == throughput_verdict::judge;

    auto invariants = check_drill(o);
    auto rerouted = reroutes(); // before the lock: the router's log takes it

    std::lock_guard<std::mutex> lock(mu_);
    invariants.insert(invariants.begin(), faults_.fired_invariant());
    if (auto caught = corruptions_caught())
      invariants.insert(invariants.begin() + 1, *caught);
    if (timeline_.dropped() > 0)
      rec_.log.push_back("drill: " + std::to_string(timeline_.dropped()) + " timeline events past "
                         + std::to_string(drill_timeline::max_events) + " were not recorded");
    rec_.duration_ms = now_ms();
    rec_.invariants = invariants;
    rec_.lanes = timeline_.lanes();
    rec_.marks = timeline_.marks();
    rec_.throughput = throughput_plot(samples_, plot_window_ms);
    drill_measurements m;
    m.failover_after_kill_ms = timeline_.failover_after_kill_ms();
    m.failover_after_other_ms = timeline_.failover_after_other_ms();
    m.detect_ms = timeline_.detect_ms();
    m.heartbeat_timeout_ms = t_.cluster.heartbeat_timeout.count();
    m.throughput_before = o.throughput_before;
    m.throughput_after = o.throughput_after;
    m.throughput_judged = o.judge_throughput;
    m.completed = wr.completed;
    m.rerouted = rerouted;
    rec_.figures = drill_figures(m);
  }

  /// With corrupt faults: each altered bytes its engine received (armed is
  /// not enough: a dead engine, or rounds that move no bytes, would leave it
  /// unused) and the engine's update then failed (evicted or dirty). Called
  /// under mu_.
  std::optional<invariant_result> corruptions_caught() const {
    std::vector<std::string> good, bad;
    std::set<std::string> seen;
    for (const auto& f : t_.drill.faults) {
      if (f.action != fault_action::corrupt || !seen.insert(f.target).second)
        continue;
      auto landed = d_.trainer.transfer ? d_.trainer.transfer->corruptions_landed(f.target) : 0;
      bool caught = timeline_.evicted_after_corruption(f.target);
      std::string what = f.target + (landed ? ": " + std::to_string(landed) + " altered receptions" : ": never landed");
      what += caught ? ", its update failed" : landed ? ", yet its update did not fail" : "";
      (landed && caught ? good : bad).push_back(what);
    }
    if (seen.empty())
      return std::nullopt;
    std::string ev;
    for (const auto& x : bad)
      ev += (ev.empty() ? "" : "; ") + x;
    for (const auto& x : good)
      ev += (ev.empty() ? "" : "; ") + x;
    return invariant_result{"every corruption landed and failed its engine's update", bad.empty(), ev};
  }

  std::uint64_t reroutes() {
    caf::scoped_actor self{sys_};
    std::uint64_t n = 0;
    self->request(d_.router, std::chrono::seconds(5), status_atom::value)
      .receive([&](const router_status& s) { n = s.rerouted; }, [](caf::error&) {});
    return n;
  }

  caf::actor_system& sys_;
  const topology& t_;
  const throughput_verdict throughput_;
  const clock_type::time_point t0_;
  clock_type::time_point workload_t0_;
  local_deployment d_;
  caf::actor driver_;
  std::unique_ptr<fault_injector> injector_; ///< fires on d_; tells driver_ about a new router
  std::shared_ptr<std::promise<workload_result>> done_;
  std::future<workload_result> result_;
  static constexpr std::uint32_t prompts_ = 1000000; ///< more than a drill sends: it stops the workload
  std::atomic<bool> workload_started_{false};
  std::atomic<std::uint64_t> tokens_{0};
  // The drill thread's own figures.
  double first_fault_ms_ = -1;
  double faults_end_ms_ = 0;
  double recovered_ms_ = 0;
  double throughput_before_ = 0;
  double throughput_after_ = 0;

  std::mutex mu_; ///< guards everything below
  std::condition_variable wake_;
  drill_record rec_;
  fault_schedule faults_;
  std::deque<std::size_t> handed_over_; ///< faults the coordinator's hook found due (at most one per fault)
  drill_timeline timeline_;
  std::vector<token_sample> samples_; ///< in time order
};

} // namespace

drill_record rehearse(caf::actor_system& sys, const topology& t, const std::string& source,
                      throughput_verdict throughput) {
  drill_runner runner(sys, t, source, throughput);
  runner.run();
  return runner.record_copy();
}


int run_drill(const std::string& path, const drill_options& o) {
  auto loaded = load_topology_or_report(path);
  if (!loaded)
    return 1;
  topology t = *loaded;
  if (runs_as_processes(t))
    return run_process_drill(t, path, o);
  if (o.netns) {
    std::cerr << path << ": --netns: the topology has one node, which the drill runs in this process; "
                 "--netns is for topologies with several nodes\n";
    return 1;
  }
  if (auto why = refuse_drill(t, [&](std::size_t i) { return fault_place(path, i); }); !why.empty()) {
    std::cerr << why << "\n";
    return 1;
  }
  std::string dir = o.report_dir.empty() ? default_report_dir(t.name) : o.report_dir;
  bool coordinator_faults = std::any_of(t.drill.faults.begin(), t.drill.faults.end(),
                                        [](const fault_spec& f) { return f.target_kind == fault_target::coordinator; });
  if (coordinator_faults && t.coordinator.state_file.empty()) { // a restart continues from it
    std::filesystem::create_directories(dir);
    t.coordinator.state_file = std::filesystem::absolute(dir + "/coordinator-state.yaml").string();
  }
  std::cerr << "rlsync drill " << path << ": " << t.engines.size() << " engines, " << t.drill.faults.size()
            << " faults, heartbeat every " << t.cluster.heartbeat_interval.count() << " ms (timeout "
            << t.cluster.heartbeat_timeout.count() << " ms)"
            << (o.throughput == throughput_verdict::report ? "; throughput reported, not judged" : "") << "\n";
  system_config cfg;
  caf::actor_system sys{cfg};
  auto rec = rehearse(sys, t, path, o.throughput);
  write_drill_report(rec, dir);
  std::cout << drill_summary(rec, path, dir) << std::flush;
  return rec.passed() ? 0 : 1;
}

} // namespace rlsync::jobs
