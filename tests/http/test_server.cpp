// The HTTP server through real sockets on loopback: routing, bounds,
// deadlines, tokens, streams, and a responder answered late or never.
#include "runtime/http/client.hpp"
#include "runtime/http/server.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

using namespace rlsync::http;
using namespace std::chrono_literals;

namespace {

// A plain socket for what a well-behaved client would never send.
struct raw_socket {
  int fd = -1;
  explicit raw_socket(std::uint16_t port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~raw_socket() {
    if (fd >= 0)
      ::close(fd);
  }
  void send_text(const std::string& s) { (void)::send(fd, s.data(), s.size(), MSG_NOSIGNAL); }
  /// Everything until the peer closes (or 5 s pass).
  std::string read_all() {
    std::string out;
    char buf[4096];
    for (;;) {
      auto n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0)
        return out;
      out.append(buf, static_cast<std::size_t>(n));
    }
  }
  /// True when the peer closed (recv returned 0 or reset) within 5 s.
  bool closed_by_peer() {
    char buf[4096];
    for (;;) {
      auto n = ::recv(fd, buf, sizeof buf, 0);
      if (n == 0)
        return true;
      if (n < 0)
        return errno == ECONNRESET;
    }
  }
};

response text(const std::string& body) { return {200, "application/json", body, {}}; }

server_options fast_options() {
  server_options o;
  o.request_read_deadline = 400ms;
  o.idle_deadline = 400ms;
  o.write_deadline = 2s;
  return o;
}

} // namespace

TEST_CASE("server: routes answer with Content-Length and keep the connection alive") {
  server srv(fast_options());
  srv.route("GET", "/hello", [](const request& rq, std::shared_ptr<responder> r) {
    r->reply(text("{\"q\": \"" + (rq.query.count("name") ? rq.query.at("name") : "") + "\", \"m\": \"" + rq.method +
                  "\", \"ua\": \"" + (rq.headers.count("user-agent") ? rq.headers.at("user-agent") : "") + "\"}"));
  });
  srv.route("POST", "/echo", [](const request& rq, std::shared_ptr<responder> r) { r->reply(text(rq.body)); });
  srv.route("POST", "/empty", [](const request&, std::shared_ptr<responder> r) { r->reply(text("")); });
  auto port = srv.start();
  REQUIRE(port != 0);
  client c("127.0.0.1", port, 2s);
  auto a = c.send({"GET", "/hello?name=a%20b+c", "", "application/json", {}});
  CHECK(a.status == 200);
  CHECK(a.body == R"({"q": "a b c", "m": "GET", "ua": "rlsync"})");
  CHECK(a.headers.at("content-length") == std::to_string(a.body.size()));
  auto b = c.send({"POST", "/echo", "{\"x\": 1}", "application/json", {}});
  CHECK(b.body == "{\"x\": 1}");
  auto e = c.send({"POST", "/empty", "", "application/json", {}});
  CHECK(e.status == 200);
  CHECK(e.headers.at("content-length") == "0");
  CHECK(srv.connections() == 1); // one kept-alive connection served all three
}

TEST_CASE("server: unknown path 404, wrong method 405, malformed query 400") {
  server srv(fast_options());
  srv.route("POST", "/pause", [](const request&, std::shared_ptr<responder> r) { r->reply(text("{}")); });
  auto port = srv.start();
  client c("127.0.0.1", port, 2s);
  auto nf = c.send({"GET", "/nope", "", "application/json", {}});
  CHECK(nf.status == 404);
  CHECK(nf.body == R"({"detail": "Not Found"})");
  auto na = c.send({"GET", "/pause", "", "application/json", {}});
  CHECK(na.status == 405);
  CHECK(na.headers.at("allow") == "POST");
  auto bad = c.send({"POST", "/pause?mode=%zz", "", "application/json", {}});
  CHECK(bad.status == 400);
}

TEST_CASE("server: the bearer token guards the routes that need it") {
  auto o = fast_options();
  o.bearer_token = "s3cret";
  server srv(o);
  srv.route("POST", "/pause", [](const request&, std::shared_ptr<responder> r) { r->reply(text("{}")); });
  srv.route("GET", "/health", [](const request&, std::shared_ptr<responder> r) { r->reply(text("")); }, false);
  auto port = srv.start();
  client c("127.0.0.1", port, 2s);
  CHECK(c.send({"POST", "/pause", "", "application/json", {}}).status == 401);
  CHECK(c.send({"POST", "/pause", "", "application/json", {{"Authorization", "Bearer wrong"}}}).status == 401);
  CHECK(c.send({"POST", "/pause", "", "application/json", {{"Authorization", "Bearer s3cre"}}}).status == 401);
  CHECK(c.send({"POST", "/pause", "", "application/json", {{"Authorization", "s3cret"}}}).status == 401);
  CHECK(c.send({"POST", "/pause", "", "application/json", {{"Authorization", "Bearer s3cret"}}}).status == 200);
  CHECK(c.send({"GET", "/health", "", "application/json", {}}).status == 200);
}

TEST_CASE("server: an over-size body is refused with 413, over-size headers with 431") {
  auto o = fast_options();
  o.max_body_bytes = 1024;
  o.max_header_bytes = 2048;
  server srv(o);
  std::atomic<int> calls{0};
  srv.route("POST", "/echo", [&](const request& rq, std::shared_ptr<responder> r) {
    ++calls;
    r->reply(text(rq.body));
  });
  auto port = srv.start();
  client c("127.0.0.1", port, 2s);
  CHECK(c.send({"POST", "/echo", std::string(1024, 'x'), "text/plain", {}}).status == 200);
  CHECK(c.send({"POST", "/echo", std::string(1025, 'x'), "text/plain", {}}).status == 413);
  CHECK(c.send({"POST", "/echo", "", "text/plain", {{"X-Big", std::string(4096, 'h')}}}).status == 431);
  // A declared length over the bound is refused before the body arrives.
  raw_socket s(port);
  s.send_text("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n");
  CHECK(s.read_all().rfind("HTTP/1.1 413", 0) == 0);
  CHECK(calls == 1);
}

TEST_CASE("server: a slow client is cut at the read deadline, an idle one at the idle deadline") {
  server srv(fast_options());
  srv.route("GET", "/x", [](const request&, std::shared_ptr<responder> r) { r->reply(text("{}")); });
  auto port = srv.start();
  {
    raw_socket slow(port);
    auto t0 = std::chrono::steady_clock::now();
    slow.send_text("GET /x HTTP/1.1\r\nHost: x\r\n"); // never finishes its header
    std::this_thread::sleep_for(200ms);
    slow.send_text("X-Drip: 1\r\n");
    CHECK(slow.closed_by_peer());
    auto took = std::chrono::steady_clock::now() - t0;
    CHECK(took >= 350ms);
    CHECK(took < 3s);
  }
  {
    raw_socket idle(port);
    idle.send_text("GET /x HTTP/1.1\r\nHost: x\r\n\r\n");
    auto t0 = std::chrono::steady_clock::now();
    CHECK(idle.closed_by_peer()); // the answer, then closed after the idle deadline
    CHECK(std::chrono::steady_clock::now() - t0 < 3s);
  }
  client c("127.0.0.1", port, 2s);
  CHECK(c.send({"GET", "/x", "", "application/json", {}}).status == 200);
}

TEST_CASE("server: connections over the bound are refused with 503, the server keeps serving") {
  auto o = fast_options();
  o.max_connections = 3;
  o.request_read_deadline = 5s;
  server srv(o);
  srv.route("GET", "/x", [](const request&, std::shared_ptr<responder> r) { r->reply(text("{}")); });
  auto port = srv.start();
  {
    std::vector<std::unique_ptr<raw_socket>> held;
    for (int i = 0; i < 3; ++i)
      held.push_back(std::make_unique<raw_socket>(port));
    for (int i = 0; i < 50 && srv.connections() < 3; ++i)
      std::this_thread::sleep_for(10ms);
    REQUIRE(srv.connections() == 3);
    raw_socket extra(port);
    const std::string answer = extra.read_all();
    CHECK(answer.rfind("HTTP/1.1 503", 0) == 0);
    // Whole, as its Content-Length says: a client reads a 503, not a broken answer.
    const std::string body = "{\"detail\": \"Too many connections\"}";
    CHECK(answer.find("Content-Length: " + std::to_string(body.size()) + "\r\n") != std::string::npos);
    CHECK(answer.size() >= body.size());
    CHECK(answer.compare(answer.size() - body.size(), body.size(), body) == 0);
  }
  for (int i = 0; i < 100 && srv.connections() > 0; ++i)
    std::this_thread::sleep_for(10ms);
  CHECK(srv.connections() == 0);
  CHECK(request_once("127.0.0.1", port, {"GET", "/x", "", "application/json", {}}, 2s).status == 200);
}

TEST_CASE("server: out of file descriptors, accepts are retried after a pause, and the connection is served later") {
  server srv(fast_options());
  srv.route("GET", "/x", [](const request&, std::shared_ptr<responder> r) { r->reply(text("{}")); });
  auto port = srv.start();
  rlimit was{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &was) == 0);
  // The lowest free descriptor is the client's; none is left for the accept.
  const int probe = ::dup(0);
  REQUIRE(probe >= 0);
  ::close(probe);
  rlimit tight = was;
  tight.rlim_cur = static_cast<rlim_t>(probe) + 1;
  REQUIRE(setrlimit(RLIMIT_NOFILE, &tight) == 0);
  std::unique_ptr<raw_socket> client;
  try {
    client = std::make_unique<raw_socket>(port); // connected: it waits in the backlog
  } catch (...) {
    setrlimit(RLIMIT_NOFILE, &was);
    throw;
  }
  std::this_thread::sleep_for(500ms);
  const auto failures = srv.accept_failures();
  REQUIRE(setrlimit(RLIMIT_NOFILE, &was) == 0);
  // A failure, then one every 100 ms: a handful, not a core spinning.
  CHECK(failures >= 1);
  CHECK(failures <= 10);
  for (int i = 0; i < 100 && srv.connections() == 0; ++i)
    std::this_thread::sleep_for(10ms);
  CHECK(srv.connections() == 1);
  CHECK(request_once("127.0.0.1", port, {"GET", "/x", "", "application/json", {}}, 2s).status == 200);
}

TEST_CASE("server: one address holds at most its own bound of connections") {
  auto o = fast_options();
  o.max_connections_per_address = 2;
  o.request_read_deadline = 5s;
  server srv(o);
  srv.route("GET", "/x", [](const request&, std::shared_ptr<responder> r) { r->reply(text("{}")); });
  auto port = srv.start();
  {
    std::vector<std::unique_ptr<raw_socket>> held;
    for (int i = 0; i < 2; ++i)
      held.push_back(std::make_unique<raw_socket>(port));
    for (int i = 0; i < 50 && srv.connections() < 2; ++i)
      std::this_thread::sleep_for(10ms);
    REQUIRE(srv.connections() == 2);
    raw_socket extra(port); // every client here is 127.0.0.1
    CHECK(extra.read_all().rfind("HTTP/1.1 503", 0) == 0);
    CHECK(srv.connections() == 2);
  }
  for (int i = 0; i < 100 && srv.connections() > 0; ++i)
    std::this_thread::sleep_for(10ms);
  CHECK(request_once("127.0.0.1", port, {"GET", "/x", "", "application/json", {}}, 2s).status == 200);
}

TEST_CASE("server: garbage gets 400 and the server keeps serving") {
  server srv(fast_options());
  srv.route("GET", "/x", [](const request&, std::shared_ptr<responder> r) { r->reply(text("{}")); });
  auto port = srv.start();
  for (const char* junk : {"\x16\x03\x01\x02\x00\x01\x00\r\n\r\n", "GET\r\n\r\n", "HELLO WORLD\r\n\r\n",
                           "GET /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n"}) {
    raw_socket s(port);
    s.send_text(junk);
    auto answer = s.read_all();
    CAPTURE(junk);
    CHECK((answer.empty() || answer.rfind("HTTP/1.1 400", 0) == 0));
  }
  CHECK(request_once("127.0.0.1", port, {"GET", "/x", "", "application/json", {}}, 2s).status == 200);
}

TEST_CASE("server: answers from another thread, and a dropped responder answers 500") {
  server srv(fast_options());
  std::vector<std::thread> workers;
  std::mutex mu;
  srv.route("GET", "/late", [&](const request&, std::shared_ptr<responder> r) {
    std::lock_guard<std::mutex> lock(mu);
    workers.emplace_back([r] {
      std::this_thread::sleep_for(50ms);
      r->reply(text("{\"late\": true}"));
      CHECK_FALSE(r->reply(text("{}"))); // once only
    });
  });
  srv.route("GET", "/dropped", [](const request&, std::shared_ptr<responder>) {});
  srv.route("GET", "/throws", [](const request&, std::shared_ptr<responder>) { throw std::runtime_error("boom"); });
  auto port = srv.start();
  client c("127.0.0.1", port, 2s);
  CHECK(c.send({"GET", "/late", "", "application/json", {}}).body == "{\"late\": true}");
  auto dropped = c.send({"GET", "/dropped", "", "application/json", {}});
  CHECK(dropped.status == 500);
  CHECK(dropped.body.find("\"error\"") != std::string::npos);
  CHECK(c.send({"GET", "/throws", "", "application/json", {}}).status == 500);
  CHECK(c.send({"GET", "/late", "", "application/json", {}}).status == 200);
  std::lock_guard<std::mutex> lock(mu);
  for (auto& w : workers)
    w.join();
}

TEST_CASE("server: a stream is chunked, read event by event, and the connection is reused after it") {
  server srv(fast_options());
  std::vector<std::thread> workers;
  srv.route("POST", "/stream", [&](const request&, std::shared_ptr<responder> r) {
    workers.emplace_back([r] {
      r->start_stream("text/event-stream");
      for (int i = 0; i < 5; ++i)
        CHECK(r->write("data: {\"i\": " + std::to_string(i) + "}\n\n"));
      r->write("data: [DONE]\n\n");
      r->finish();
      CHECK_FALSE(r->write("data: late\n\n"));
    });
  });
  srv.route("GET", "/x", [](const request&, std::shared_ptr<responder> r) { r->reply(text("{}")); });
  auto port = srv.start();
  client c("127.0.0.1", port, 2s);
  auto head = c.open_stream({"POST", "/stream", "{}", "application/json", {}});
  CHECK(head.status == 200);
  CHECK(head.headers.at("content-type") == "text/event-stream");
  CHECK(head.headers.at("transfer-encoding") == "chunked");
  CHECK(head.headers.count("content-length") == 0);
  std::vector<std::string> events;
  while (auto e = c.next_event())
    events.push_back(*e);
  REQUIRE(events.size() == 6);
  CHECK(events[0] == "{\"i\": 0}");
  CHECK(events[5] == "[DONE]");
  CHECK(c.send({"GET", "/x", "", "application/json", {}}).status == 200);
  CHECK(srv.connections() == 1);
  for (auto& w : workers)
    w.join();
}

TEST_CASE("client: a stream that never ends its event is refused at the bound, not held in memory") {
  auto o = fast_options();
  o.max_stream_queue_bytes = 2 * client::max_event_bytes; // the server queues it all: the client must refuse it
  server srv(o);
  std::vector<std::thread> workers;
  srv.route("POST", "/stream", [&](const request&, std::shared_ptr<responder> r) {
    workers.emplace_back([r] {
      r->start_stream("text/event-stream");
      r->write("data: ");
      const std::string chunk(1 << 20, 'x');
      // One event past the client's bound; the client's leaving refuses the rest.
      for (std::size_t sent = 0; sent <= client::max_event_bytes && r->write(chunk);)
        sent += chunk.size();
      r->finish();
    });
  });
  auto port = srv.start();
  client c("127.0.0.1", port, 5s);
  CHECK(c.open_stream({"POST", "/stream", "{}", "application/json", {}}).status == 200);
  CHECK_THROWS_WITH_AS(c.next_event(), doctest::Contains("without the blank line that ends an event"), client_error);
  CHECK_FALSE(c.next_event()); // the stream is closed
  for (auto& w : workers)
    w.join();
}

TEST_CASE("client: comments do not extend the wait for an event, and a stop ends the wait between reads") {
  server srv(fast_options());
  std::vector<std::thread> workers;
  std::atomic<bool> done{false};
  srv.route("POST", "/stream", [&](const request&, std::shared_ptr<responder> r) {
    workers.emplace_back([r, &done] {
      r->start_stream("text/event-stream");
      // A keep-alive comment every 50 ms and never an event.
      while (!done && !r->client_gone() && r->write(": ping\n\n"))
        std::this_thread::sleep_for(50ms);
      r->finish();
    });
  });
  // A server that sends nothing at all.
  srv.route("POST", "/silent", [&](const request&, std::shared_ptr<responder> r) {
    r->start_stream("text/event-stream");
    workers.emplace_back([r, &done] {
      while (!done && !r->client_gone())
        std::this_thread::sleep_for(20ms);
      r->finish();
    });
  });
  auto port = srv.start();
  {
    client c("127.0.0.1", port, 400ms);
    REQUIRE(c.open_stream({"POST", "/stream", "{}", "application/json", {}}).status == 200);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(c.next_event(), doctest::Contains("no event within 400 ms"), client_error);
    CHECK(std::chrono::steady_clock::now() - t0 < 5s); // before the fix: never, while the comments came
  }
  {
    client c("127.0.0.1", port, 30s);
    REQUIRE(c.open_stream({"POST", "/stream", "{}", "application/json", {}}).status == 200);
    int asked = 0;
    CHECK_FALSE(c.next_event([&] { return ++asked > 3; })); // asked before each read: the fourth read is not made
    CHECK(asked == 4);
  }
  {
    // The silent server: a stop ends the wait inside the read, long before
    // the deadline (a cancelled vLLM stream frees its worker now, not after
    // stream_idle_ms).
    client c("127.0.0.1", port, 60s);
    REQUIRE(c.open_stream({"POST", "/silent", "{}", "application/json", {}}).status == 200);
    std::atomic<bool> cancel{false};
    std::thread canceller([&] {
      std::this_thread::sleep_for(200ms);
      cancel = true;
    });
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_FALSE(c.next_event([&] { return cancel.load(); }));
    CHECK(std::chrono::steady_clock::now() - t0 < 20s); // before the fix: the full 60 s
    canceller.join();
  }
  done = true;
  for (auto& w : workers)
    w.join();
}

TEST_CASE("client: an answer over the client's bound is an error, not read into memory") {
  server srv(fast_options());
  srv.route("GET", "/big", [](const request&, std::shared_ptr<responder> r) {
    r->reply({500, "application/json", std::string(2 << 20, '['), {}});
  });
  auto port = srv.start();
  client c("127.0.0.1", port, 5s);
  c.set_max_answer_bytes(1 << 20);
  CHECK_THROWS_WITH_AS(c.send({"GET", "/big", "", "application/json", {}}),
                       doctest::Contains("no answer to GET /big: a body over 1048576 bytes"),
                       client_error);
  c.set_max_answer_bytes(4 << 20);
  CHECK(c.send({"GET", "/big", "", "application/json", {}}).body.size() == std::size_t(2 << 20));
}

TEST_CASE("client: a host name is looked up within the call's deadline, and abandoned lookups are bounded") {
  server srv(fast_options());
  srv.route("GET", "/hello", [](const request&, std::shared_ptr<responder> r) { r->reply(text("hi")); });
  auto port = srv.start();
  const client_request hello{"GET", "/hello", "", "application/json", {}};
  CHECK(client("localhost", port, 5s).send(hello).body == "hi");
  // Calls that wait for their lookups are not capped, only abandoned lookups
  // are: twice the cap, all looking up at once (each held until all started).
  {
    std::atomic<int> started{0};
    detail::set_lookup_hook([&started](const std::string&) {
      ++started;
      for (int i = 0; i < 500 && started.load() < 2 * detail::max_lookups_in_flight; ++i)
        std::this_thread::sleep_for(10ms);
    });
    std::vector<std::thread> callers;
    std::atomic<int> answered{0};
    for (int i = 0; i < 2 * detail::max_lookups_in_flight; ++i)
      callers.emplace_back([&] {
        if (client("localhost", port, 10s).send(hello).body == "hi")
          ++answered;
      });
    for (auto& c : callers)
      c.join();
    detail::set_lookup_hook({});
    CHECK(started == 2 * detail::max_lookups_in_flight);
    CHECK(answered == 2 * detail::max_lookups_in_flight);
  }
  CHECK(detail::lookups_abandoned() == 0);

  // A resolver that does not answer: each call fails at its own deadline.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  detail::set_lookup_hook([released](const std::string&) { released.wait_for(20s); });
  for (int i = 0; i < detail::max_lookups_in_flight; ++i)
    CHECK_THROWS_WITH_AS(client("localhost", port, 50ms).send(hello),
                         doctest::Contains("cannot resolve localhost: the system's resolver did not answer within"),
                         client_error);
  CHECK(detail::lookups_abandoned() == detail::max_lookups_in_flight);
  // The held lookups are bounded: the next call by name is refused at once.
  CHECK_THROWS_WITH_AS(client("localhost", port, 5s).send(hello),
                       doctest::Contains("16 earlier lookups are still unanswered past their calls' deadlines"), client_error);
  // An address needs no lookup.
  CHECK(client("127.0.0.1", port, 5s).send(hello).body == "hi");

  release.set_value();
  detail::set_lookup_hook({});
  for (int i = 0; i < 2000 && detail::lookups_abandoned() > 0; ++i)
    std::this_thread::sleep_for(10ms);
  CHECK(detail::lookups_abandoned() == 0);
  CHECK(client("localhost", port, 5s).send(hello).body == "hi");

  // Callers that all still wait are bounded too: at most max_lookups_running at once.
  std::promise<void> unblock;
  std::shared_future<void> unblocked = unblock.get_future().share();
  std::atomic<int> held{0};
  detail::set_lookup_hook([&held, unblocked](const std::string&) {
    ++held;
    unblocked.wait_for(20s);
  });
  std::vector<std::thread> waiting;
  std::atomic<int> refused{0};
  for (int i = 0; i < detail::max_lookups_running; ++i)
    waiting.emplace_back([&] {
      try {
        client("localhost", port, 30s).send(hello);
      } catch (const client_error&) {
        ++refused;
      }
    });
  for (int i = 0; i < 2000 && held.load() < detail::max_lookups_running; ++i)
    std::this_thread::sleep_for(10ms);
  CHECK(held.load() == detail::max_lookups_running);
  CHECK_THROWS_WITH_AS(client("localhost", port, 5s).send(hello),
                       doctest::Contains("256 lookups are running already"), client_error);
  unblock.set_value();
  for (auto& t : waiting)
    t.join();
  detail::set_lookup_hook({});
  CHECK(refused == 0);
}

TEST_CASE("client: a refused stream returns its status and error body, and the connection is reused") {
  server srv(fast_options());
  srv.route("POST", "/stream", [](const request& rq, std::shared_ptr<responder> r) {
    if (rq.body == "big")
      r->reply({400, "application/json", std::string(client::max_error_body_bytes + 1, 'x'), {}});
    else
      r->reply({400, "application/json", R"({"error": {"message": "body.n: must be in 1..64"}})", {}});
  });
  srv.route("GET", "/x", [](const request&, std::shared_ptr<responder> r) { r->reply(text("{}")); });
  auto port = srv.start();
  client c("127.0.0.1", port, 2s);
  auto head = c.open_stream({"POST", "/stream", "{}", "application/json", {}});
  CHECK(head.status == 400);
  CHECK(head.body == R"({"error": {"message": "body.n: must be in 1..64"}})");
  CHECK_FALSE(c.next_event()); // no events follow a refusal
  CHECK(c.send({"GET", "/x", "", "application/json", {}}).status == 200);
  CHECK(srv.connections() == 1);
  // An error body past the bound is not read into memory.
  CHECK_THROWS_WITH_AS(c.open_stream({"POST", "/stream", "big", "application/json", {}}),
                       doctest::Contains("HTTP 400 with a body of 1048577 bytes, over 1048576"), client_error);
  CHECK(c.send({"GET", "/x", "", "application/json", {}}).status == 200); // on a new connection
}

/// A stream whose client reads nothing, written to until its queue (64
/// KiB) refuses a chunk.
struct flooded_stream {
  std::promise<std::shared_ptr<responder>> got; // before the server, which outlives no route's target
  server srv{[] {
    auto o = fast_options();
    o.max_stream_queue_bytes = 64 << 10;
    return o;
  }()};
  std::unique_ptr<raw_socket> client;
  std::shared_ptr<responder> r;
  bool refused = false;

  flooded_stream() {
    srv.route("POST", "/stream", [this](const request&, std::shared_ptr<responder> rr) {
      rr->start_stream("text/event-stream");
      got.set_value(rr);
    });
    client = std::make_unique<raw_socket>(srv.start());
    client->send_text("POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    r = got.get_future().get();
    const std::string chunk(8 << 10, 'x');
    for (int i = 0; i < 100000 && !refused; ++i)
      refused = !r->write(chunk);
  }
};

TEST_CASE("server: writes to a stream whose client left return false, the bounded queue refuses floods") {
  flooded_stream f;
  auto& r = f.r;
  CHECK(f.refused);
  f.client.reset(); // the client leaves
  bool gone = false;
  for (int i = 0; i < 300 && !gone; ++i) {
    std::this_thread::sleep_for(10ms);
    gone = r->client_gone() || !r->write("data: x\n\n") ;
    if (gone)
      gone = r->client_gone();
  }
  CHECK(gone);
  CHECK_FALSE(r->write("data: x\n\n"));
}

TEST_CASE("server: a stream whose queue overflowed is cut: nothing after the lost chunk, and no end") {
  flooded_stream f;
  auto& r = f.r;
  REQUIRE(f.refused);
  // The client now reads what it can, until the server closes.
  std::string answer;
  std::thread reader([&] { answer = f.client->read_all(); });
  std::this_thread::sleep_for(300ms); // the queue drains, unless the stream is cut
  // However small, and however empty the queue got, nothing more goes.
  CHECK_FALSE(r->write("data: after the hole\n\n"));
  r->finish();
  reader.join();
  CHECK(answer.find("after the hole") == std::string::npos);
  CHECK(answer.find("\r\n0\r\n\r\n") == std::string::npos); // no last chunk: the client sees it broken
  CHECK(r->client_gone());
}

TEST_CASE("server: a client that hangs up while its request is answered shows as gone before the answer") {
  server srv(fast_options());
  std::promise<std::shared_ptr<responder>> got;
  srv.route("POST", "/slow", [&](const request&, std::shared_ptr<responder> r) { got.set_value(r); });
  auto port = srv.start();
  auto s = std::make_unique<raw_socket>(port);
  s->send_text("POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
  auto r = got.get_future().get();
  CHECK_FALSE(r->client_gone()); // still there, waiting
  s.reset();                     // hangs up without reading
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    std::this_thread::sleep_for(10ms);
    gone = r->client_gone();
  }
  CHECK(gone);
  CHECK_FALSE(r->reply(text("{}"))); // nobody to answer
}

TEST_CASE("server: a waiting client that pipelines its next request is not taken for gone") {
  server srv(fast_options());
  std::promise<std::shared_ptr<responder>> got;
  std::atomic<int> calls{0};
  srv.route("POST", "/slow", [&](const request&, std::shared_ptr<responder> r) {
    if (calls++ == 0)
      got.set_value(r);
    else
      r->reply(text("{\"second\": true}"));
  });
  auto port = srv.start();
  raw_socket s(port);
  s.send_text("POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
  auto r = got.get_future().get();
  s.send_text("POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  std::this_thread::sleep_for(100ms);
  CHECK_FALSE(r->client_gone());
  CHECK(r->reply(text("{\"first\": true}")));
  auto both = s.read_all();
  CHECK(both.find("{\"first\": true}") != std::string::npos);
  CHECK(both.find("{\"second\": true}") != std::string::npos);
}

TEST_CASE("url_decode and parse_query") {
  CHECK(url_decode("a%2Fb+c") == "a/b c");
  CHECK_FALSE(url_decode("%2"));
  CHECK_FALSE(url_decode("%zz"));
  auto q = parse_query("mode=keep&clear_cache=False&&flag&x=%3D");
  REQUIRE(q);
  CHECK(q->at("mode") == "keep");
  CHECK(q->at("clear_cache") == "False");
  CHECK(q->at("flag") == "");
  CHECK(q->at("x") == "=");
}
