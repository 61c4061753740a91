#include "actors/vllm_server_calls.hpp"

#include "runtime/base/json.hpp"
#include "runtime/base/printable.hpp"
#include "runtime/vllm/remote_engine.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <thread>

namespace rlsync::vllm_calls {

using clock_type = std::chrono::steady_clock;
using nlohmann::json;

http::client_response server_conn::call(ms deadline, const std::string& method, const std::string& target,
                                        const std::string& body) const {
  if (deadline.count() <= 0)
    throw http::client_error(method + " " + target + ": no time left before the phase's deadline");
  http::client c(host, port, deadline);
  c.set_max_answer_bytes(max_answer_bytes);
  if (!token.empty())
    c.set_default_header("Authorization", "Bearer " + token);
  http::client_request rq;
  rq.method = method;
  rq.target = target;
  rq.body = body;
  return c.send(rq);
}

json parse_answer(const std::string& body) {
  // Bounded as the body is: a lying server's nesting or millions of tiny
  // values cost memory far beyond their bytes.
  try {
    return read_json_strict(body, json_read_limits{8, max_answer_values});
  } catch (const json_read_error&) {
    return json::value_t::discarded;
  }
}

std::string http_failure(const std::string& call, const http::client_response& r) {
  std::string message;
  auto j = parse_answer(r.body);
  if (!j.is_discarded() && j.is_object()) {
    if (auto e = j.find("error"); e != j.end()) {
      if (e->is_string())
        message = e->get<std::string>();
      else if (e->is_object() && e->contains("message") && (*e)["message"].is_string())
        message = (*e)["message"].get<std::string>();
    } else if (auto d = j.find("detail"); d != j.end()) {
      message = d->is_string() ? d->get<std::string>() : d->dump();
    }
  }
  if (message.empty())
    message = r.body;
  // The server's text, escaped and cut: it reaches logs and terminals.
  message = printable(message, 300);
  return call + ": HTTP " + std::to_string(r.status) + (message.empty() ? "" : ": " + message);
}

void run_stream(caf::blocking_actor* w, caf::actor_addr engine, server_conn conn, std::uint64_t stream,
                std::string body, std::shared_ptr<std::atomic<bool>> cancel,
                std::shared_ptr<std::atomic<bool>> stopped, ms idle) {
  auto send = [&](std::shared_ptr<vllm_stream_update> u) {
    if (auto e = caf::actor_cast<vllm_engine_impl>(engine))
      w->send(e, vllm_stream_atom::value, std::move(u));
  };
  std::string error;
  int refused_with = 0;
  bool relayed = false; // a chunk of tokens went to the engine
  try {
    http::client c(conn.host, conn.port, idle);
    if (!conn.token.empty())
      c.set_default_header("Authorization", "Bearer " + conn.token);
    http::client_request rq;
    rq.method = "POST";
    rq.target = "/v1/completions";
    rq.body = std::move(body);
    auto head = c.open_stream(rq);
    if (head.status != 200) {
      refused_with = head.status;
      throw std::runtime_error(http_failure("POST /v1/completions", head));
    }
    bool finished = false, done = false;
    const auto stop = [&] { return cancel->load() || stopped->load(); };
    while (!stop()) {
      auto event = c.next_event(stop);
      if (!event)
        break;
      if (*event == "[DONE]") {
        done = true;
        break;
      }
      auto chunk = vllm::parse_completion_chunk(*event);
      if (chunk.usage_only)
        continue;
      if (finished)
        throw std::runtime_error("a chunk after the choice finished");
      auto u = std::make_shared<vllm_stream_update>();
      u->stream = stream;
      u->completion_id = chunk.id;
      u->tokens = std::move(chunk.token_ids);
      u->logprobs = std::move(chunk.logprobs);
      u->top = std::move(chunk.top);
      u->finish = chunk.finish;
      u->spans = std::move(chunk.weight_versions);
      finished = chunk.finish.has_value();
      relayed = relayed || !u->tokens.empty();
      send(std::move(u));
    }
    if (!cancel->load() && !finished)
      error = done ? "the stream ended without a finish reason"
                   : "the stream ended before the request finished (the server closed it or is gone)";
  } catch (const vllm::stream_error_event& e) {
    // Before any token, an error event is a refusal sent after answering
    // 200; after some, the server failed while generating (vLLM reports an
    // engine that died mid-stream as 400 too): the server's fault.
    error = e.what();
    if (!relayed)
      refused_with = e.status;
  } catch (const std::exception& e) {
    error = e.what();
  }
  auto last = std::make_shared<vllm_stream_update>();
  last->stream = stream;
  last->error = cancel->load() ? std::string{} : error;
  last->refused_with = refused_with;
  last->ended = true;
  send(std::move(last));
}

void run_health(caf::blocking_actor* w, caf::actor_addr engine, server_conn conn, ms interval, ms timeout,
                std::shared_ptr<std::atomic<bool>> stopped) {
  while (!stopped->load()) {
    auto r = std::make_shared<vllm_health_report>();
    r->started = clock_type::now();
    try {
      auto h = conn.call(timeout, "GET", "/health");
      if (h.status != 200) {
        r->why = http_failure("GET /health", h);
      } else {
        r->healthy = true;
        auto info = conn.call(timeout, "GET", "/weight_info");
        auto j = parse_answer(info.body);
        if (info.status == 200 && j.is_object() && j.contains("weight_version") && j["weight_version"].is_string())
          r->label = j["weight_version"].get<std::string>().substr(0, max_name_bytes);
      }
    } catch (const std::exception& e) {
      r->healthy = false;
      r->why = e.what();
    }
    auto e = caf::actor_cast<vllm_engine_impl>(engine);
    if (!e)
      return;
    w->send(e, vllm_health_atom::value, std::move(r));
    e = nullptr;
    for (auto until = clock_type::now() + interval; clock_type::now() < until && !stopped->load();)
      std::this_thread::sleep_for(std::min<ms>(ms(20), interval));
  }
}

} // namespace rlsync::vllm_calls
