#include "actors/http/engine_routes.hpp"

#include "runtime/http/vllm_errors.hpp"
#include "runtime/vllm/completions.hpp"

#include <algorithm>
#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>

// Local only: the HTTP request and answer travel between this process's own actors.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const rlsync::http::request>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rlsync::http::response)

namespace rlsync::serve {

using json = nlohmann::json;
using http::bad_request;
using http::error_envelope;
using http::flat_error;
using http::json_response;
using http::response;

// -- labels and request ids ------------------------------------------------------

std::string version_labels::label_of(std::uint64_t v) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (by_number_ && v > 0 && labels_.find(v) == labels_.end())
    return std::to_string(v);
  auto it = labels_.upper_bound(v);
  if (it == labels_.begin())
    return "default";
  return std::prev(it)->second;
}

void version_labels::label_by_number(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  by_number_ = on;
}

void version_labels::set(std::uint64_t v, std::string label) {
  std::lock_guard<std::mutex> lock(mu_);
  labels_[v] = std::move(label);
  // One per update, for as long as the server runs: the oldest go first
  // (a version that old is no longer served).
  while (labels_.size() > max_labels)
    labels_.erase(labels_.begin());
}

std::vector<std::uint64_t> version_labels::versions_of(const std::string& label) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::uint64_t> out;
  for (auto& [v, l] : labels_)
    if (l == label)
      out.push_back(v);
  return out;
}

void request_registry::add(const std::string& id, std::uint64_t engine_id) {
  std::lock_guard<std::mutex> lock(mu_);
  ids_[id] = engine_id;
}

void request_registry::remove(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  ids_.erase(id);
}

std::optional<std::uint64_t> request_registry::find(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ids_.find(id);
  if (it == ids_.end())
    return std::nullopt;
  return it->second;
}

std::vector<std::uint64_t> request_registry::all() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::uint64_t> out;
  for (auto& [id, e] : ids_)
    out.push_back(e);
  return out;
}

namespace {

// A weight version's label, as a client names it: kept per version and
// echoed in every completion's weight_versions, so bounded as a name is.
std::optional<std::string> version_label(const json& obj, const std::string& name, const std::string& where) {
  auto label = http::optional_string(obj, name, where);
  if (label && label->size() > max_name_bytes)
    throw bad_request("'" + name + "' must be at most " + std::to_string(max_name_bytes) + " bytes, got "
                          + std::to_string(label->size()),
                      where + "." + name);
  return label;
}

} // namespace

// -- the disk backend's checks -------------------------------------------------------

std::string disk_update_path(const json& info, const std::string& param) {
  if (!info.is_object())
    throw bad_request(std::string("the disk weight transfer backend takes update_info {\"path\": dir}, got ") +
                          info.type_name(),
                      param);
  for (auto& [key, value] : info.items())
    if (key != "path")
      throw bad_request("the disk weight transfer backend takes exactly {\"path\": dir} in update_info; '" + key +
                            "' is not one of its fields (NCCL and IPC updates are not supported by rlsync serve)",
                        param + "." + key);
  auto it = info.find("path");
  if (it == info.end())
    throw bad_request("update_info.path is required (the checkpoint directory to load)", param + ".path");
  if (!it->is_string())
    throw bad_request(std::string("update_info.path must be a string, got ") + it->type_name(), param + ".path");
  auto path = it->get<std::string>();
  if (path.empty())
    throw bad_request("update_info.path is empty", param + ".path");
  if (path.front() != '/')
    throw bad_request("update_info.path must be an absolute path, got '" + path + "'", param + ".path");
  return path;
}

std::string disk_checkpoint_problem(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return "'" + dir + "' is not a directory";
  fs::directory_iterator it(dir, ec), end;
  if (ec)
    return "cannot list '" + dir + "': " + ec.message();
  for (; it != end; it.increment(ec)) {
    if (ec)
      return "cannot list '" + dir + "': " + ec.message();
    auto name = it->path().filename().string();
    if (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0)
      return "";
  }
  return "'" + dir + "' holds no *.safetensors file at its top level";
}

std::string coordinated_refusal(const std::string& path) {
  static const std::map<std::string, std::string> refused = {
    {"/init_weight_transfer_engine", "its weights come from the trainer over rlsync's own transfer"},
    {"/start_weight_update", "its weight updates are the coordinator's rounds"},
    {"/update_weights", "its weight updates are the coordinator's rounds"},
    {"/finish_weight_update", "its weight updates are the coordinator's rounds"},
    {"/update_weight_version", "its versions are the coordinator's"},
    {"/collective_rpc", "its weight updates are the coordinator's rounds"},
    {"/pause", "the coordinator pauses and resumes it in its rounds"},
    {"/resume", "the coordinator pauses and resumes it in its rounds"},
    {"/reset_prefix_cache", "the coordinator flushes its caches in its rounds"},
    {"/sleep", "sleeping would drop the weights the coordinator keeps current"},
    {"/wake_up", "sleeping would drop the weights the coordinator keeps current"},
  };
  auto it = refused.find(path);
  if (it == refused.end())
    return "";
  return path + " is refused: this server is a node of a topology and its coordinator owns the engine's weights ("
         + it->second + ")";
}

namespace {

using http_atom = caf::atom_constant<caf::atom("http")>;
using session_idle_atom = caf::atom_constant<caf::atom("sessidle")>;
using request_ptr = std::shared_ptr<const http::request>;
using done_fn = std::function<void(response)>;

/// Now on the monotonic clock, in nanoseconds: a request's expiry.
std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

/// The text of an engine's error: its context message when it has one.
std::string error_text(caf::actor_system& sys, const caf::error& err) {
  if (err.category() == error_category && err.context().match_elements<std::string>())
    return err.context().get_as<std::string>(0);
  return sys.render(err);
}

/// Errors the caller caused by calling out of order.
bool ordering_error(const caf::error& err) {
  return is(err, errc::no_session) || is(err, errc::not_paused) || is(err, errc::version_mismatch) ||
         is(err, errc::pause_in_flight);
}

struct control_state {
  serve_context ctx;
  bool engine_dead = false;
  std::string engine_exit;
  // The disk backend's weight-update session.
  bool session = false;
  bool loaded = false;       ///< a checkpoint is in the session's staging
  bool implicit_pause = false; ///< start paused the engine itself (vLLM needs no pause): resumed after finish
  std::uint64_t session_version = 0;
  std::uint64_t session_calls = 0; ///< counts the calls that touch a session; its idle timer holds the count
  bool sleeping = false;
  int sleep_level = 0;
  /// A level-2 sleep released the engine's weights; a wake loads them again
  /// from published_dir (a finished update brings its own weights back).
  bool weights_released = false;
  /// The checkpoint directory of the weights served now: the one the server
  /// started on, then each finished update's. Empty: none (a coordinated engine).
  std::string published_dir;
  std::string loaded_dir; ///< the open session's checkpoint
  std::optional<std::map<std::string, std::string>> checker_baseline;
  static inline const char* name = "serve_control";
};

using control_ptr = caf::stateful_actor<control_state>*;

unsigned ordering_status(control_ptr self) { return self->state.ctx.settings.strict_vllm ? 500 : 409; }

response engine_failure(control_ptr self, const caf::error& err, const std::string& what,
                        const std::string& note = "") {
  auto status = ordering_error(err) ? ordering_status(self) : 500u;
  return error_envelope(status, what + ": " + error_text(self->system(), err) + note);
}

std::chrono::milliseconds deadline(control_ptr self) { return self->state.ctx.settings.engine_deadline; }

json message(const char* text) { return json{{"message", text}}; }

// -- steps shared by several routes --------------------------------------------------

/// Puts a paused or pausing engine back to running: a keep-pause, which
/// supersedes a wait-pause still in flight and is reached at once, then a
/// resume. `failed` gets why not.
void run_on(control_ptr self, std::function<void()> ok, std::function<void(std::string)> failed) {
  self->request(self->state.ctx.engine, deadline(self), pause_atom::value, pause_request{pause_mode::keep, false})
    .await(
      [self, ok, failed](pause_report&) {
        self->request(self->state.ctx.engine, deadline(self), resume_atom::value)
          .await([ok](phase_ack&) { ok(); },
                 [self, failed](caf::error& err) { failed(error_text(self->system(), err)); });
      },
      [self, failed](caf::error& err) { failed(error_text(self->system(), err)); });
}

/// A failure's answer, given a note to end its message with.
using answer_fn = std::function<response(const std::string& note)>;

/// Answers a failure after putting an engine that ran before the call back
/// to running, the message saying whether that worked.
void fail_running_as_before(control_ptr self, bool was_running, answer_fn answer, done_fn done) {
  if (!was_running)
    return done(answer(""));
  run_on(
    self, [done, answer] { done(answer("; the engine runs on as before the call")); },
    [done, answer](const std::string& why) { done(answer("; the engine could not be put back to running: " + why)); });
}

/// Pauses; `ok` gets the report and whether the engine was running before.
/// Where the pause fails (a wait-pause whose requests outlast the deadline
/// is applied at once, only its report comes late) an engine that was
/// running runs on, as if the call had not been made.
void do_pause(control_ptr self, pause_request req, std::function<void(const pause_report&, bool)> ok, done_fn fail,
              bool flat) {
  auto failed = [self, flat](const caf::error& err) -> answer_fn {
    auto text = "pause failed: " + error_text(self->system(), err);
    return [text, flat](const std::string& note) {
      return flat ? flat_error(500, text + note) : error_envelope(500, text + note);
    };
  };
  self->request(self->state.ctx.engine, deadline(self), status_atom::value)
    .await(
      [self, req, ok, fail, failed](engine_status& s) {
        const bool was_running = s.state == scheduler_state::unpaused;
        self->request(self->state.ctx.engine, self->state.ctx.settings.pause_deadline, pause_atom::value, req)
          .await([ok, was_running](pause_report& r) { ok(r, was_running); },
                 [self, fail, failed, was_running](caf::error& err) {
                   if (was_running)
                     return fail_running_as_before(self, was_running, failed(err), fail);
                   // Paused before: a wait-pause let its frozen requests run; a keep-pause freezes them again.
                   auto answer = failed(err);
                   self->request(self->state.ctx.engine, deadline(self), pause_atom::value,
                                 pause_request{pause_mode::keep, false})
                     .await([fail, answer](pause_report&) { fail(answer("; the engine stays paused")); },
                            [self, fail, answer](caf::error& again) {
                              fail(answer("; the engine could not be paused as before: "
                                          + error_text(self->system(), again)));
                            });
                 });
      },
      [fail, failed](caf::error& err) { fail(failed(err)("")); });
}

void do_resume(control_ptr self, std::function<void()> ok, done_fn fail, bool flat) {
  self->request(self->state.ctx.engine, deadline(self), resume_atom::value)
    .await(
      [self, ok](phase_ack&) {
        // A resume inside a session abandons it (the engine's "continue" of an aborted round);
        // a level-1 sleep ends with it (a level-2 one cannot: the engine refuses, holding no weights).
        auto& st = self->state;
        st.session = st.loaded = st.implicit_pause = false;
        st.sleeping = false;
        st.sleep_level = 0;
        ok();
      },
      [self, fail, flat](caf::error& err) {
        auto status = ordering_error(err) ? ordering_status(self) : 500u;
        auto text = "resume failed: " + error_text(self->system(), err);
        fail(flat ? flat_error(status, text) : error_envelope(status, text));
      });
}

/// A call ended with a session open: the session's idle timer starts again
/// (one that ran out while the call was under way is void).
void touch_session(control_ptr self) {
  auto& st = self->state;
  self->delayed_send(self, st.ctx.settings.session_idle_deadline, session_idle_atom::value, ++st.session_calls);
}

void do_start(control_ptr self, done_fn done) {
  auto& st = self->state;
  if (st.session)
    return done(error_envelope(ordering_status(self), "start_weight_update called while a weight update is already "
                                                      "active. Call finish_weight_update first."));
  self->request(st.ctx.engine, deadline(self), status_atom::value)
    .await(
      [self, done](engine_status& s) {
        auto open = [self, done, version = s.version + 1](bool implicit) {
          self->request(self->state.ctx.engine, deadline(self), start_atom::value, version)
            .await(
              [self, done, version, implicit](phase_ack&) {
                auto& st = self->state;
                st.session = true;
                st.loaded = false;
                st.implicit_pause = implicit;
                st.session_version = version;
                done(json_response(message("Weight update started")));
              },
              [self, done, implicit](caf::error& err) {
                auto answer = engine_failure(self, err, "start_weight_update failed");
                if (!implicit)
                  return done(answer);
                do_resume(self, [done, answer] { done(answer); }, [done, answer](response) { done(answer); }, false);
              });
        };
        if (s.state != scheduler_state::unpaused)
          return open(false);
        // vLLM updates weights without a pause; the engine needs one: keep
        // running requests frozen meanwhile, as the clients' own pause does.
        pause_request req{pause_mode::keep, false};
        do_pause(self, req, [open](const pause_report&, bool) { open(true); }, done, false);
      },
      [self, done](caf::error& err) { done(engine_failure(self, err, "start_weight_update failed")); });
}

/// Ends the session without publishing (a failed finish), then resumes an
/// implicit pause; answers `answer` either way.
void drop_session(control_ptr self, response answer, done_fn done) {
  self->request(self->state.ctx.engine, deadline(self), drop_atom::value)
    .await(
      [self, answer, done](phase_ack&) {
        auto& st = self->state;
        bool implicit = st.implicit_pause;
        st.session = st.loaded = st.implicit_pause = false;
        if (!implicit)
          return done(answer);
        do_resume(self, [done, answer] { done(answer); }, [done, answer](response) { done(answer); }, false);
      },
      [done, answer](caf::error&) { done(answer); });
}

void do_update(control_ptr self, const std::string& dir, done_fn done) {
  auto& st = self->state;
  if (!st.session)
    return done(error_envelope(ordering_status(self), "update_weights called without an active weight update. "
                                                      "Call start_weight_update first."));
  if (st.loaded)
    return done(error_envelope(ordering_status(self), "the disk weight transfer backend takes one checkpoint per "
                                                      "weight update; call finish_weight_update before the next"));
  if (auto problem = disk_checkpoint_problem(dir); !problem.empty())
    return done(error_envelope(500, "update_weights failed: " + problem));
  self->request(st.ctx.engine, st.ctx.settings.load_deadline, load_atom::value, dir)
    .await(
      [self, done, dir](std::uint64_t) {
        self->state.loaded = true;
        self->state.loaded_dir = dir;
        done(json_response(message("Weights updated")));
      },
      [self, done](caf::error& err) { done(engine_failure(self, err, "update_weights failed")); });
}

void do_finish(control_ptr self, std::optional<std::string> label, done_fn done) {
  auto& st = self->state;
  if (!st.session)
    return done(error_envelope(ordering_status(self), "finish_weight_update called without an active weight "
                                                      "update. Call start_weight_update first."));
  if (!st.loaded)
    return drop_session(self,
                        error_envelope(500, "finish_weight_update failed: no checkpoint was loaded in this weight "
                                            "update (update_weights {\"update_info\": {\"path\": dir}}); the "
                                            "update is dropped"),
                        done);
  auto version = st.session_version;
  self->request(st.ctx.engine, st.ctx.settings.load_deadline, finish_atom::value, version)
    .await(
      [self, done, label, version](phase_ack&) {
        auto& st = self->state;
        st.ctx.labels->set(version, label ? *label : st.ctx.labels->label_of(version - 1));
        st.published_dir = st.loaded_dir;
        st.weights_released = false; // the update brought weights back
        bool implicit = st.implicit_pause;
        st.session = st.loaded = st.implicit_pause = false;
        auto answer = json_response(message("Weight update finished"));
        if (!implicit)
          return done(answer);
        do_resume(self, [done, answer] { done(answer); }, [done, answer](response) { done(answer); }, false);
      },
      [self, done](caf::error& err) {
        drop_session(self, engine_failure(self, err, "finish_weight_update failed"), done);
      });
}

void do_sleep(control_ptr self, int level, pause_mode mode, done_fn done) {
  if (self->state.session)
    return done(error_envelope(ordering_status(self), "sleep called during a weight update; call "
                                                      "finish_weight_update first"));
  if (level == 2 && mode == pause_mode::keep && !self->state.weights_released)
    return done(error_envelope(400, "sleep level 2 frees the weights that requests frozen by mode=keep still need; "
                                    "use mode=abort or mode=wait, or level 1",
                               "query.mode"));
  pause_request req{mode, true};
  do_pause(
    self, req,
    [self, level, done](const pause_report&, bool was_running) {
      // A sleep that fails after its pause leaves the engine as it found it.
      auto failed = [self, was_running, done](caf::error& err) {
        auto answer = [self, err](const std::string& note) { return engine_failure(self, err, "sleep failed", note); };
        fail_running_as_before(self, was_running, answer, done);
      };
      self->request(self->state.ctx.engine, deadline(self), flush_atom::value)
        .await(
          [self, level, done, failed](phase_ack&) {
            auto asleep = [self, level, done] {
              self->state.sleeping = true;
              self->state.sleep_level = std::max(self->state.sleep_level, level);
              done(response{200, "application/json", "", {}});
            };
            if (level < 2 || self->state.weights_released)
              return asleep();
            // Level 2: the weights go too (their memory is freed).
            self->request(self->state.ctx.engine, deadline(self), release_atom::value)
              .await(
                [self, asleep](std::uint64_t) {
                  self->state.weights_released = true;
                  asleep();
                },
                failed);
          },
          failed);
    },
    done, false);
}

void do_wake(control_ptr self, done_fn done);

/// Wake from level 2: the weights published last, from their checkpoint
/// directory, as the version the engine held (start, load, finish), then resume.
void restore_weights(control_ptr self, done_fn done) {
  auto& st = self->state;
  const auto dir = st.published_dir;
  if (dir.empty())
    return done(error_envelope(500, "wake_up failed: no checkpoint directory of the published weights to load; "
                                    "the engine sleeps on"));
  if (auto problem = disk_checkpoint_problem(dir); !problem.empty())
    return done(error_envelope(500, "wake_up failed: the published weights cannot be loaded again (" + problem
                                      + "); the engine sleeps on: load a checkpoint with a weight update"));
  auto fail = [self, done](caf::error& err) { done(engine_failure(self, err, "wake_up failed")); };
  self->request(st.ctx.engine, deadline(self), status_atom::value)
    .await(
      [self, done, dir, fail](engine_status& s) {
        const auto version = s.version;
        self->request(self->state.ctx.engine, deadline(self), start_atom::value, version)
          .await(
            [self, done, dir, fail, version](phase_ack&) {
              self->request(self->state.ctx.engine, self->state.ctx.settings.load_deadline, load_atom::value, dir)
                .await(
                  [self, done, fail, version](std::uint64_t) {
                    self->request(self->state.ctx.engine, deadline(self), finish_atom::value, version)
                      .await(
                        [self, done](phase_ack&) {
                          self->state.weights_released = false;
                          do_wake(self, done);
                        },
                        fail);
                  },
                  [self, done](caf::error& err) {
                    // Nothing half-loaded is served: close the session, keep sleeping.
                    self->request(self->state.ctx.engine, deadline(self), drop_atom::value)
                      .await([](phase_ack&) {}, [](caf::error&) {});
                    done(engine_failure(self, err, "wake_up failed"));
                  });
            },
            fail);
      },
      fail);
}

void do_wake(control_ptr self, done_fn done) {
  if (!self->state.sleeping)
    return done(response{200, "application/json", "", {}});
  if (self->state.weights_released)
    return restore_weights(self, done);
  do_resume(
    self,
    [self, done] {
      self->state.sleeping = false;
      self->state.sleep_level = 0;
      done(response{200, "application/json", "", {}});
    },
    done, false);
}

pause_mode parse_mode(const http::request& rq, const char* fallback) {
  auto it = rq.query.find("mode");
  std::string mode = it == rq.query.end() ? fallback : it->second;
  if (mode == "abort")
    return pause_mode::abort;
  if (mode == "wait")
    return pause_mode::wait;
  if (mode == "keep")
    return pause_mode::keep;
  throw bad_request("mode must be one of abort, wait, keep; got '" + mode + "'", "query.mode");
}

// -- routes -------------------------------------------------------------------------------

void route_pause(control_ptr self, const http::request& rq, done_fn done) {
  pause_request req;
  try {
    req.mode = parse_mode(rq, "abort");
    if (rq.query.count("wait_for_inflight_requests") && http::query_bool(rq, "wait_for_inflight_requests", false))
      req.mode = pause_mode::wait; // deprecated spelling of mode=wait
    req.clear_cache = http::query_bool(rq, "clear_cache", true);
  } catch (const bad_request& e) {
    return done(flat_error(400, e.what()));
  }
  do_pause(
    self, req, [done](const pause_report&, bool) { done(json_response(json{{"status", "paused"}})); }, done, true);
}

void route_abort_requests(control_ptr self, const http::request& rq, done_fn done) {
  std::vector<std::uint64_t> ids;
  try {
    auto body = http::parse_object_body(rq.body);
    auto it = body.find("request_ids");
    if (it == body.end() || it->is_null() || (it->is_array() && it->empty())) {
      ids = self->state.ctx.requests->all();
    } else {
      if (!it->is_array())
        throw bad_request("request_ids must be a list of strings", "body.request_ids");
      for (auto& id : *it) {
        if (!id.is_string())
          throw bad_request("request_ids must be a list of strings", "body.request_ids");
        if (auto e = self->state.ctx.requests->find(id.get<std::string>()))
          ids.push_back(*e);
      }
    }
  } catch (const bad_request& e) {
    return done(flat_error(400, e.what()));
  }
  // Each engine request once, however often the body names it.
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  auto aborted = std::make_shared<std::uint32_t>(0);
  auto remaining = std::make_shared<std::size_t>(ids.size());
  if (ids.empty())
    return done(json_response(json{{"status", "aborted"}, {"aborted", 0}}));
  for (auto id : ids)
    self->request(self->state.ctx.engine, deadline(self), abort_atom::value, id)
      .await(
        [done, aborted, remaining](bool found) {
          *aborted += found ? 1 : 0;
          if (--*remaining == 0)
            done(json_response(json{{"status", "aborted"}, {"aborted", *aborted}}));
        },
        [done, aborted, remaining](caf::error&) {
          if (--*remaining == 0)
            done(json_response(json{{"status", "aborted"}, {"aborted", *aborted}}));
        });
}

void route_weight_checker(control_ptr self, const http::request& rq, done_fn done) {
  auto body = http::parse_object_body(rq.body, false);
  auto action = http::optional_string(body, "action").value_or("checksum");
  if (action != "checksum" && action != "reset" && action != "compare")
    throw bad_request("action must be one of checksum, reset, compare; got '" + action + "'", "body.action");
  std::optional<std::map<std::string, std::string>> baseline;
  if (auto b = http::optional_object(body, "baseline")) {
    baseline.emplace();
    for (auto& [k, v] : b->items()) {
      if (!v.is_string())
        throw bad_request("baseline values must be SHA-256 hex strings", "body.baseline." + k);
      (*baseline)[k] = v.get<std::string>();
    }
  }
  if (action == "reset") {
    self->state.checker_baseline.reset();
    return done(json_response(json{{"status", "reset"}}));
  }
  self->request(self->state.ctx.engine, deadline(self), sha256_atom::value)
    .await(
      [self, done, action, baseline](std::string& digests) {
        // "<worker>/<param>" -> vLLM's key "dp<rank>:pp0:pcp0:tp<worker>:<param>", for every
        // data-parallel rank: they serve one shared set, so each rank's digests are those bytes'.
        std::map<std::string, std::string> sums;
        const auto parsed = json::parse(digests); // kept alive: items() refers to it
        for (int rank = 0; rank < self->state.ctx.settings.dp; ++rank)
          for (auto& [key, hex] : parsed.items()) {
            auto slash = key.find('/');
            sums["dp" + std::to_string(rank) + ":pp0:pcp0:tp" + key.substr(0, slash) + ":" + key.substr(slash + 1)] =
              hex.get<std::string>();
          }
        if (action == "checksum") {
          self->state.checker_baseline = sums;
          return done(json_response(json{{"checksums", sums}}));
        }
        auto against = baseline ? baseline : self->state.checker_baseline;
        if (!against)
          return done(error_envelope(400, "compare needs a baseline: pass one, or call checksum first",
                                     "body.baseline"));
        std::vector<std::string> mismatches;
        for (auto& [k, v] : sums) {
          auto it = against->find(k);
          if (it == against->end() || it->second != v)
            mismatches.push_back(k);
        }
        for (auto& [k, v] : *against)
          if (!sums.count(k))
            mismatches.push_back(k);
        done(json_response(json{{"match", mismatches.empty()}, {"mismatches", mismatches}}));
      },
      [self, done](caf::error& err) { done(engine_failure(self, err, "weight_checker failed")); });
}

void route_collective_rpc(control_ptr self, const http::request& rq, done_fn done) {
  auto body = http::parse_object_body(rq.body, false);
  auto method = http::optional_string(body, "method");
  if (!method)
    throw bad_request("method is required", "body.method");
  const json* kwargs = http::optional_object(body, "kwargs");
  auto args = body.find("args");
  if (args != body.end() && !args->is_null() && !args->is_array())
    throw bad_request("args must be a list", "body.args");
  const int tp = self->state.ctx.settings.tp;
  // vLLM answers one result per worker.
  auto results = [tp](response r) {
    if (r.status != 200)
      return r;
    return json_response(json{{"results", json::array_t(static_cast<std::size_t>(tp), nullptr)}});
  };
  auto wrapped = [done, results](response r) { done(results(std::move(r))); };
  if (*method == "skyrl_start_weight_update")
    return do_start(self, wrapped);
  if (*method == "skyrl_finish_weight_update") {
    std::optional<std::string> label;
    if (kwargs)
      label = version_label(*kwargs, "weight_version", "body.kwargs");
    return do_finish(self, label, wrapped);
  }
  if (*method == "update_weights_nccl" || *method == "update_weights_ipc")
    throw bad_request("collective_rpc method '" + *method +
                          "': rlsync serve has no NCCL or IPC weight transfer; use the disk backend "
                          "(update_weights {\"update_info\": {\"path\": dir}})",
                      "body.method");
  if (*method == "skyrl_sleep_for_weight_sync")
    return do_sleep(self, 1, pause_mode::abort, wrapped);
  if (*method == "skyrl_wake_for_weight_sync")
    return do_wake(self, wrapped);
  throw bad_request("collective_rpc method '" + *method +
                        "' is not supported; rlsync serve runs skyrl_start_weight_update, "
                        "skyrl_finish_weight_update, skyrl_sleep_for_weight_sync and skyrl_wake_for_weight_sync",
                    "body.method");
}

void dispatch(control_ptr self, const http::request& rq, done_fn done) {
  auto& st = self->state;
  const auto& path = rq.path;
  const bool flat = path == "/pause" || path == "/resume" || path == "/is_paused" || path == "/abort_requests";
  if (st.ctx.settings.coordinated)
    if (auto why = coordinated_refusal(path); !why.empty())
      return done(flat ? flat_error(409, why) : error_envelope(409, why));
  if (st.engine_dead)
    return done(flat ? flat_error(500, "the engine is gone: " + st.engine_exit)
                     : error_envelope(500, "the engine is gone: " + st.engine_exit));
  try {
    if (path == "/pause")
      return route_pause(self, rq, done);
    if (path == "/resume")
      return do_resume(self, [done] { done(json_response(json{{"status", "resumed"}})); }, done, true);
    if (path == "/is_paused") {
      self->request(st.ctx.engine, deadline(self), status_atom::value)
        .await([done](engine_status& s) {
                 done(json_response(json{{"is_paused", s.state != scheduler_state::unpaused}}));
               },
               [self, done](caf::error& err) { done(flat_error(500, error_text(self->system(), err))); });
      return;
    }
    if (path == "/abort_requests")
      return route_abort_requests(self, rq, done);
    if (path == "/reset_prefix_cache") {
      http::query_bool(rq, "reset_running_requests", false);
      http::query_bool(rq, "reset_external", false);
      http::parse_object_body(rq.body); // SkyRL sends a JSON body; it must at least be an object
      self->request(st.ctx.engine, deadline(self), flush_atom::value)
        .await([done](phase_ack&) { done(json_response(json{{"success", true}})); },
               [self, done](caf::error& err) { done(engine_failure(self, err, "reset_prefix_cache failed")); });
      return;
    }
    if (path == "/init_weight_transfer_engine") {
      auto body = http::parse_object_body(rq.body, false);
      auto info = http::optional_object(body, "init_info");
      if (!info)
        throw bad_request("init_info is required ({} for the disk backend)", "body.init_info");
      if (!info->empty())
        throw bad_request("the disk weight transfer backend takes init_info {}; '" + info->begin().key() +
                              "' is not one of its fields (NCCL and IPC are not supported by rlsync serve)",
                          "body.init_info." + info->begin().key());
      return done(json_response(message("Weight transfer initialized")));
    }
    if (path == "/start_weight_update") {
      http::parse_object_body(rq.body); // {"is_checkpoint_format": true} and the like: ignored
      return do_start(self, done);
    }
    if (path == "/update_weights") {
      auto body = http::parse_object_body(rq.body, false);
      if (body.contains("weight_dir") && !body.contains("update_info"))
        throw bad_request("{\"weight_dir\": ...} is prime-rl's own route shape, which vLLM does not serve; "
                          "send start_weight_update, then update_weights {\"update_info\": {\"path\": dir}}, "
                          "then finish_weight_update",
                          "body.weight_dir");
      auto it = body.find("update_info");
      if (it == body.end() || it->is_null())
        throw bad_request("update_info is required ({\"path\": dir} for the disk backend)", "body.update_info");
      std::string dir;
      if (it->is_array()) {
        if (it->size() != 1)
          throw bad_request("the disk weight transfer backend takes one checkpoint per weight update; got a list "
                            "of " + std::to_string(it->size()),
                            "body.update_info");
        dir = disk_update_path((*it)[0], "body.update_info[0]");
      } else {
        dir = disk_update_path(*it, "body.update_info");
      }
      return do_update(self, dir, done);
    }
    if (path == "/finish_weight_update") {
      auto body = http::parse_object_body(rq.body);
      return do_finish(self, version_label(body, "weight_version", "body"), done);
    }
    if (path == "/update_weight_version") {
      auto body = http::parse_object_body(rq.body, false);
      auto label = version_label(body, "new_version", "body");
      if (!label)
        throw bad_request("new_version is required", "body.new_version");
      self->request(st.ctx.engine, deadline(self), status_atom::value)
        .await(
          [self, done, label](engine_status& s) {
            self->state.ctx.labels->set(s.version, *label);
            done(json_response(json{{"success", true}, {"new_version", *label}}));
          },
          [self, done](caf::error& err) { done(engine_failure(self, err, "update_weight_version failed")); });
      return;
    }
    if (path == "/weight_info") {
      self->request(st.ctx.engine, deadline(self), status_atom::value)
        .await(
          [self, done](engine_status& s) {
            done(json_response(json{{"weight_version", self->state.ctx.labels->label_of(s.version)}}));
          },
          [self, done](caf::error& err) { done(engine_failure(self, err, "weight_info failed")); });
      return;
    }
    if (path == "/weight_checker")
      return route_weight_checker(self, rq, done);
    if (path == "/get_world_size") {
      const bool include_dp = http::query_bool(rq, "include_dp", true);
      return done(json_response(json{{"world_size", st.ctx.settings.tp * (include_dp ? st.ctx.settings.dp : 1)}}));
    }
    if (path == "/collective_rpc")
      return route_collective_rpc(self, rq, done);
    if (path == "/sleep") {
      int level = 1;
      if (auto it = rq.query.find("level"); it != rq.query.end()) {
        if (it->second != "1" && it->second != "2")
          throw bad_request("level must be 1 or 2; got '" + it->second + "'", "query.level");
        level = it->second == "2" ? 2 : 1;
      }
      return do_sleep(self, level, parse_mode(rq, "abort"), done);
    }
    if (path == "/wake_up")
      return do_wake(self, done);
    if (path == "/is_sleeping")
      return done(json_response(json{{"is_sleeping", st.sleeping}}));
    if (path == "/v1/models")
      return done(json_response(vllm::models_list(st.ctx.settings.model_name, st.ctx.settings.max_model_len)));
    done(error_envelope(404, "no route " + rq.method + " " + path));
  } catch (const bad_request& e) {
    done(flat ? flat_error(400, e.what()) : error_envelope(400, e.what(), e.param));
  } catch (const std::exception& e) {
    done(flat ? flat_error(500, e.what()) : error_envelope(500, e.what()));
  }
}

caf::behavior serve_control(control_ptr self, serve_context ctx) {
  self->state.ctx = std::move(ctx);
  self->state.published_dir = self->state.ctx.settings.checkpoint_dir;
  self->monitor(self->state.ctx.engine);
  self->set_down_handler([self](caf::down_msg& dm) {
    if (dm.source == self->state.ctx.engine.address()) {
      self->state.engine_dead = true;
      self->state.engine_exit = self->system().render(dm.reason);
      self->state.ctx.liveness->mark_gone(self->state.engine_exit);
    }
  });
  return {
    [self](http_atom, const request_ptr& rq, std::int64_t expires_ns) -> caf::result<response> {
      // Queued behind long calls past its requester's deadline: that client
      // was already answered 500, so the call must not run after all.
      if (steady_ns() > expires_ns)
        return error_envelope(503, "the request waited past its deadline behind other control calls; not run");
      auto rp = self->make_response_promise<response>();
      // A session's own calls restart its idle timer as they end (so a
      // timer that ran out during a long load is void); other calls do not.
      const bool session_call = rq->path == "/start_weight_update" || rq->path == "/update_weights"
                                || rq->path == "/finish_weight_update" || rq->path == "/collective_rpc";
      dispatch(self, *rq, [self, rp, session_call](response r) mutable {
        if (session_call && self->state.session)
          touch_session(self);
        rp.deliver(std::move(r));
      });
      return rp;
    },
    [self](session_idle_atom, std::uint64_t calls) {
      auto& st = self->state;
      if (!st.session || calls != st.session_calls)
        return; // finished, or touched since
      const auto version = st.session_version;
      drop_session(self, response{}, [self, version](response) {
        // A drop the engine refused leaves the session open: its timer runs again.
        if (self->state.session)
          return touch_session(self);
        std::fprintf(stderr, "rlsync serve: the weight-update session of version %llu was idle for %lld ms: dropped\n",
                     static_cast<unsigned long long>(version),
                     static_cast<long long>(self->state.ctx.settings.session_idle_deadline.count()));
      });
    },
  };
}

const std::vector<std::pair<std::string, std::string>> route_table = {
  {"POST", "/pause"},
  {"POST", "/resume"},
  {"GET", "/is_paused"},
  {"POST", "/abort_requests"},
  {"POST", "/reset_prefix_cache"},
  {"POST", "/init_weight_transfer_engine"},
  {"POST", "/start_weight_update"},
  {"POST", "/update_weights"},
  {"POST", "/finish_weight_update"},
  {"POST", "/update_weight_version"},
  {"GET", "/weight_info"},
  {"POST", "/weight_checker"},
  {"GET", "/get_world_size"},
  {"POST", "/collective_rpc"},
  {"POST", "/sleep"},
  {"POST", "/wake_up"},
  {"GET", "/is_sleeping"},
  {"GET", "/health"}, // mounted apart: answered at once, from the engine's liveness
  {"GET", "/v1/models"},
};

} // namespace

const std::vector<std::pair<std::string, std::string>>& engine_route_table() { return route_table; }

caf::actor spawn_serve_control(caf::actor_system& sys, serve_context ctx) {
  return sys.spawn(serve_control, std::move(ctx));
}

void engine_liveness::mark_gone(std::string why) {
  std::lock_guard<std::mutex> lock(mu_);
  why_ = std::move(why);
}

std::optional<std::string> engine_liveness::gone() const {
  std::lock_guard<std::mutex> lock(mu_);
  return why_;
}

void mount_engine_routes(http::server& srv, caf::actor_system& sys, caf::actor control, const serve_context& ctx) {
  srv.route(
    "GET", "/health",
    [liveness = ctx.liveness](const http::request&, std::shared_ptr<http::responder> responder) {
      if (auto why = liveness->gone())
        responder->reply(error_envelope(503, "the engine is gone: " + *why));
      else
        responder->reply(response{200, "application/json", "", {}});
    },
    false);
  auto deadline = ctx.settings.request_deadline;
  for (auto& [method, path] : route_table) {
    if (path == "/health")
      continue;
    srv.route(
      method, path,
      [&sys, control, deadline](const http::request& rq, std::shared_ptr<http::responder> responder) {
        auto call = std::make_shared<const http::request>(rq);
        // One short-lived actor per request: the I/O thread never waits,
        // and a control actor that misses the deadline still gets an answer out.
        sys.spawn([control, deadline, call, responder](caf::event_based_actor* self) {
          // A control actor that dies with this request open never answers it.
          self->monitor(control);
          self->set_down_handler([self, responder](caf::down_msg& dm) {
            responder->reply(error_envelope(500, "the request failed: the server's control actor stopped ("
                                                   + self->system().render(dm.reason) + ")"));
            self->quit();
          });
          self->request(control, deadline, http_atom::value, call,
                        steady_ns() + std::chrono::nanoseconds(deadline).count())
            .then(
              [self, responder, control](response& r) {
                responder->reply(std::move(r));
                self->demonitor(control); // CAF 0.17 would keep the entry on the control actor
                self->quit();
              },
              [self, responder, control](caf::error& err) {
                responder->reply(error_envelope(500, "the request failed: " + self->system().render(err)));
                self->demonitor(control);
                self->quit();
              });
          return caf::behavior{[](int) {}};
        });
      },
      method == "POST");
  }
}

} // namespace rlsync::serve
