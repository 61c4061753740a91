// rlsync drill: rehearse failures (DESIGN §6). The topology runs in this
// process with its rollout workload; the drill section's faults fire at
// their sync round's phase or at their time; everything heals; then the
// invariants are checked (runtime/drill_check) and a report is written
// (runtime/drill_report): JSON and one HTML page with the timeline.
//
//   deploy ─▶ cold sync ─▶ workload ─▶ faults fire ─▶ all healed, every
//   replica back ─▶ settle window ─▶ stop workload ─▶ freeze trainer, final
//   round ─▶ weights verified ─▶ check ─▶ report
//
// Single process: an engine's "process" is its actor. kill = the actor is
// killed; restart = a new actor, next incarnation, registered; partition =
// its messages are dropped and it stops stepping (engine_fault_gate);
// delay_acks = its phase acknowledgements are held; corrupt = the data plane
// alters one group it receives. The trainer can be killed and restarted on
// the same source (its checkpoints survive it). The coordinator can be
// killed and restarted from its state file (one in the report folder when
// the topology names none); live engines re-register as they are. The router
// can be killed and restarted: the coordinator routes the current engines to
// the new one and the requester resends what the old one held as
// continuations. Whole-node kills are refused (they need processes).
//
// Every fault runs on the drill's own thread. A fault due at a round's phase
// is handed over from the coordinator's hook, which waits (bounded) until it
// has fired, so that it lands exactly as that phase goes out.
#include "actors/assembly/head_node.hpp"
#include "actors/assembly/local_deployment.hpp"
#include "actors/jobs/main_job.hpp"
#include "actors/system_config.hpp"
#include "actors/workload.hpp"
#include "runtime/base/stats.hpp"
#include "runtime/drill/drill_check.hpp"
#include "runtime/drill/drill_report.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"

#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <set>
#include <thread>

namespace rlsync::tools {

using namespace rlsync::jobs;

namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

const char* usage =
  "usage: rlsync drill T.yaml [--report DIR]\n"
  "Runs the topology in this process with its workload, fires the faults of its\n"
  "drill: section, heals everything, then checks DESIGN §6's invariants: every\n"
  "request finished or was rejected, no token lost or duplicated, every live engine\n"
  "on the same version with the trainer's weights, no token from a dirty engine,\n"
  "rejoined replicas current, throughput back within 10%, never below\n"
  "sync.min_live_engines. Each is printed as held or violated with its evidence.\n"
  "Writes report.json and report.html (a timeline to open in a browser) into DIR,\n"
  "by default a new folder it names on its last line. Exit status: 0 every\n"
  "invariant held, 1 one was violated (or a fault never fired), 2 bad usage.\n";

/// How long the drill waits for things that should happen by themselves.
constexpr milliseconds fault_deadline{60000};   ///< a fault's round to come
constexpr milliseconds recovery_deadline{30000}; ///< every replica back after the last fault
constexpr milliseconds settle_window{3000};      ///< throughput measured over this, before and after
constexpr milliseconds ramp_up{1000};            ///< the workload's first second is not a baseline
constexpr int after_windows = 4;                 ///< windows after recovery for throughput to return
constexpr milliseconds sample_every{100};

std::string fault_label(const fault_spec& f) {
  std::string s = std::string(to_string(f.action)) + " " + f.target;
  if (f.at_sync)
    s += " (sync " + std::to_string(*f.at_sync) + " "
         + (f.phase == sync_phase::resume ? std::string("continue") : std::string(to_string(f.phase))) + ")";
  else if (f.at)
    s += " (at " + std::to_string(f.at->count()) + " ms)";
  if (f.duration)
    s += " for " + std::to_string(f.duration->count()) + " ms";
  return s;
}

/// What the drill refuses in one process, or empty.
std::string unsupported(const fault_spec& f) {
  if (f.target_kind == fault_target::node && (f.action == fault_action::kill || f.action == fault_action::restart))
    return std::string(to_string(f.action)) + " of a whole node needs the multi-process drill; target its engines";
  return {};
}

class drill_runner {
public:
  drill_runner(caf::actor_system& sys, const topology& t, std::string path)
    : sys_(sys), t_(t), path_(std::move(path)), t0_(clock_type::now()) {
    rec_.name = t.name;
    rec_.source = path_;
    for (auto& e : t.engines)
      rec_.engines.push_back(e.name);
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


private:
  // -- the recorder (called from the coordinator, router, workload and drill threads) --

  double now_ms() const {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0_).count();
  }

  void lane(const std::string& engine, lane_state s) {
    std::lock_guard<std::mutex> lock(mu_);
    rec_.lanes.push_back({now_ms(), engine, s});
  }

  void mark(const std::string& kind, const std::string& label) {
    std::lock_guard<std::mutex> lock(mu_);
    rec_.marks.push_back({now_ms(), kind, label});
  }

  void note(const std::string& line) {
    char at[32];
    std::snprintf(at, sizeof at, "[%9.1f ms] ", now_ms());
    std::cerr << (at + line + '\n');
    std::lock_guard<std::mutex> lock(mu_);
    if (rec_.log.size() < 2000) // bounded: a report stays readable
      rec_.log.push_back(at + line);
  }

  // -- deployment and its hooks ---------------------------------------------------------

  void deploy() {
    deployment_options opts;
    opts.fault_gates = true;
    opts.log = [this](const std::string& line) { note(line); };
    opts.router_log = [this](const std::string& line) { on_router_line(line); };
    opts.on_sync = [this](const sync_report& r) { on_sync(r); };
    opts.on_member = [this](const std::string& engine, const std::string& what) { on_member(engine, what); };
    opts.on_phase = [this](std::uint64_t round, std::uint64_t, sync_phase phase, const std::vector<std::string>& engines) {
      on_phase(round, phase, engines);
    };
    for (const auto& f : t_.drill.faults) // before anything runs: the coordinator's hook reads them
      faults_.push_back({f});
    d_ = deploy_local(sys_, t_, opts);
  }

  void on_phase(std::uint64_t round, sync_phase phase, const std::vector<std::string>& engines) {
    for (auto& e : engines)
      if (phase == sync_phase::pause)
        lane(e, lane_state::paused);
      else if (phase == sync_phase::transfer)
        lane(e, lane_state::transferring);
    std::unique_lock<std::mutex> lock(mu_);
    round_engines_ = engines;
    std::vector<std::size_t> due;
    for (std::size_t i = 0; i < faults_.size(); ++i) {
      auto& f = faults_[i];
      if (!f.queued && f.spec.at_sync && static_cast<std::uint64_t>(*f.spec.at_sync) == round && f.spec.phase == phase) {
        f.queued = true;
        queue_.push_back(i);
        due.push_back(i);
      }
    }
    if (due.empty())
      return;
    wake_.notify_all();
    // Wait (bounded) until they fired, so that they land as this phase goes
    // out; a restart does not wait: it needs this coordinator to register.
    wake_.wait_for(lock, std::chrono::seconds(1), [&] {
      return std::all_of(due.begin(), due.end(), [&](std::size_t i) {
        return faults_[i].fired || faults_[i].spec.action == fault_action::restart;
      });
    });
  }

  void on_member(const std::string& engine, const std::string& what) {
    if (what == "routable") {
      lane(engine, lane_state::generating);
    } else if (what == "registered" && workload_started_) { // a restart, or a new coordinator's roll call
      {
        std::lock_guard<std::mutex> lock(mu_);
        faulted_.insert(engine);
      }
      lane(engine, lane_state::rejoining);
    } else if (what == "evicted") {
      bool cut_off;
      {
        std::lock_guard<std::mutex> lock(mu_);
        faulted_.insert(engine); // out of service: it has to rejoin
        cut_off = unreachable_.count(engine) > 0;
      }
      if (!cut_off)
        lane(engine, lane_state::rejoining);
    } else if (what == "dirty") {
      {
        std::lock_guard<std::mutex> lock(mu_);
        faulted_.insert(engine);
      }
      lane(engine, lane_state::dirty);
    } else if (what == "unreachable" || what == "left" || what == "retired") {
      lane(engine, lane_state::dead);
      std::lock_guard<std::mutex> lock(mu_);
      faulted_.insert(engine);
      if (what == "unreachable")
        unreachable_.insert(engine);
      if (auto f = last_fault_ms_.find(engine); f != last_fault_ms_.end() && what != "retired") {
        double after = now_ms() - f->second;
        rec_.marks.push_back({now_ms(), "detect", engine + " " + what + " (" + std::to_string(static_cast<int>(after)) + " ms after its fault)"});
        if (what == "unreachable")
          detect_ms_.push_back(after);
      }
    } else if (what == "reachable") {
      {
        std::lock_guard<std::mutex> lock(mu_);
        unreachable_.erase(engine);
      }
      lane(engine, lane_state::rejoining);
    }
  }

  void on_sync(const sync_report& r) {
    mark("sync", "v" + std::to_string(r.version) + (r.aborted ? " aborted" : ""));
    std::vector<std::string> engines;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!r.aborted && r.engines_synced > 0)
        completed_versions_.insert(r.version);
      engines = round_engines_;
    }
    if (r.aborted) // engines that were not dirty serve their old version again
      for (auto& e : engines)
        if (!std::count(r.evicted.begin(), r.evicted.end(), e))
          lane(e, lane_state::generating);
  }

  /// "router: request N rerouted from ENGINE (why) after C tokens": the
  /// continuation's first token (index C) ends the failover.
  void on_router_line(const std::string& line) {
    note(line);
    unsigned long long id = 0;
    auto at = line.find("request ");
    auto from = line.find(" rerouted from ");
    auto after = line.rfind(" after ");
    if (at == std::string::npos || from == std::string::npos || after == std::string::npos)
      return;
    id = std::strtoull(line.c_str() + at + 8, nullptr, 10);
    auto name_end = line.find(' ', from + 15);
    std::string engine = line.substr(from + 15, name_end - from - 15);
    auto tokens = static_cast<std::uint32_t>(std::strtoul(line.c_str() + after + 7, nullptr, 10));
    std::lock_guard<std::mutex> lock(mu_);
    if (watches_.size() < 10000)
      watches_[id] = {tokens, engine};
  }

  void on_token(const token_event& ev) {
    tokens_.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu_);
    auto w = watches_.find(ev.request_id);
    if (w == watches_.end() || ev.index != w->second.index)
      return;
    if (auto f = last_fault_ms_.find(w->second.engine); f != last_fault_ms_.end()) {
      auto ms = now_ms() - f->second;
      (fault_action_[w->second.engine] == fault_action::kill ? failover_kill_ms_ : failover_other_ms_).push_back(ms);
    }
    watches_.erase(w);
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
    w.prompts = 1000000; // runs until the drill stops it
    w.on_token = [this](const token_event& ev) { on_token(ev); };
    done_ = std::make_shared<std::promise<workload_result>>();
    result_ = done_->get_future();
    workload_started_ = true;
    workload_t0_ = clock_type::now();
    note("drill: workload started (concurrency " + std::to_string(w.concurrency) + ", " + std::to_string(w.max_tokens)
         + " tokens per request)");
    driver_ = spawn_workload(sys_, d_.router, w, {}, done_);
  }

  void sample_tokens() {
    std::lock_guard<std::mutex> lock(mu_);
    samples_.emplace_back(now_ms(), tokens_.load());
  }

  /// Tokens per second over [from_ms, to_ms] from the samples.
  double throughput(double from_ms, double to_ms) {
    std::lock_guard<std::mutex> lock(mu_);
    auto at = [&](double ms) {
      std::uint64_t n = 0;
      for (auto& [t, k] : samples_)
        if (t <= ms)
          n = k;
      return n;
    };
    if (to_ms - from_ms <= 0)
      return 0;
    return static_cast<double>(at(to_ms) - at(from_ms)) * 1000.0 / (to_ms - from_ms);
  }

  std::vector<std::size_t> engines_of(const fault_spec& f) const {
    std::vector<std::size_t> out;
    for (std::size_t i = 0; i < t_.engines.size(); ++i)
      if ((f.target_kind == fault_target::engine && t_.engines[i].name == f.target)
          || (f.target_kind == fault_target::node && t_.engines[i].node == f.target))
        out.push_back(i);
    return out;
  }

  void hit(std::size_t engine, fault_action action) {
    std::lock_guard<std::mutex> lock(mu_);
    last_fault_ms_[t_.engines[engine].name] = now_ms();
    fault_action_[t_.engines[engine].name] = action;
    faulted_.insert(t_.engines[engine].name);
  }

  /// Fires one fault now (drill thread only; the caller marks it fired,
  /// under the lock). Its end (heal, restart) is scheduled. False: skipped.
  bool fire(std::size_t index) {
    const auto spec = faults_[index].spec; // a copy: the vector is shared with the coordinator's hook
    if (auto why = unsupported(spec); !why.empty()) {
      note("drill: fault " + std::to_string(index) + " (" + fault_label(spec) + ") skipped: " + why);
      return false;
    }
    mark("fault", fault_label(spec));
    note("drill: fault: " + fault_label(spec));
    auto now = clock_type::now();
    if (spec.target_kind == fault_target::router) {
      if (spec.action == fault_action::kill) {
        caf::anon_send_exit(d_.router, caf::exit_reason::kill);
        if (spec.duration)
          ends_.push_back({now + *spec.duration, index});
      } else if (spec.action == fault_action::restart) {
        restart_router();
      }
      return true;
    }
    if (spec.target_kind == fault_target::coordinator) {
      if (spec.action == fault_action::kill) {
        caf::anon_send_exit(d_.coordinator, caf::exit_reason::kill);
        if (spec.duration)
          ends_.push_back({now + *spec.duration, index});
      } else if (spec.action == fault_action::restart) {
        restart_coordinator(true);
      }
      return true;
    }
    if (spec.target_kind == fault_target::trainer) {
      if (spec.action == fault_action::kill) {
        caf::anon_send_exit(d_.trainer.actor, caf::exit_reason::kill);
        if (spec.duration)
          ends_.push_back({now + *spec.duration, index});
      } else if (spec.action == fault_action::restart) {
        restart_trainer();
      }
      return true;
    }
    for (auto i : engines_of(spec)) {
      const auto& name = t_.engines[i].name;
      switch (spec.action) {
        case fault_action::kill:
          hit(i, spec.action);
          caf::anon_send_exit(d_.engines[i], caf::exit_reason::kill);
          lane(name, lane_state::dead);
          break;
        case fault_action::restart:
          hit(i, spec.action);
          restart_engine(i);
          break;
        case fault_action::partition:
          hit(i, spec.action);
          d_.gates[i]->partitioned = true;
          break;
        case fault_action::heal:
          d_.gates[i]->partitioned = false;
          break;
        case fault_action::delay_acks: {
          hit(i, spec.action);
          auto hold = spec.duration.value_or(2 * t_.sync.deadlines.pause);
          d_.gates[i]->acks_held_until_ns = (now + hold).time_since_epoch().count();
          break;
        }
        case fault_action::corrupt:
          hit(i, spec.action);
          d_.trainer.transfer->corrupt({name, -1, 0, 0, 1});
          break;
      }
    }
    if (spec.duration) // partition and delay_acks heal, a kill restarts
      ends_.push_back({now + *spec.duration, index});
    return true;
  }

  /// The end of a fault with a duration: heal, or restart what was killed.
  void end_fault(std::size_t index) {
    const auto& spec = faults_[index].spec;
    if (spec.target_kind == fault_target::router) {
      mark("heal", "restart router");
      restart_router();
      return;
    }
    if (spec.target_kind == fault_target::coordinator) {
      mark("heal", "restart coordinator");
      restart_coordinator(false);
      return;
    }
    if (spec.target_kind == fault_target::trainer) {
      mark("heal", "restart trainer");
      restart_trainer();
      return;
    }
    for (auto i : engines_of(spec)) {
      if (spec.action == fault_action::partition)
        d_.gates[i]->partitioned = false;
      else if (spec.action == fault_action::kill)
        restart_engine(i);
      // delay_acks ends by itself at its time
    }
    mark("heal", (spec.action == fault_action::kill ? "restart " : "heal ") + spec.target);
    note("drill: end of fault: " + fault_label(spec));
  }

  void restart_engine(std::size_t i) {
    const auto& name = t_.engines[i].name;
    lane(name, lane_state::rejoining);
    auto refused = d_.restart_engine(sys_, t_, i);
    if (!refused.empty()) {
      note("drill: " + name + " restart refused: " + refused);
      caf::anon_send_exit(d_.engines[i], caf::exit_reason::kill); // a retired replica's process stops
      lane(name, lane_state::dead);
    } else {
      note("drill: " + name + " restarted as incarnation " + std::to_string(d_.incarnations[i]));
    }
  }

  void restart_router() {
    set_workload_router(driver_, d_.restart_router(sys_));
    note("drill: router restarted; the requests the old one held are resent as continuations");
  }

  void restart_coordinator(bool kill_first) {
    try {
      d_.restart_coordinator(sys_, t_, kill_first);
      note("drill: coordinator restarted from " + t_.coordinator.state_file);
    } catch (const std::exception& e) {
      note(std::string("drill: coordinator restart failed: ") + e.what());
    }
  }

  void restart_trainer() {
    d_.restart_trainer(sys_, t_);
    note("drill: trainer restarted on the same source");
  }

  /// Fires every fault at its round's phase or its time, ends the ones with a
  /// duration, until all fired and ended (or their rounds never came).
  void drive_faults() {
    auto started = workload_t0_;
    auto give_up = clock_type::now() + fault_deadline;
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
        wake_.wait_for(lock, milliseconds(5), [&] { return !queue_.empty(); });
        while (!queue_.empty()) {
          ready.push_back(queue_.front());
          queue_.pop_front();
        }
        for (std::size_t i = 0; i < faults_.size(); ++i) {
          auto& f = faults_[i];
          if (!f.queued && f.spec.at && now >= started + *f.spec.at) {
            f.queued = true;
            ready.push_back(i);
          }
        }
      }
      for (auto i : ready) {
        if (first_fault_ms_ < 0)
          first_fault_ms_ = now_ms();
        bool fired = fire(i);
        std::lock_guard<std::mutex> lock(mu_);
        faults_[i].fired = true;
        faults_[i].skipped = !fired;
        wake_.notify_all(); // the coordinator's hook waits for it
      }
      for (auto e = ends_.begin(); e != ends_.end();) {
        if (now >= e->first) {
          end_fault(e->second);
          e = ends_.erase(e);
        } else {
          ++e;
        }
      }
      bool all_fired = std::all_of(faults_.begin(), faults_.end(), [](const pending_fault& f) { return f.fired; });
      if (all_fired && ends_.empty())
        break;
      if (now > give_up && ends_.empty()) {
        for (std::size_t i = 0; i < faults_.size(); ++i)
          if (!faults_[i].fired)
            note("drill: fault " + std::to_string(i) + " (" + fault_label(faults_[i].spec) + ") never fired: its round did not come within "
                 + std::to_string(fault_deadline.count() / 1000) + " s");
        break;
      }
    }
    last_fault_end_ms_ = now_ms();
  }

  /// Every replica that should serve is routable again (or the deadline passed);
  /// then one settle window measures the throughput after healing.
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
    note(back ? "drill: every member is routable again" : "drill: not every member came back within "
                                                           + std::to_string(recovery_deadline.count() / 1000) + " s");
    mark("heal", back ? "all members routable" : "recovery deadline");
    // Throughput "returns" to its pre-fault level: measured over consecutive
    // windows after recovery until one reaches it (at most after_windows).
    auto window = static_cast<double>(settle_window.count());
    double before_to = first_fault_ms_ >= 0 ? first_fault_ms_ : last_fault_end_ms_;
    double workload_from = std::chrono::duration<double, std::milli>(workload_t0_ - t0_).count();
    double before_from = std::max(workload_from + static_cast<double>(ramp_up.count()), before_to - window);
    throughput_before_ = throughput(before_from, before_to);
    for (int k = 0; k < after_windows; ++k) {
      double from = now_ms();
      auto settle_end = clock_type::now() + settle_window;
      while (clock_type::now() < settle_end) {
        sample_tokens();
        std::this_thread::sleep_for(sample_every);
      }
      sample_tokens();
      double to = now_ms();
      throughput_after_ = throughput(from, to);
      note("drill: throughput " + std::to_string(static_cast<int>(throughput_after_)) + " tokens/s over "
           + std::to_string(static_cast<int>(from - recovered_ms_)) + "-" + std::to_string(static_cast<int>(to - recovered_ms_))
           + " ms after recovery (before the faults " + std::to_string(static_cast<int>(throughput_before_)) + ")");
      if (throughput_after_ >= 0.9 * throughput_before_)
        break;
    }
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
    auto end = finish_job(sys_, t_, {d_.router, d_.coordinator, d_.trainer.actor, d_.trainer.source});
    if (!end.error.empty())
      note("drill: the final round: " + end.error);
    const auto& checks = end.checks;
    const auto& cs = end.status;
    caf::scoped_actor self{sys_};

    drill_observation o;
    o.sent = wr.completed + wr.failed + wr.rejected;
    o.completed = wr.completed;
    o.rejected = wr.rejected;
    o.failed = wr.failed;
    o.stream_mismatches = wr.stream_mismatches;
    o.tokens = wr.tokens;
    o.streamed_tokens = wr.streamed_tokens;
    o.tokens_by_version = wr.tokens_by_version;
    o.synced_version = cs.version;
    o.min_live_engines = t_.sync.min_live_engines;
    o.below_min_live_events = cs.below_min_live_events;
    {
      std::lock_guard<std::mutex> lock(mu_);
      o.completed_versions = completed_versions_;
    }
    for (std::size_t i = 0; i < t_.engines.size(); ++i) {
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
      for (auto& c : checks)
        if (c.engine == e.name && !c.ok())
          e.weights_problem = !c.error.empty() ? c.error
                              : c.dirty        ? "dirty"
                                               : std::to_string(c.mismatched) + " of " + std::to_string(c.shards) + " shards differ";
      {
        std::lock_guard<std::mutex> lock(mu_);
        e.faulted = faulted_.count(e.name) > 0;
      }
      o.engines.push_back(e);
    }
    o.throughput_before = throughput_before_;
    o.throughput_after = throughput_after_;

    auto invariants = check_drill(o);
    bool fired = std::all_of(faults_.begin(), faults_.end(), [](const pending_fault& f) { return f.fired && !f.skipped; });
    std::string fired_evidence;
    for (std::size_t i = 0; i < faults_.size(); ++i)
      fired_evidence += (i ? "; " : "") + fault_label(faults_[i].spec)
                        + (faults_[i].skipped ? ": skipped (not in one process)" : faults_[i].fired ? ": fired" : ": NEVER FIRED");
    invariants.insert(invariants.begin(), invariant_result{"every scheduled fault fired", fired, fired_evidence});
    auto rerouted = reroutes(); // before the lock: the router's log takes it

    std::lock_guard<std::mutex> lock(mu_);
    rec_.duration_ms = now_ms();
    rec_.invariants = invariants;
    // The throughput plot: tokens/s over the last 500 ms at each sample.
    for (std::size_t k = 0; k < samples_.size(); ++k) {
      std::size_t j = k;
      while (j > 0 && samples_[k].first - samples_[j - 1].first <= 500)
        --j;
      double dt = samples_[k].first - samples_[j].first;
      if (dt > 0)
        rec_.throughput.push_back({samples_[k].first, (samples_[k].second - samples_[j].second) * 1000.0 / dt});
    }
    auto maxof = [](const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); };
    if (!failover_kill_ms_.empty()) {
      rec_.figures.push_back({"failover after a kill, median of " + std::to_string(failover_kill_ms_.size()) + " rerouted requests",
                              median(failover_kill_ms_), "ms", "< 100 ms"});
      rec_.figures.push_back({"failover after a kill, worst", maxof(failover_kill_ms_), "ms", "< 100 ms"});
    }
    if (!failover_other_ms_.empty())
      rec_.figures.push_back({"failover after a partition or other fault, median of " + std::to_string(failover_other_ms_.size()),
                              median(failover_other_ms_), "ms", "heartbeat timeout + reroute"});
    if (!detect_ms_.empty())
      rec_.figures.push_back({"partition detected after, worst", maxof(detect_ms_), "ms",
                              "<= heartbeat timeout " + std::to_string(t_.cluster.heartbeat_timeout.count()) + " ms + one interval"});
    rec_.figures.push_back({"throughput before the first fault", o.throughput_before, "tokens/s", ""});
    rec_.figures.push_back({"throughput after healing", o.throughput_after, "tokens/s", ""});
    rec_.figures.push_back({"after / before", o.throughput_before > 0 ? 100.0 * o.throughput_after / o.throughput_before : 0, "%", ">= 90%"});
    rec_.figures.push_back({"requests completed", static_cast<double>(wr.completed), "", ""});
    rec_.figures.push_back({"requests rerouted (router)", static_cast<double>(rerouted), "", ""});
  }

  std::uint64_t reroutes() {
    caf::scoped_actor self{sys_};
    std::uint64_t n = 0;
    self->request(d_.router, std::chrono::seconds(5), status_atom::value)
      .receive([&](const router_status& s) { n = s.rerouted; }, [](caf::error&) {});
    return n;
  }

public:
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

  /// The report so far (a copy taken under the lock).
  drill_record record_copy() {
    std::lock_guard<std::mutex> lock(mu_);
    return rec_;
  }

private:
  struct pending_fault {
    fault_spec spec;
    bool queued = false;
    bool fired = false;
    bool skipped = false;
  };
  struct watch {
    std::uint32_t index = 0; ///< the continuation's first token
    std::string engine;      ///< the failed engine
  };

  caf::actor_system& sys_;
  const topology& t_;
  std::string path_;
  clock_type::time_point t0_;
  clock_type::time_point workload_t0_;
  local_deployment d_;
  caf::actor driver_;
  std::shared_ptr<std::promise<workload_result>> done_;
  std::future<workload_result> result_;
  std::atomic<bool> workload_started_{false};
  std::atomic<std::uint64_t> tokens_{0};

  std::mutex mu_; ///< guards everything below
  std::condition_variable wake_;
  drill_record rec_;
  std::vector<pending_fault> faults_;
  std::deque<std::size_t> queue_; ///< faults handed over by the coordinator's hook
  std::vector<std::pair<clock_type::time_point, std::size_t>> ends_; ///< drill thread only
  std::vector<std::string> round_engines_;
  std::set<std::uint64_t> completed_versions_;
  std::map<std::string, double> last_fault_ms_;
  std::map<std::string, fault_action> fault_action_;
  std::set<std::string> faulted_;     ///< hit by a fault, or out of service because of one
  std::set<std::string> unreachable_;
  std::map<std::uint64_t, watch> watches_;
  std::vector<double> failover_kill_ms_, failover_other_ms_, detect_ms_;
  std::vector<std::pair<double, std::uint64_t>> samples_; ///< (ms, tokens streamed so far)
  double first_fault_ms_ = -1;
  double last_fault_end_ms_ = 0;
  double recovered_ms_ = 0;
  double throughput_before_ = 0;
  double throughput_after_ = 0;
};

std::string default_report_dir(const topology& t) {
  char stamp[32];
  std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  std::string base = "rlsync-drill-" + t.name + "-" + stamp;
  std::string dir = base;
  for (int k = 2; std::filesystem::exists(dir); ++k)
    dir = base + "-" + std::to_string(k);
  return dir;
}

} // namespace

int cmd_drill(const arg_list& argv) {
  cli::args a(argv, {"report"}, {"help"});
  if (a.has("help")) {
    std::cout << usage;
    return 0;
  }
  if (a.positional().size() != 1)
    throw cli::usage_error("expected one topology file (rlsync drill T.yaml)");
  const std::string path = a.positional()[0];
  auto loaded = load_topology_or_report(path);
  if (!loaded)
    return 1;
  topology t = *loaded;
  if (t.drill.faults.empty()) {
    std::cerr << path << ": no drill.faults: nothing to rehearse (see configs/drills/)\n";
    return 1;
  }
  for (std::size_t i = 0; i < t.drill.faults.size(); ++i)
    if (auto why = unsupported(t.drill.faults[i]); !why.empty()) {
      std::cerr << path << ": drill.faults[" << i << "]: " << why << "\n";
      return 1;
    }
  std::string dir = a.get("report").value_or(default_report_dir(t));
  bool coordinator_faults = std::any_of(t.drill.faults.begin(), t.drill.faults.end(),
                                        [](const fault_spec& f) { return f.target_kind == fault_target::coordinator; });
  if (coordinator_faults && t.coordinator.state_file.empty()) { // a restart continues from it
    std::filesystem::create_directories(dir);
    t.coordinator.state_file = std::filesystem::absolute(dir + "/coordinator-state.yaml").string();
  }
  std::cerr << "rlsync drill " << path << ": " << t.engines.size() << " engines, " << t.drill.faults.size()
            << " faults, heartbeat every " << t.cluster.heartbeat_interval.count() << " ms (timeout "
            << t.cluster.heartbeat_timeout.count() << " ms)\n";
  system_config cfg;
  caf::actor_system sys{cfg};
  drill_record rec;
  {
    drill_runner runner(sys, t, path);
    runner.run();
    rec = runner.record_copy();
  }
  write_drill_report(rec, dir);
  std::cout << "\n== rlsync drill " << path << ": " << (rec.passed() ? "PASSED" : "FAILED") << "\n";
  for (auto& f : rec.figures) {
    char value[32];
    std::snprintf(value, sizeof value, "%.1f", f.value);
    std::cout << "  " << f.name << ": " << value << (f.unit.empty() ? "" : " " + f.unit)
              << (f.target.empty() ? "" : " (target " + f.target + ")") << "\n";
  }
  for (auto& inv : rec.invariants)
    std::cout << (inv.held ? "  held      " : "  VIOLATED  ") << inv.name << ": " << inv.evidence << "\n";
  std::cout << "report: " << dir << "/report.html\n" << std::flush;
  std::cout << dir << "\n";
  return rec.passed() ? 0 : 1;
}

} // namespace rlsync::tools
