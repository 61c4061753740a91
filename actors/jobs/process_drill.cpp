#include "actors/jobs/process_drill.hpp"

#include "actors/assembly/head_node.hpp"
#include "actors/jobs/drill_faults.hpp"
#include "actors/jobs/drill_figures.hpp"
#include "actors/jobs/drill_timeline.hpp"
#include "actors/jobs/process_faults.hpp"
#include "runtime/drill/drill_check.hpp"
#include "runtime/process/launcher.hpp"
#include "runtime/process/short_command.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <poll.h>
#include <set>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace rlsync::jobs {

std::string fault_place(const std::string& path, std::size_t i) {
  return topology_place(path, {"drill", "faults", "[" + std::to_string(i) + "]"});
}

namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// Lines of the head's stderr the report's log keeps (the rest are in its log file).
constexpr std::size_t max_log_lines = 400;
/// One line of the head's stderr is cut at this length (a bounded buffer).
constexpr std::size_t max_line = 64 * 1024;
/// After the last fault ended: the longest the drill waits for a round on
/// every engine before it stops the job anyway (the report says who is out),
/// and how long it lets the fleet run once back.
constexpr milliseconds recovery_deadline{30000};
constexpr milliseconds settle_window{2000};

std::vector<std::string> engine_names(const topology& t) {
  std::vector<std::string> names;
  for (auto& e : t.engines)
    names.push_back(e.name);
  return names;
}

bool notable(const std::string& line) {
  static const char* const words[] = {"evicted", "left (", "silent for", "answers again", "ABORTED", "restored",
                                      "admitted", "retired", "byte-identical", "differ", "FAILED", "rlsync drill"};
  return std::any_of(std::begin(words), std::end(words),
                     [&](const char* w) { return line.find(w) != std::string::npos; });
}

/// One node's process: started, signalled, reaped, started again.
struct node_process {
  std::string name;
  std::vector<std::string> argv; ///< what is executed (with `ip netns exec` in front under --netns)
  std::string log_path;
  bool head = false;
  int pid = -1;
  int err_fd = -1;       ///< the head's stderr (read by the drill); -1 for the others
  bool expect_death = false; ///< the drill killed it
  bool stopped = false;      ///< SIGSTOPped
  int starts = 0;
  std::string exit_text; ///< how it last ended
  int exit_code = -1;    ///< its last exit status (-1: a signal)

  bool running() const { return pid > 0; }
};

std::string find_netns_script(const std::string& exe) {
  namespace fs = std::filesystem;
  // The build tree sits in (or next to) the source tree: build/tools/rlsync.
  fs::path dir = fs::path(exe).parent_path();
  for (int up = 0; up < 4 && !dir.empty(); ++up, dir = dir.parent_path()) {
    auto candidate = dir / "deploy" / "netns.sh";
    if (fs::exists(candidate))
      return candidate.string();
  }
  return {};
}

class process_drill {
public:
  process_drill(const topology& t, const std::string& path, const drill_options& o, process_drill_plan plan,
                std::string dir)
      : t_(t), path_(path), o_(o), plan_(std::move(plan)), dir_(std::move(dir)), schedule_(t.drill.faults) {}

  ~process_drill() {
    for (auto& p : procs_)
      if (p.running()) {
        kill(p.pid, SIGCONT);
        kill(p.pid, SIGKILL);
        waitpid(p.pid, nullptr, 0);
      }
    for (auto& p : procs_)
      if (p.err_fd >= 0)
        close(p.err_fd);
    if (!ns_name_.empty()) {
      std::string why;
      run_short_command({netns_script_, "down", ns_name_}, milliseconds(30000), why);
    }
  }

  /// Namespaces, processes, faults, the end; false: could not even start (why on stderr).
  bool run() {
    t0_ = clock_type::now();
    exe_ = self_executable();
    if (o_.netns && !setup_netns())
      return false;
    state_file_ = t_.coordinator.state_file.empty() ? dir_ + "/coordinator-state.yaml" : t_.coordinator.state_file;
    json_path_ = dir_ + "/job.json";
    std::filesystem::remove(json_path_);
    for (std::size_t i = 0; i < t_.nodes.size(); ++i) {
      const auto& n = t_.nodes[i];
      node_process p;
      p.name = n.name;
      p.head = n.name == t_.coordinator.node;
      p.log_path = dir_ + "/" + n.name + ".log";
      std::filesystem::remove(p.log_path);
      if (o_.netns)
        p.argv = {"ip", "netns", "exec", ns_name_ + "-" + std::to_string(i)};
      for (auto& a : std::vector<std::string>{exe_, "node", "--topology", std::filesystem::absolute(path_).string(),
                                              "--node", n.name, "--supervised"})
        p.argv.push_back(a);
      if (p.head)
        // The job runs until the drill stops it (SIGINT: it drains, runs its
        // last round and checks every engine), so that its length follows
        // the faults and not the machine's speed: workload.prompts counts
        // for `rlsync run` only.
        for (auto& a : std::vector<std::string>{"--run", "--no-progress", "--drill-events", "--json", json_path_,
                                                "--state-file", state_file_, "--prompts",
                                                std::to_string(topology_limits::max_prompts)})
          p.argv.push_back(a);
      else if (hosts_rank(t_, n.name)) // its ranks take the drill's signals (corrupt, withhold)
        p.argv.push_back("--drill-events");
      procs_.push_back(std::move(p));
    }
    // The head first: the members connect to it (retrying up to connect_deadline_ms).
    std::stable_partition(procs_.begin(), procs_.end(), [](const node_process& p) { return p.head; });
    for (auto& p : procs_)
      if (stop_signal() || !start(p))
        return false; // the destructor stops what started and removes the namespaces
    loop();
    finish();
    return true;
  }

  drill_record record() {
    rec_.name = t_.name;
    rec_.source = path_;
    rec_.duration_ms = now_ms();
    for (auto& e : t_.engines)
      rec_.engines.push_back(e.name);
    rec_.lanes = timeline_.lanes();
    rec_.marks = timeline_.marks();
    rec_.invariants = invariants();
    rec_.figures = figures();
    return rec_;
  }

private:
  double now_ms() const { return std::chrono::duration<double, std::milli>(clock_type::now() - t0_).count(); }

  void note(const std::string& line) {
    std::cerr << "rlsync drill: " << line << std::endl;
    if (rec_.log.size() < max_log_lines)
      rec_.log.push_back(line);
  }

  bool setup_netns() {
    netns_script_ = o_.netns_script.empty() ? find_netns_script(exe_) : o_.netns_script;
    if (netns_script_.empty() || !std::filesystem::exists(netns_script_)) {
      std::cerr << "rlsync drill: --netns: deploy/netns.sh not found"
                << (netns_script_.empty() ? " near " + exe_ : " at " + netns_script_) << "; name it with --netns-script\n";
      return false;
    }
    // Node i lives in namespace i, which has address 10.77.NET.(i+1): the
    // topology must say so, or its nodes would not reach each other.
    std::string net;
    const std::string prefix = "10.77.";
    const auto& first = t_.nodes.front().address;
    if (first.compare(0, prefix.size(), prefix) == 0)
      net = first.substr(prefix.size(), first.find('.', prefix.size()) - prefix.size());
    for (std::size_t i = 0; i < t_.nodes.size(); ++i) {
      std::string want = prefix + (net.empty() ? "0" : net) + "." + std::to_string(i + 1);
      if (t_.nodes[i].address != want) {
        std::cerr << path_ << ": nodes[" << i << "] (" << t_.nodes[i].name << "): --netns puts node " << i
                  << " in a namespace at " << want << ", but its address is " << t_.nodes[i].address
                  << " (node i must have 10.77.NET.(i+1), NET the same for all)\n";
        return false;
      }
    }
    if (t_.nodes.size() > 200) {
      std::cerr << "rlsync drill: --netns: at most 200 nodes\n";
      return false;
    }
    std::string why;
    if (!run_short_command({netns_script_, "can"}, milliseconds(10000), why)) {
      std::cerr << "rlsync drill: --netns: network namespaces cannot be made here: " << why << "\n";
      return false;
    }
    ns_name_ = "rldrill" + std::to_string(getpid());
    if (!run_short_command({netns_script_, "up", ns_name_, std::to_string(t_.nodes.size()), net}, milliseconds(60000),
                     why)) {
      std::cerr << "rlsync drill: --netns: " << why << "\n";
      run_short_command({netns_script_, "down", ns_name_}, milliseconds(30000), why);
      ns_name_.clear();
      return false;
    }
    note("namespaces " + ns_name_ + "-0.." + std::to_string(t_.nodes.size() - 1) + " up");
    return true;
  }

  bool start(node_process& p) {
    int log = open(p.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log < 0) {
      std::cerr << "rlsync drill: cannot write " << p.log_path << ": " << std::strerror(errno) << "\n";
      return false;
    }
    int err[2] = {-1, -1};
    if (p.head && pipe2(err, O_CLOEXEC) != 0) {
      close(log);
      std::cerr << "rlsync drill: pipe: " << std::strerror(errno) << "\n";
      return false;
    }
    // The drill's orders stay blocked in the child through exec, until the
    // node has installed its handlers (their default action would kill a
    // node that gets one while it starts): they wait pending meanwhile.
    const sigset_t orders = drill_order_signals();
    sigset_t old_mask;
    pthread_sigmask(SIG_BLOCK, &orders, &old_mask);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0)
      pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
    if (pid < 0) {
      std::cerr << "rlsync drill: fork: " << std::strerror(errno) << "\n";
      close(log);
      return false;
    }
    if (pid == 0) {
      // Dies with the drill, whatever kills it.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent)
        _exit(127);
      setpgid(0, 0); // a Ctrl-C at the terminal reaches the drill only
      int null = open("/dev/null", O_RDONLY); // 0 itself where the drill runs without stdin
      dup2(null, 0);
      if (null > 0)
        close(null);
      dup2(log, 1);
      dup2(p.head ? err[1] : log, 2);
      close_inherited_at_exec();
      std::vector<char*> args;
      for (auto& a : p.argv)
        args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
    close(log);
    if (p.head) {
      close(err[1]);
      if (p.err_fd >= 0)
        close(p.err_fd);
      p.err_fd = err[0];
      fcntl(p.err_fd, F_SETFL, fcntl(p.err_fd, F_GETFL) | O_NONBLOCK);
      partial_.clear();
    }
    p.pid = pid;
    p.expect_death = false;
    p.stopped = false;
    ++p.starts;
    note(p.name + (p.starts > 1 ? " started again" : " started") + ", pid " + std::to_string(pid));
    return true;
  }

  node_process* find(const std::string& node) {
    for (auto& p : procs_)
      if (p.name == node)
        return &p;
    return nullptr;
  }

  node_process& head() { return procs_.front(); }

  std::vector<std::string> engines_on(const std::string& node) const {
    std::vector<std::string> names;
    for (auto& e : t_.engines)
      if (e.node == node)
        names.push_back(e.name);
    return names;
  }

  /// Reads what the head wrote; false at its end of file.
  void read_head(int timeout_ms) {
    auto& h = head();
    if (h.err_fd < 0) {
      std::this_thread::sleep_for(milliseconds(timeout_ms));
      return;
    }
    pollfd pfd{h.err_fd, POLLIN, 0};
    if (poll(&pfd, 1, timeout_ms) <= 0)
      return;
    char buf[8192];
    for (;;) {
      ssize_t n = read(h.err_fd, buf, sizeof buf);
      if (n > 0) {
        for (ssize_t k = 0; k < n; ++k) {
          if (buf[k] == '\n') {
            on_head_line(partial_);
            partial_.clear();
          } else if (partial_.size() < max_line) {
            partial_ += buf[k];
          }
        }
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EINTR)) { // the head closed its stderr (it ended)
        if (!partial_.empty())
          on_head_line(partial_);
        partial_.clear();
        close(h.err_fd);
        h.err_fd = -1;
      }
      return;
    }
  }

  void on_head_line(const std::string& line) {
    {
      std::ofstream log(head().log_path, std::ios::app);
      log << line << "\n";
    }
    if (auto synced = parse_drill_synced_line(line)) {
      versions_.on_synced(*synced);
      recovery_.on_synced(*synced);
      if (synced->engines > 0) // engines reached it, even in a round aborted after its first wave
        completed_versions_.insert(synced->version);
      return;
    }
    auto e = parse_drill_phase_line(line);
    if (!e && line.find("ABORTED") != std::string::npos) { // when a fault's round ended, on the timeline
      double at = now_ms();
      auto reason_end = line.find("):"); // "sync round 8 v11: ABORTED (why): ..."
      timeline_.mark(at, "sync", reason_end == std::string::npos ? line : line.substr(0, reason_end + 1));
      note("at " + std::to_string(static_cast<long long>(at)) + " ms: " + line);
      return;
    }
    if (!e) {
      if (notable(line) && rec_.log.size() < max_log_lines)
        rec_.log.push_back(line);
      return;
    }
    double at = now_ms();
    ++phases_seen_;
    versions_.on_phase(*e);
    recovery_.on_phase(*e);
    auto round = rounds_.on_phase(*e);
    if (round && !rounds_started_) {
      rounds_started_ = true;
      rounds_t0_ = clock_type::now();
      timeline_.mark(at, "sync", "round 1: the whole fleet's first");
      note("round 1 (the head's round " + std::to_string(e->round) + ") reached every engine: faults are timed from here");
    }
    timeline_.on_phase(at, e->phase, e->engines);
    if (e->phase == sync_phase::transfer && round)
      timeline_.mark(at, "sync", "round " + std::to_string(*round) + " v" + std::to_string(e->version));
    if (e->phase == sync_phase::resume) { // an aborted round continues too: its synced line says which
      for (auto& name : e->engines)
        timeline_.lane(at, name, lane_state::generating);
    }
    if (round)
      arm_withholds(*round, e->version, e->phase);
    if (round)
      for (auto i : schedule_.take_at_phase(*round, e->phase))
        fire(i, e->version);
  }

  /// Before a kill, restart or cut of a node hosting trainer ranks at round
  /// R's transfer: its ranks withhold a group (released by their deadline),
  /// so the fault lands while an engine waits for it however fast the
  /// transfer would be. Armed as round R-1 continues, a trainer step before
  /// round R, for any version (nothing else is pulled in between); where
  /// R-1 never continued, as an earlier phase of round R goes out, for its
  /// version. (Armed only by round R's pause, the order once reached the
  /// ranks after a fast machine's transfer had begun: a watcher polls for it
  /// every 5 ms.)
  void arm_withholds(std::uint64_t round, std::uint64_t version, sync_phase phase) {
    for (std::size_t i = 0; i < plan_.faults.size(); ++i) {
      const auto& f = plan_.faults[i];
      const auto& spec = t_.drill.faults[i];
      if (!f.withhold_first || armed_.count(i) || !spec.at_sync)
        continue;
      const auto at = static_cast<std::uint64_t>(*spec.at_sync);
      if (round + 1 == at && phase == sync_phase::resume)
        version = 0; // any version: the next round's
      else if (round != at || phase >= sync_phase::transfer)
        continue;
      armed_.insert(i);
      auto* p = find(f.node);
      auto order = encode_drill_order({std::nullopt, version});
      if (!p || !p->running() || !order) {
        note("withhold not armed for " + fault_label(spec) + ": "
             + (order ? "node " + f.node + "'s process is not running" : "v" + std::to_string(version) + " too large"));
        continue;
      }
      sigval value{};
      value.sival_ptr = reinterpret_cast<void*>(static_cast<std::uintptr_t>(*order));
      if (sigqueue(p->pid, drill_withhold_signal(), value) != 0) {
        note("withhold not armed for " + fault_label(spec) + ": sigqueue to node " + f.node + ": "
             + std::strerror(errno));
        continue;
      }
      armed_at_[i] = {p->log_path, version};
      note("armed for " + fault_label(spec) + ": node " + f.node + "'s trainer ranks withhold a group of "
           + (version ? "v" + std::to_string(version) : std::string("the next version")));
    }
  }

  /// What the armed node logged about the groups it withholds of the
  /// armed version (its log file: members' stderr; its last MiB), read when
  /// the fault fires.
  std::string withheld_groups(std::size_t i) const {
    auto it = armed_at_.find(i);
    if (it == armed_at_.end())
      return {};
    const auto& [log_path, version] = it->second;
    constexpr std::streamoff tail = 1 << 20;
    std::ifstream in(log_path, std::ios::ate);
    if (!in)
      return {};
    in.seekg(std::max<std::streamoff>(0, static_cast<std::streamoff>(in.tellg()) - tail));
    const std::string of_version = version ? " of v" + std::to_string(version) + " " : std::string(" of any version ");
    std::string line, found;
    while (std::getline(in, line) && found.size() < max_line)
      if (auto at = line.find("drill: trainer rank "); at != std::string::npos
          && line.find(" withholds group ") != std::string::npos && line.find(of_version) != std::string::npos)
        found += (found.empty() ? "" : "; ") + line.substr(at + 7);
    return found;
  }

  /// `version`: the round's, for a fault fired at a phase (0: at a time).
  void fire(std::size_t i, std::uint64_t version = 0) {
    const auto& f = plan_.faults.at(i);
    auto* p = find(f.node);
    std::string label = fault_label(t_.drill.faults[i]);
    if (!p || (!p->running() && f.action != process_action::restore_link)) {
      note("fault skipped: " + label + ": node " + f.node + "'s process is not running");
      schedule_.settle(i, false);
      return;
    }
    double at = now_ms();
    timeline_.mark(at, "fault", label);
    // A killed head's members lose their coordinator and must rejoin the next one.
    bool everyone = f.head && (f.action == process_action::kill || f.action == process_action::kill_restart);
    auto hit = everyone ? engine_names(t_) : engines_on(f.node);
    if (f.action == process_action::corrupt) // the named engine's bytes, from the head's producer
      hit = {t_.drill.faults[i].target};
    for (auto& e : hit) {
      timeline_.on_fault(at, e, t_.drill.faults[i].action);
      if ((f.action == process_action::kill || f.action == process_action::kill_restart)
          && t_.find_engine(e)->node == f.node)
        timeline_.lane(at, e, lane_state::dead);
    }
    std::string why;
    switch (f.action) {
    case process_action::kill:
    case process_action::kill_restart:
      p->expect_death = true;
      kill(p->pid, SIGKILL);
      if (f.head)
        ++head_kills_;
      if (f.action == process_action::kill_restart) {
        reap(*p, true);
        start(*p);
      }
      break;
    case process_action::stop:
      kill(p->pid, SIGSTOP);
      p->stopped = true;
      break;
    case process_action::corrupt: {
      // The value names the engine (its index in the topology) whose bytes
      // are altered and the round's version: every process hosting a rank
      // arms its producers, and only one round's group 0 is altered.
      drill_order o{std::nullopt, version};
      for (std::size_t k = 0; k < t_.engines.size(); ++k)
        if (t_.engines[k].name == t_.drill.faults[i].target)
          o.engine = static_cast<std::uint32_t>(k);
      auto order = encode_drill_order(o);
      if (!order) {
        note("fault skipped: " + label + ": its engine index or v" + std::to_string(version) + " does not fit a signal");
        schedule_.settle(i, false);
        return;
      }
      sigval value{};
      value.sival_ptr = reinterpret_cast<void*>(static_cast<std::uintptr_t>(*order));
      std::string sent;
      for (auto& node : f.rank_nodes)
        if (auto* q = find(node); q && q->running()) {
          if (sigqueue(q->pid, drill_corrupt_signal(), value) != 0)
            note("fault: " + label + ": sigqueue to node " + node + ": " + std::strerror(errno));
          else
            sent += (sent.empty() ? "" : ", ") + node;
        }
      note("fault: " + label + ": SIGRTMIN+2 (corrupt group 0 of " + (version ? "v" + std::to_string(version) : "any version")
           + ") to the nodes hosting trainer ranks: " + sent);
      break;
    }
    case process_action::cut_link:
    case process_action::restore_link:
      if (!run_short_command({netns_script_, f.action == process_action::cut_link ? "partition" : "heal", ns_name_,
                        std::to_string(f.node_index)},
                       milliseconds(10000), why)) {
        note("fault failed: " + label + ": " + why);
        schedule_.settle(i, false);
        return;
      }
      break;
    }
    if (f.action != process_action::corrupt)
      note("fault: " + label + ": node " + f.node + ": " + std::string(to_string(f.action)));
    if (f.withhold_first) {
      auto groups = withheld_groups(i);
      note("withheld as the fault landed: " + (groups.empty() ? "nothing (node " + f.node + " logged no withheld group)" : groups));
    }
    schedule_.settle(i, true);
    if (f.ends_after)
      schedule_.end_at(i, clock_type::now() - rounds_t0_ + *f.ends_after);
  }

  void end(std::size_t i) {
    const auto& f = plan_.faults.at(i);
    auto* p = find(f.node);
    double at = now_ms();
    std::string what;
    std::string why;
    switch (f.action) {
    case process_action::kill:
      reap(*p, true);
      if (!p->running())
        start(*p);
      what = "started again";
      break;
    case process_action::stop:
      if (p->running())
        kill(p->pid, SIGCONT);
      p->stopped = false;
      what = "SIGCONT";
      break;
    case process_action::cut_link:
      if (!run_short_command({netns_script_, "heal", ns_name_, std::to_string(f.node_index)}, milliseconds(10000), why))
        note("heal failed: " + why);
      what = "link up";
      break;
    default: return;
    }
    timeline_.mark(at, "heal", f.node + " " + what);
    last_end_ms_ = at;
    if (f.action == process_action::kill)
      for (auto& e : f.head ? engine_names(t_) : engines_on(f.node))
        timeline_.lane(at, e, lane_state::rejoining);
    note("end of " + fault_label(t_.drill.faults[i]) + ": node " + f.node + " " + what);
  }

  /// Reaps `p` if it ended (waiting up to 5 s when `wait`, for one just SIGKILLed).
  void reap(node_process& p, bool wait) {
    if (!p.running())
      return;
    auto until = clock_type::now() + milliseconds(5000);
    for (;;) {
      int status = 0;
      pid_t r = waitpid(p.pid, &status, WNOHANG);
      if (r == p.pid) {
        p.exit_text = describe_wait_status(status);
        p.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        p.pid = -1;
        if (!p.expect_death)
          note(p.name + " " + p.exit_text);
        return;
      }
      if (!wait || clock_type::now() >= until)
        return;
      std::this_thread::sleep_for(milliseconds(5));
    }
  }

  milliseconds drill_deadline() const {
    std::int64_t ms = 300000 + 6 * t_.cluster.connect_deadline.count();
    for (auto& f : t_.drill.faults) {
      ms += f.duration ? f.duration->count() : 0;
      ms += f.at ? f.at->count() : 0;
    }
    return milliseconds(std::min<std::int64_t>(ms, 3 * 3600 * 1000));
  }

  void loop() {
    const auto deadline = clock_type::now() + drill_deadline();
    const auto first_round_by = clock_type::now() + 3 * t_.cluster.connect_deadline + milliseconds(60000);
    for (;;) {
      if (stop_signal()) {
        problem_ = "stopped by signal " + std::to_string(stop_signal());
        note(problem_);
        return;
      }
      read_head(20);
      for (auto& p : procs_)
        reap(p, false);
      if (rounds_started_) {
        auto elapsed = clock_type::now() - rounds_t0_;
        for (auto i : schedule_.take_due_by(elapsed))
          fire(i);
        for (auto i : schedule_.take_ends_due(elapsed))
          end(i);
        stop_job_when_recovered();
      } else if (auto gone = std::find_if(procs_.begin(), procs_.end(),
                                          [](const node_process& p) { return !p.running() && !p.expect_death; });
                 gone != procs_.end()) {
        // Before round 1 nothing of the drill has happened: a node that
        // ended on its own cannot be waited for (its log says why).
        problem_ = "node " + gone->name + " " + gone->exit_text + " before round 1 (see " + gone->log_path + ")";
        note(problem_);
        return;
      } else if (clock_type::now() >= first_round_by) {
        problem_ = "no round reached every engine within " + std::to_string((first_round_by - t0_) / milliseconds(1))
                   + " ms";
        note(problem_);
        return;
      }
      auto& h = head();
      if (!h.running() && !h.expect_death && h.err_fd < 0) {
        job_end_ms_ = now_ms();
        job_exit_ = h.exit_text;
        job_code_ = h.exit_code;
        note("the head's job ended: " + job_exit_);
        // The job runs until the drill stops it: one that ends first (it
        // failed; its log says why) leaves faults unhealed and replicas not
        // rejoined.
        if (schedule_.ends_pending())
          problem_ = "the head's job ended " + std::to_string(static_cast<long long>(now_ms()))
                     + " ms in, before every fault ended (a restart, SIGCONT or heal was still due; see "
                     + h.log_path + ")";
        return;
      }
      if (!h.running() && h.expect_death && !schedule_.ends_pending() && h.err_fd < 0) {
        problem_ = "the head was killed and nothing restarts it";
        note(problem_);
        return;
      }
      if (clock_type::now() >= deadline) {
        problem_ = "the drill ran past its deadline of " + std::to_string(drill_deadline().count()) + " ms";
        note(problem_);
        return;
      }
    }
  }

  /// Once every fault fired and ended, and a round after that reached every
  /// engine (or the recovery deadline passed), the head's job is stopped a
  /// settle window later.
  void stop_job_when_recovered() {
    if (job_stopped_ || !schedule_.all_settled() || schedule_.ends_pending())
      return;
    auto now = clock_type::now();
    if (!recovery_.armed()) {
      recovery_.arm();
      faults_over_at_ = now;
      return;
    }
    if (recovery_.recovered() && !recovered_at_) {
      recovered_at_ = now;
      note("every engine completed a round after the last fault; the job stops in "
           + std::to_string(settle_window.count()) + " ms");
    }
    bool settled = recovered_at_ && now - *recovered_at_ >= settle_window;
    bool gave_up = !recovered_at_ && now - faults_over_at_ >= recovery_deadline;
    if (!settled && !gave_up)
      return;
    auto& h = head();
    if (!h.running())
      return;
    if (gave_up)
      note("no round reached every engine within " + std::to_string(recovery_deadline.count())
           + " ms after the last fault; stopping the job anyway");
    kill(h.pid, SIGINT);
    job_stopped_ = true;
    note("the drill stops the head's job (SIGINT: it drains, runs its last round and checks every engine)");
  }

  /// The members end when the head's coordinator stops; those that do not
  /// are stopped (SIGTERM, then SIGKILL).
  void finish() {
    for (auto& p : procs_)
      if (p.running() && p.stopped) {
        kill(p.pid, SIGCONT);
        p.stopped = false;
      }
    auto wait_all = [&](milliseconds bound) {
      auto until = clock_type::now() + bound;
      while (clock_type::now() < until) {
        read_head(20);
        bool any = false;
        for (auto& p : procs_) {
          reap(p, false);
          any = any || p.running();
        }
        if (!any)
          return;
      }
    };
    // Stopped by a signal, nobody ends on their own: SIGTERM at once.
    if (!stop_signal())
      wait_all(milliseconds(15000));
    for (auto& p : procs_)
      if (p.running()) {
        p.expect_death = true;
        kill(p.pid, SIGTERM);
        note(p.name + " still running after the job: SIGTERM");
      }
    wait_all(milliseconds(10000));
    for (auto& p : procs_)
      if (p.running()) {
        kill(p.pid, SIGKILL);
        reap(p, true);
      }
  }

  std::vector<invariant_result> invariants() {
    drill_observation o;
    o.min_live_engines = t_.sync.min_live_engines;
    o.engines_killed_at_once = engines_killed_at_once(t_);
    // With processes a fault takes its target's whole node.
    auto node_hit = [this](const fault_spec& f) { return fault_node(t_, f); };
    o.lost_by_design = engines_lost_by_design(t_, node_hit);
    o.trainer_lost_by_design = trainer_lost_by_design(t_, node_hit);
    o.judge_throughput = false;
    o.completed_versions = completed_versions_;
    std::string json_problem;
    nlohmann::json j;
    try {
      std::ifstream in(json_path_);
      if (!in)
        json_problem = "no job summary (" + json_path_ + "): the head's job " + (job_exit_.empty() ? "never ended" : job_exit_);
      else
        j = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      json_problem = json_path_ + ": " + e.what();
    }
    std::set<std::string> verified;
    if (json_problem.empty()) {
      try {
        auto& r = j.at("requests");
        o.sent = r.at("total").get<std::uint32_t>();
        o.completed = r.at("completed").get<std::uint32_t>();
        o.rejected = r.at("rejected").get<std::uint32_t>();
        o.failed = r.at("failed").get<std::uint32_t>();
        o.final_round_problem = j.value("final_round_error", std::string());
        o.final_check_problem = j.value("final_check_error", std::string());
        // Prompts the drill's stop left unsent are not lost requests.
        auto not_sent = r.at("not_sent").get<std::uint32_t>();
        if (job_stopped_ && j.value("interrupted", false))
          o.sent -= std::min(o.sent, not_sent);
        else
          o.failed += not_sent;
        o.tokens = j.at("tokens").at("total").get<std::uint64_t>();
        o.streamed_tokens = j.value("streamed_tokens", o.tokens);
        o.stream_mismatches = j.value("stream_mismatches", 0u);
        o.below_min_live_events = j.value("below_min_live_events", std::uint64_t{0});
        for (auto& [v, n] : j.at("tokens").at("by_version").items())
          o.tokens_by_version[std::stoull(v)] = n.get<std::uint64_t>();
        for (auto& s : j.at("syncs"))
          if (s.at("engines").get<std::uint64_t>() > 0)
            o.completed_versions.insert(s.at("version").get<std::uint64_t>());
        if (!j.at("syncs").empty())
          o.synced_version = j.at("syncs").back().at("version").get<std::uint64_t>();
        for (auto& w : j.at("weights")) {
          drill_engine_end e;
          e.name = w.at("engine").get<std::string>();
          e.version = w.at("version").get<std::uint64_t>();
          e.dirty = w.value("dirty", false);
          e.alive = w.value("member", true); // one the coordinator no longer knows is not serving
          bool identical = w.at("identical").get<bool>();
          e.routable = identical;
          if (!identical)
            e.weights_problem = w.at("error").get<std::string>().empty()
                                  ? std::to_string(w.at("mismatched").get<std::uint64_t>()) + " shards differ"
                                  : w.at("error").get<std::string>();
          e.faulted = timeline_.faulted(e.name);
          verified.insert(e.name);
          o.engines.push_back(e);
        }
      } catch (const std::exception& e) {
        json_problem = json_path_ + ": " + e.what();
      }
    }
    // An engine the final check did not reach is not serving at the end.
    std::string late;
    for (auto& e : t_.engines)
      if (!verified.count(e.name)) {
        if (last_end_ms_ >= 0 && json_problem.empty())
          late = "; the job ended " + std::to_string(static_cast<long long>(job_end_ms_ - last_end_ms_))
                 + " ms after the last fault ended, before every engine was back";
        drill_engine_end end;
        end.name = e.name;
        end.alive = false;
        end.faulted = timeline_.faulted(e.name);
        o.engines.push_back(end);
      }
    auto list = check_drill(o);
    for (auto& inv : list) {
      if (inv.name == "every live engine on the same version" && !inv.held)
        inv.evidence += late;
      if (!json_problem.empty() && inv.name != "throughput back to its pre-fault level") {
        inv.held = false;
        inv.evidence = json_problem + "; " + inv.evidence;
      }
      if (inv.name == "no token produced by a dirty engine")
        inv.evidence += "; with processes the engines' own counts of dirty tokens stay in their processes: "
                        "checked by the versions in the results only";
      if (inv.name == "throughput back to its pre-fault level") {
        inv.judged = false;
        inv.held = false;
        inv.evidence = "not measured with processes (the workload runs inside the head, which reports its "
                       "tokens but not their rate over time); reported, not judged";
      }
      if (inv.name == "every request finished or was explicitly rejected" && head_kills_ > 0)
        inv.evidence += "; the head was killed " + std::to_string(head_kills_)
                        + " times: these are the requests of the last head's job (each killed head's job died "
                          "with it)";
    }
    list.insert(list.begin(), schedule_.fired_invariant());
    invariant_result versions{"no version went backwards", versions_.regression().empty() && phases_seen_ > 0,
                              versions_.regression().empty()
                                ? "the head announced " + std::to_string(phases_seen_)
                                    + " phases, none below a completed round's (highest completed v"
                                    + std::to_string(versions_.highest_completed()) + ")"
                                    + (head_kills_ > 0 ? ", across " + std::to_string(head_kills_)
                                                           + " restarts of the head from its state file"
                                                       : std::string())
                                : "the head announced " + versions_.regression()};
    list.push_back(versions);
    if (!problem_.empty())
      list.push_back({"the drill ran to its end", false, problem_});
    return list;
  }

  std::vector<drill_figure> figures() const {
    std::vector<drill_figure> f;
    std::size_t restarts = 0;
    for (auto& p : procs_)
      restarts += p.starts > 0 ? static_cast<std::size_t>(p.starts - 1) : 0;
    f.push_back({"node processes started again", static_cast<double>(restarts), "", ""});
    f.push_back({"head restarts", static_cast<double>(head_kills_), "", ""});
    f.push_back({"round phases announced", static_cast<double>(phases_seen_), "", ""});
    return f;
  }

  const topology& t_;
  const std::string path_;
  const drill_options& o_;
  const process_drill_plan plan_;
  const std::string dir_;
  fault_schedule schedule_;
  fleet_recovery_watch recovery_{engine_names(t_)};
  drill_timeline timeline_;
  version_watch versions_;
  drill_rounds rounds_{engine_names(t_)};
  drill_record rec_;
  std::vector<node_process> procs_; ///< the head first
  std::string exe_, netns_script_, ns_name_, state_file_, json_path_;
  std::string partial_; ///< the head's line being read
  clock_type::time_point t0_, rounds_t0_;
  bool rounds_started_ = false;
  std::uint64_t phases_seen_ = 0;
  std::uint64_t head_kills_ = 0;
  std::set<std::uint64_t> completed_versions_;
  std::set<std::size_t> armed_;                  ///< faults whose withhold was armed
  std::map<std::size_t, std::pair<std::string, std::uint64_t>> armed_at_; ///< fault -> the armed node's log, version
  std::string job_exit_;
  double last_end_ms_ = -1; ///< when the last fault ended (restart, SIGCONT, link up); -1: none
  double job_end_ms_ = 0;
  int job_code_ = -1;
  bool job_stopped_ = false; ///< the drill sent the head SIGINT
  clock_type::time_point faults_over_at_;
  std::optional<clock_type::time_point> recovered_at_;
  std::string problem_;
};

} // namespace

int run_process_drill(const topology& t, const std::string& path, const drill_options& o) {
  auto plan = plan_process_drill(t, o.netns, [&](std::size_t i) { return fault_place(path, i); });
  if (!plan.refusal.empty()) {
    std::cerr << plan.refusal << "\n";
    return 1;
  }
  if (auto problem = cluster_layout_problem(t); !problem.empty()) {
    std::cerr << problem << "\n";
    return 1;
  }
  if (o.netns && geteuid() != 0) {
    std::cerr << "rlsync drill: --netns needs root: it makes a network namespace per node (deploy/netns.sh)\n";
    return 1;
  }
  std::string dir = o.report_dir.empty() ? default_report_dir(t.name) : o.report_dir;
  std::filesystem::create_directories(dir);
  dir = std::filesystem::absolute(dir).lexically_normal().string();
  std::cerr << "rlsync drill " << path << ": " << t.nodes.size() << " nodes as processes"
            << (o.netns ? " in network namespaces" : " on this machine") << ", " << t.engines.size() << " engines, "
            << t.drill.faults.size() << " faults; logs in " << dir << "\n";
  drill_record rec;
  // SIGINT, SIGTERM or SIGHUP stop the drill; its destructor then stops the
  // nodes and removes the namespaces it made (the signals' default action
  // would leave them behind, named after a pid no later run cleans up).
  stop_signal_scope signals; // past the drill's end: its clean-up is not cut short either
  // Said once the drill is gone: its nodes stopped, its namespaces removed.
  auto stopped = [&] {
    std::cerr << "rlsync drill: stopped by signal " << stop_signal() << "; its nodes were stopped"
              << (o.netns ? " and its namespaces removed" : "") << "\n";
    return 128 + stop_signal();
  };
  bool ran = false; // its nodes all started (a signal or a failure stops it before)
  {
    process_drill d(t, path, o, std::move(plan), dir);
    ran = d.run();
    if (ran)
      rec = d.record();
  }
  if (!ran) // a signal while the nodes start is reported as one later is
    return stop_signal() ? stopped() : 1;
  write_drill_report(rec, dir);
  std::cout << drill_summary(rec, path, dir) << std::flush;
  if (stop_signal())
    return stopped();
  return rec.passed() ? 0 : 1;
}

} // namespace rlsync::jobs
