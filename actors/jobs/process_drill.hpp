#pragma once
// rlsync drill on a multi-node topology: every node is its own `rlsync node`
// process on this machine (as `rlsync launch` starts them), in its own
// network namespace with --netns. The head (the coordinator's node) runs the
// main job and prints a line as each phase of a round goes out; the faults
// fire on the processes (process_faults says what each does), ends come after
// their durations, a killed head is started again from its state file; when
// the head's job ends, the invariants are checked on what the processes
// report (the job's JSON, the head's lines) and the report is written like
// the in-process drill's, saying which invariants processes cannot check.
#include "actors/jobs/drill_options.hpp"
#include "runtime/config/topology.hpp"

#include <string>

namespace rlsync::jobs {

/// Runs the drill of `t` (loaded from `path`) with processes. Returns the
/// exit status as run_drill does: 0 every judged invariant held, 1 one was
/// violated, a fault never fired, or the drill was refused (why on stderr).
int run_process_drill(const topology& t, const std::string& path, const drill_options& o);

/// "FILE:LINE:COL" of drill.faults[i] in the YAML at `path` ("FILE" alone when
/// it cannot be found there).
std::string fault_place(const std::string& path, std::size_t i);

} // namespace rlsync::jobs
