// rlsync soak: syncs back to back for a while, watching this process's
// memory, descriptors and threads. A benchmark: it prints figures and judges
// nothing; the goal is flat.
#include "actors/assembly/local_deployment.hpp"
#include "actors/jobs/main_job.hpp"
#include "actors/system_config.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"

#include <caf/scoped_actor.hpp>

#include <chrono>
#include <cstdio>
#include <dirent.h>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace rlsync::tools {

namespace {

using clock_type = std::chrono::steady_clock;

const char* description =
  "Runs the topology in this process (as `rlsync run` does, through the same\n"
  "sync reporting) with no workload and the trainer stepping only when asked,\n"
  "then syncs back to back for --minutes: one trainer step, one round, again.\n"
  "Every --sample-every syncs it samples this process's resident memory\n"
  "(VmRSS), open descriptors and threads, and prints the samples and their\n"
  "least-squares slope per 1,000 syncs (warm-up sample left out). The goal is\n"
  "flat. Exit status: 0 it ran to the end, 1 a step or a round failed.";

constexpr double max_minutes = 24 * 60;

struct sample {
  std::uint64_t syncs = 0;
  std::int64_t rss_kb = 0;
  std::int64_t fds = 0;
  std::int64_t threads = 0;
  std::int64_t actors = 0; ///< running in this actor system
};

/// A field of /proc/self/status in its own unit (kB for VmRSS), or -1.
std::int64_t status_field(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key + ":", 0) == 0) {
      std::istringstream in(line.substr(key.size() + 1));
      std::int64_t v = -1;
      in >> v;
      return v;
    }
  return -1;
}

std::int64_t open_descriptors() {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr)
    return -1;
  std::int64_t n = 0;
  while (auto* e = ::readdir(d))
    if (e->d_name[0] != '.')
      ++n;
  ::closedir(d);
  return n - 1; // the directory's own descriptor
}

sample take(std::uint64_t syncs, caf::actor_system& sys) {
  return {syncs, status_field("VmRSS"), open_descriptors(), status_field("Threads"),
          static_cast<std::int64_t>(sys.registry().running())};
}

/// Least-squares slope of y over x, per 1,000 x; 0 with fewer than two points.
double slope_per_1000(const std::vector<sample>& s, std::int64_t sample::*field) {
  if (s.size() < 2)
    return 0;
  double n = static_cast<double>(s.size()), sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (auto& p : s) {
    double x = static_cast<double>(p.syncs), y = static_cast<double>(p.*field);
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  double den = n * sxx - sx * sx;
  return den == 0 ? 0 : 1000 * (n * sxy - sx * sy) / den;
}

std::string fixed(double x, int digits = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

} // namespace

int cmd_soak(const arg_list& argv) {
  CLI::App app(description, "rlsync soak");
  cli::configure(app);
  std::vector<std::string> files;
  app.add_option("T.yaml", files, "the topology file");
  double minutes = 10;
  app.add_option("--minutes", minutes, "how long to sync")->capture_default_str();
  std::uint64_t sample_every = 100;
  cli::add_count(app, "--sample-every", sample_every, "syncs between samples")->default_val(sample_every);
  if (!cli::parse(app, argv))
    return 0;
  if (files.size() != 1)
    throw cli::usage_error("expected one topology file (rlsync soak T.yaml --minutes M)");
  if (!(minutes > 0 && minutes <= max_minutes))
    throw cli::usage_error("--minutes: must be in (0, " + fixed(max_minutes, 0) + "], got " + fixed(minutes));
  if (sample_every == 0 || sample_every > 1000000)
    throw cli::usage_error("--sample-every: must be in [1, 1000000], got " + std::to_string(sample_every));
  auto loaded = jobs::load_topology_or_report(files[0]);
  if (!loaded)
    return 1;
  topology t = *loaded;
  // This command drives: a step and a round when asked, never otherwise.
  t.trainer.step_time = std::chrono::hours(24);
  t.sync.every_versions = std::int64_t(1) << 40;

  // The same sync reporting `rlsync run` keeps, without a line per sync.
  jobs::job_console out(false, true);
  system_config cfg;
  caf::actor_system sys{cfg};
  deployment_options opts;
  opts.on_sync = [&](const sync_report& r) { out.on_sync(r); };
  opts.log = [&](const std::string& line) { out.on_log(line); };
  auto d = deploy_local(sys, t, opts);
  caf::scoped_actor self{sys};
  const auto& dl = t.sync.deadlines;
  const auto round_time = dl.pause + dl.flush + dl.start + dl.transfer + dl.finish + dl.resume;
  std::string failure;
  // Cold: every engine synced once (bounded).
  auto ready_by = clock_type::now() + 2 * round_time;
  for (;;) {
    std::size_t routable = 0;
    self->request(d.coordinator, std::chrono::seconds(5), status_atom::value)
      .receive([&](const coordinator_status& s) { routable = s.routable.size(); }, [](caf::error&) {});
    if (routable >= t.engines.size())
      break;
    if (clock_type::now() > ready_by) {
      failure = "only " + std::to_string(routable) + " of " + std::to_string(t.engines.size())
                + " engines synced in time";
      break;
    }
    self->request(d.coordinator, round_time * 2, sync_atom::value)
      .receive([](const sync_report&) {}, [](caf::error&) {});
  }
  std::cerr << "rlsync soak " << files[0] << ": " << t.engines.size() << " engines, " << fixed(minutes)
            << " minutes, a sample every " << sample_every << " syncs" << std::endl;
  std::vector<sample> samples;
  std::uint64_t syncs = 0;
  const auto t0 = clock_type::now();
  const auto until = t0 + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(minutes * 60));
  std::cout << "syncs\trss_kb\tfds\tthreads\tactors\n";
  while (failure.empty() && clock_type::now() < until) {
    bool stepped = false;
    self->request(d.trainer.actor, round_time, step_atom::value)
      .receive([&](const version_info&) { stepped = true; },
               [&](caf::error& err) { failure = "trainer step: " + sys.render(err); });
    if (!stepped)
      break;
    self->request(d.coordinator, round_time * 2, sync_atom::value)
      .receive([&](const sync_report&) { ++syncs; }, [&](caf::error& err) { failure = "sync: " + sys.render(err); });
    if (failure.empty() && syncs % sample_every == 0) {
      samples.push_back(take(syncs, sys));
      auto& s = samples.back();
      std::cout << s.syncs << "\t" << s.rss_kb << "\t" << s.fds << "\t" << s.threads << "\t" << s.actors << std::endl;
    }
  }
  double seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  d.shutdown();
  // The first sample holds the allocator's and the caches' warm-up.
  std::vector<sample> fitted(samples.size() > 1 ? samples.begin() + 1 : samples.end(), samples.end());
  std::cout << "soak: " << syncs << " syncs in " << fixed(seconds, 1) << " s ("
            << fixed(seconds > 0 ? syncs / seconds : 0, 1) << " syncs/s), " << samples.size() << " samples\n";
  std::cout << "per 1000 syncs: rss " << fixed(slope_per_1000(fitted, &sample::rss_kb)) << " kB, fds "
            << fixed(slope_per_1000(fitted, &sample::fds)) << ", threads "
            << fixed(slope_per_1000(fitted, &sample::threads)) << ", actors "
            << fixed(slope_per_1000(fitted, &sample::actors)) << " (least squares over " << fitted.size()
            << " samples; goal: flat)\n";
  if (!failure.empty()) {
    std::cerr << "rlsync soak: " << failure << "\n";
    return 1;
  }
  return 0;
}

} // namespace rlsync::tools
