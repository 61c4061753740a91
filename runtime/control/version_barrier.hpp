#pragma once
// The version barrier across trainer ranks: which version a round may sync
// when the trainer is many ranks, each holding part of the model and each
// publishing its own versions. Pure: the coordinator feeds it registrations
// and published versions and asks it for the syncable version.
//
// - A version is syncable when every rank of the topology has published it
//   and still holds it: the ranks of one step publish at slightly different
//   times, so the syncable version is the newest one in every rank's window
//   of its last `keep_window` published versions (what a rank keeps). It
//   never goes backwards.
// - Errors (each names the ranks, and the tensor where one is at fault):
//     layout      a parameter no registered rank holds; a rank holding a
//                 name that is no parameter of the model
//     skew        every rank published, but no version is in every window:
//                 the newest rank is past the oldest by more than a window
//                 (not an error while the oldest is below the last syncable
//                 version: a restarted rank catching up)
//     groups      one version number published with different group counts
//     checksums   a tensor two ranks hold with different bytes at a version,
//                 or a rank whose checksums do not match what it holds
//   A layout error holds back every version; a groups or checksum error
//   holds back that version (no round starts on it); skew holds back all
//   until the ranks converge.
#include "runtime/control/protocol.hpp"

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace rlsync {

/// One problem: its text names the ranks (and the tensor); `key` stays the
/// same while the same problem persists (versions move on), so that a caller
/// logs it once.
struct barrier_error {
  std::string key;
  std::string text;
};

/// What the barrier decides now.
struct barrier_verdict {
  /// The newest version every rank published and still holds, without errors
  /// and not older than any version syncable before; nothing when none. Its
  /// same_bytes_since is the latest any rank says, never before a rank's
  /// vouches_from (join); 0 when a rank did not say or cannot vouch for
  /// the version's bytes at all.
  std::optional<version_info> syncable;
  /// What is wrong, one entry per problem.
  std::vector<barrier_error> errors;
  /// Ranks behind another so far that no version is common to all (one
  /// joined late, or restarted): they must catch up to `catch_up_to`, the
  /// newest version a rank published, or the gap never closes (every rank
  /// steps at the same pace).
  std::vector<std::uint32_t> behind;
  std::uint64_t catch_up_to = 0;
};

class version_barrier {
public:
  /// `ranks`: the topology's rank count; `parameter_names`: every parameter
  /// of the model (empty: the layout is not checked against the model);
  /// `keep_window`: versions a rank keeps (at least 1).
  version_barrier(std::uint32_t ranks, std::vector<std::string> parameter_names, std::size_t keep_window);
  version_barrier() : version_barrier(0, {}, 1) {}

  std::uint32_t ranks() const { return ranks_; }
  /// A rank (re)registered holding `info.held`: a new incarnation forgets
  /// what the old one published. `vouches_from`: the first version whose
  /// bytes it may vouch for (one past the newest version the cluster knew
  /// when it registered: a restarted rank may publish numbers its earlier
  /// incarnation used, with other bytes). Empty when accepted, else why not
  /// (a rank index out of range).
  std::string join(const rank_info& info, std::uint64_t vouches_from = 0);
  /// Every rank of the topology has joined.
  bool complete() const { return joined_.size() == ranks_; }
  /// Rank `rank` published `vi`. Empty when recorded, else why not (not
  /// joined, checksums that do not match what it holds); a version not
  /// newer than its last is ignored.
  std::string publish(std::uint32_t rank, const version_info& vi);
  /// The newest version any rank published (0: none).
  std::uint64_t newest_published() const { return newest_published_; }
  /// Every rank of the topology joined and still holds `v`, the layout
  /// checks out and `v` has no error: a round may pull it from them now.
  bool holds(std::uint64_t v) const;
  /// The syncable version now and the errors; remembers the version so that
  /// none older is syncable later.
  barrier_verdict evaluate();

private:
  struct rank_record {
    rank_info info;
    std::deque<version_info> window; // ascending, at most keep_window
    std::uint64_t vouches_from = 0; // the first version this incarnation may say is unchanged
  };
  void check_layout();
  void check_version(std::uint64_t v, std::vector<barrier_error>& errors) const;

  std::uint32_t ranks_;
  std::vector<std::string> parameter_names_; // ascending
  std::size_t keep_window_;
  std::map<std::uint32_t, rank_record> joined_;
  std::vector<barrier_error> layout_errors_; // recomputed at every join
  std::uint64_t newest_published_ = 0;
  std::uint64_t last_syncable_ = 0;
};

} // namespace rlsync
