#pragma once
// The coordinator's state file: what must survive a coordinator restart (the
// weight-version counter, restart counts, who was current). Pure file I/O, no
// actors: the coordinator writes it after each completed round or membership
// change and reads it once when it starts.
//
// Writes go to a temporary name in the same directory and are renamed over
// the file, so a crash leaves either the old file or the new one, never a
// half-written one. One writer per path at a time (the temporary is named
// after the process, not the thread).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rlsync {

/// One engine as the coordinator last knew it.
struct persisted_member {
  std::string name;
  std::uint64_t incarnation = 0;
  std::uint32_t restarts = 0; ///< registrations with a newer incarnation so far
  bool retired = false;       ///< past max_restarts: never admitted again
  std::uint64_t version = 0;  ///< the version it held after its last completed round
  bool routable = false;      ///< it completed that round
};

/// What the coordinator persists: enough that its version counter never goes
/// backwards across a restart, restart caps keep counting, and engines that
/// were current can be recognised when they re-register.
struct persisted_coordinator {
  std::uint64_t synced_version = 0;      ///< version of the last completed round
  std::uint64_t newest_version = 0;      ///< newest version the trainer published
  std::uint64_t rounds = 0;
  std::vector<persisted_member> members; ///< sorted by name, names unique
};

bool operator==(const persisted_member& a, const persisted_member& b);
inline bool operator!=(const persisted_member& a, const persisted_member& b) { return !(a == b); }
bool operator==(const persisted_coordinator& a, const persisted_coordinator& b);
inline bool operator!=(const persisted_coordinator& a, const persisted_coordinator& b) {
  return !(a == b);
}

/// Reads `path`. nullopt when the file does not exist (a first start).
/// Throws std::runtime_error "<path>:<line>:<column>: <field>: <what>" (one
/// line per problem) for anything malformed: not YAML, a missing or mistyped
/// field, a negative or non-integer number, duplicate member names,
/// synced_version > newest_version, a member version > newest_version,
/// unknown keys, a `format` other than 1; and "<path>: <what>" when the file
/// exists but cannot be read. Members come back sorted by name.
std::optional<persisted_coordinator> read_coordinator_state(const std::string& path);

/// Writes `path` atomically: to "<path>.tmp.<pid>" in the same directory,
/// fsync, rename over `path`, fsync the directory. Throws std::runtime_error
/// naming the path and errno text on failure (before the rename the old file
/// is untouched and the temporary removed; only a failed directory fsync
/// comes after it). Throws std::invalid_argument, touching nothing, when `s`
/// breaks the invariants read_coordinator_state checks (so that a restart
/// never meets a file its own coordinator wrote and cannot read).
void write_coordinator_state(const std::string& path, const persisted_coordinator& s);

/// The YAML text written (for tests and logs); members sorted by name.
std::string to_yaml(const persisted_coordinator& s);

} // namespace rlsync
