// Mutual TLS between nodes: the file checks done before CAF sees the files
// (one table row per refusal), `certs make` (files, modes, a chain that
// verifies, no silent overwrite), and real actor systems in this process
// talking over CAF's openssl module: certificates of the cluster's CA
// connect, another CA's or none do not, and a head published over TLS stops
// cleanly and closes its port.
#include "actors/assembly/head_node.hpp"
#include "actors/assembly/member_node.hpp"
#include "actors/certs.hpp"
#include "actors/gatekeeper.hpp"
#include "runtime/base/version.hpp"
#include "actors/system_config.hpp"
#include "actors/tls.hpp"
#include "runtime/config/topology.hpp"
#include "tests/support/impostor_gate.hpp"
#include "tests/support/scratch_dir.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/scoped_actor.hpp>

#include <doctest/doctest.h>

#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>

using namespace rlsync;
namespace fs = std::filesystem;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

mode_t mode_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

/// `key_pem` (a PEM private key) encrypted with a passphrase, as PEM.
std::string encrypted_key(const std::string& key_pem) {
  BIO* in = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(in, nullptr, nullptr, nullptr);
  BIO_free(in);
  REQUIRE(key != nullptr);
  BIO* out = BIO_new(BIO_s_mem());
  static char pass[] = "passphrase";
  REQUIRE(PEM_write_bio_PrivateKey(out, key, EVP_aes_256_cbc(), nullptr, 0, nullptr, pass) == 1);
  EVP_PKEY_free(key);
  char* data = nullptr;
  long n = BIO_get_mem_data(out, &data);
  std::string text(data, static_cast<std::size_t>(n));
  BIO_free(out);
  return text;
}

/// Two clusters' credentials in one scratch dir: `ours/` (nodes head, w1,
/// w2) and `theirs/` (node w1, another CA).
struct two_cas {
  test::scratch_dir dir;
  std::string ours = dir / "ours", theirs = dir / "theirs";
  two_cas() {
    make_certs({ours, {"head", "w1", "w2"}, 30, false});
    make_certs({theirs, {"w1"}, 30, false});
  }
  tls_spec node(const std::string& cluster, const std::string& name) const {
    return {cluster + "/ca.pem", cluster + "/" + name + ".pem", cluster + "/" + name + ".key"};
  }
};

/// An actor system of its own, TLS as given (nothing: no openssl module;
/// anonymous: the module without any file, as an outsider would run it).
std::unique_ptr<system_config> tls_config(const std::optional<tls_spec>& tls, bool anonymous = false) {
  auto cfg = std::make_unique<system_config>();
  cfg->set("logger.console", caf::atom("none"));
  cfg->set("scheduler.max-threads", 2);
  if (tls)
    enable_tls(*cfg, *tls);
  else if (anonymous)
    cfg->load<caf::openssl::manager>();
  return cfg;
}

/// A port nothing listens on right now (the kernel's pick).
std::uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

/// Whether anything accepts a TCP connection on 127.0.0.1:`port` now.
bool tcp_accepts(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0; // loopback: refused at once
  ::close(fd);
  return ok;
}

/// Runs `connect` with a deadline: a connection attempt that neither
/// succeeds nor fails in 30 s is a hang, and fails the test.
template <class F>
auto within_deadline(F connect) {
  auto f = std::async(std::launch::async, connect);
  REQUIRE(f.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  return f.get();
}

/// An actor that answers a string s with "echo s".
caf::actor spawn_echo(caf::actor_system& sys) {
  return sys.spawn([]() -> caf::behavior { return {[](const std::string& s) { return "echo " + s; }}; });
}

/// What `remote` (an echo actor) answers `self`'s "hi": "echo hi", or the error.
std::string ask_echo(caf::actor_system& sys, caf::scoped_actor& self, const caf::actor& remote) {
  std::string reply;
  self->request(remote, std::chrono::seconds(10), std::string("hi"))
    .receive([&](const std::string& r) { reply = r; }, [&](caf::error& e) { reply = sys.render(e); });
  return reply;
}

/// A member with `tls` connects to the echo actor published on `port` and
/// asks it: "echo hi", or why not.
std::string member_asks_echo(const tls_spec& tls, std::uint16_t port) {
  auto cfg = tls_config(tls);
  caf::actor_system client{*cfg};
  auto remote = within_deadline([&] { return connect_node<caf::actor>(client, "127.0.0.1", port); });
  if (!remote)
    return client.render(remote.error());
  caf::scoped_actor self{client};
  return ask_echo(client, self, *remote);
}

} // namespace

TEST_CASE("check_tls_files refuses bad files naming them: one row per rule") {
  two_cas c;
  const auto good = c.node(c.ours, "w1");
  CHECK_NOTHROW(check_tls_files(good));
  CHECK_NOTHROW(check_tls_files(c.node(c.ours, "head")));

  const std::string scratch = c.dir / "bad";
  fs::create_directory(scratch);
  write_text(scratch + "/empty.pem", "");
  write_text(scratch + "/text.pem", "this is not PEM\n");
  write_text(scratch + "/big.pem", std::string((1 << 20) + 1, 'A'));
  write_text(scratch + "/encrypted.key", encrypted_key(read_text(good.key)));
  REQUIRE(::mkfifo((scratch + "/fifo.key").c_str(), 0600) == 0); // a reader would block on it
  fs::create_directory(scratch + "/dir.pem");

  struct row {
    const char* name;
    tls_spec files;
    const char* field;  ///< cluster.tls.<field> in the message
    std::string named;  ///< the file the message names
    const char* reason;
  };
  auto with = [&](std::string tls_spec::*member, const std::string& path) {
    auto f = good;
    f.*member = path;
    return f;
  };
  const std::vector<row> rows = {
    {"missing CA", with(&tls_spec::ca, scratch + "/none.pem"), "ca", scratch + "/none.pem", "missing or not accessible"},
    {"missing key", with(&tls_spec::key, scratch + "/none.key"), "key", scratch + "/none.key",
     "missing or not accessible"},
    {"directory as certificate", with(&tls_spec::cert, scratch + "/dir.pem"), "cert", scratch + "/dir.pem",
     "not a regular file"},
    {"FIFO as key", with(&tls_spec::key, scratch + "/fifo.key"), "key", scratch + "/fifo.key", "not a regular file"},
    {"empty CA", with(&tls_spec::ca, scratch + "/empty.pem"), "ca", scratch + "/empty.pem", "is empty"},
    {"empty key", with(&tls_spec::key, scratch + "/empty.pem"), "key", scratch + "/empty.pem", "is empty"},
    {"too big", with(&tls_spec::cert, scratch + "/big.pem"), "cert", scratch + "/big.pem", "larger than 1048576 bytes"},
    {"certificate not PEM", with(&tls_spec::cert, scratch + "/text.pem"), "cert", scratch + "/text.pem",
     "no PEM certificate"},
    {"CA file holding a key", with(&tls_spec::ca, good.key), "ca", good.key, "no PEM certificate"},
    {"key not PEM", with(&tls_spec::key, scratch + "/text.pem"), "key", scratch + "/text.pem",
     "no unencrypted PEM private key"},
    {"key file holding a certificate", with(&tls_spec::key, good.cert), "key", good.cert,
     "no unencrypted PEM private key"},
    {"encrypted key", with(&tls_spec::key, scratch + "/encrypted.key"), "key", scratch + "/encrypted.key",
     "no unencrypted PEM private key"},
    {"another node's key", with(&tls_spec::key, c.ours + "/w2.key"), "key", c.ours + "/w2.key",
     "does not belong to the certificate"},
    {"certificate of another CA", c.node(c.theirs, "w1") /* their CA replaced below */, "cert",
     c.theirs + "/w1.pem", "not signed by the CA"},
    {"the CA's own key and certificate, another CA trusted",
     {c.theirs + "/ca.pem", c.ours + "/ca.pem", c.ours + "/ca.key"}, "cert", c.ours + "/ca.pem",
     "not signed by the CA"},
  };
  for (auto r : rows) {
    CAPTURE(r.name);
    if (std::string(r.name) == "certificate of another CA")
      r.files.ca = good.ca;
    try {
      check_tls_files(r.files);
      FAIL("accepted");
    } catch (const std::runtime_error& e) {
      std::string what = e.what();
      CAPTURE(what);
      CHECK(what.find(std::string("cluster.tls.") + r.field + ": " + r.named + ": ") == 0);
      CHECK(what.find(r.reason) != std::string::npos);
    }
  }
}

TEST_CASE("certs make: CA, per-node certificates, keys and secrets, private modes, no silent overwrite") {
  test::scratch_dir dir;
  const std::string out = dir / "certs";
  auto written = make_certs({out, {"head", "w1"}, 10, false});
  const std::vector<std::pair<std::string, mode_t>> expected = {
    {"ca.pem", 0644},   {"ca.key", 0600},  {"head.pem", 0644}, {"head.key", 0600},
    {"head.secret", 0600}, {"w1.pem", 0644}, {"w1.key", 0600},  {"w1.secret", 0600}};
  REQUIRE(written.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(expected[i].first);
    CHECK(written[i] == out + "/" + expected[i].first);
    CHECK(mode_of(written[i]) == expected[i].second);
  }
  CHECK(mode_of(out) == 0700);
  for (const std::string node : {"head", "w1"}) {
    CAPTURE(node);
    CHECK_NOTHROW(check_tls_files({out + "/ca.pem", out + "/" + node + ".pem", out + "/" + node + ".key"}));
    auto secret = read_text(out + "/" + node + ".secret");
    REQUIRE(secret.size() == 65);
    CHECK(secret.back() == '\n');
    CHECK(secret.find_first_not_of("0123456789abcdef") == 64);
    CHECK(read_cluster_secret(out + "/" + node + ".secret", "") == secret.substr(0, 64));
  }
  CHECK(read_text(out + "/head.secret") != read_text(out + "/w1.secret"));
  // The CA key is not a node's: it cannot stand in for one.
  CHECK_THROWS_WITH_AS(check_tls_files({out + "/ca.pem", out + "/w1.pem", out + "/ca.key"}),
                       doctest::Contains("does not belong to the certificate"), std::runtime_error);

  // Run again: refused, naming the first file that exists, nothing touched.
  const auto ca_before = read_text(out + "/ca.pem");
  CHECK_THROWS_WITH_AS(make_certs({out, {"head", "w1"}, 10, false}),
                       doctest::Contains((out + "/ca.pem exists; refusing to overwrite it").c_str()), std::runtime_error);
  CHECK(read_text(out + "/ca.pem") == ca_before);
  // A node of its own would still collide with the CA files.
  CHECK_THROWS_AS(make_certs({out, {"w3"}, 10, false}), std::runtime_error);
  CHECK(!fs::exists(out + "/w3.pem"));

  // --force replaces every file, and a widened mode is narrowed again.
  ::chmod((out + "/w1.key").c_str(), 0644);
  auto again = make_certs({out, {"head", "w1"}, 10, true});
  CHECK(again == written);
  CHECK(read_text(out + "/ca.pem") != ca_before);
  CHECK(mode_of(out + "/w1.key") == 0600);
  CHECK_NOTHROW(check_tls_files({out + "/ca.pem", out + "/w1.pem", out + "/w1.key"}));

  // A symbolic link where a file goes is not followed, even with --force.
  const std::string linked = dir / "linked";
  fs::create_directory(linked);
  write_text(dir / "victim", "keep me\n");
  fs::create_symlink(dir / "victim", linked + "/ca.key");
  CHECK_THROWS_WITH_AS(make_certs({linked, {"w1"}, 10, true}), doctest::Contains((linked + "/ca.key").c_str()),
                       std::runtime_error);
  CHECK(read_text(dir / "victim") == "keep me\n");
}

TEST_CASE("certs make refuses bad arguments before writing anything") {
  test::scratch_dir dir;
  const std::string out = dir / "certs";
  struct row {
    certs_options o;
    const char* message;
  };
  const std::vector<row> rows = {
    {{out, {}, 10, false}, "--nodes must name at least one node"},
    {{"", {"a"}, 10, false}, "--out must name a directory"},
    {{out, {"a", "b\x1b[2J"}, 10, false}, "node name 'b\\x1b[2J' must be non-empty"},
    {{out, {"a", ""}, 10, false}, "node name '' must be non-empty"},
    {{out, {"../up"}, 10, false}, "node name '../up'"},
    {{out, {"a", "a"}, 10, false}, "node 'a' is listed twice"},
    {{out, {"ca"}, 10, false}, "cannot be named 'ca'"},
    {{out, {"a"}, 0, false}, "--days must be between 1 and 36500, got 0"},
    {{out, {"a"}, max_cert_days + 1, false}, "--days must be between 1 and 36500, got 36501"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.message);
    CHECK_THROWS_WITH_AS(make_certs(r.o), doctest::Contains(r.message), std::runtime_error);
    CHECK(!fs::exists(out));
  }
}

TEST_CASE("two actor systems over mutual TLS: the cluster's CA connects, another CA's or none does not") {
  two_cas c;
  auto server_cfg = tls_config(c.node(c.ours, "head"));
  caf::actor_system server{*server_cfg};
  CHECK(uses_tls(server));
  auto echo = spawn_echo(server);
  auto port = publish_node(server, echo, 0, "127.0.0.1");
  REQUIRE(port);

  SUBCASE("a certificate of the same CA connects, and messages flow") {
    CHECK(member_asks_echo(c.node(c.ours, "w1"), *port) == "echo hi");
  }
  SUBCASE("a certificate of another CA does not") {
    auto cfg = tls_config(c.node(c.theirs, "w1"));
    caf::actor_system client{*cfg};
    auto remote = within_deadline([&] { return connect_node<caf::actor>(client, "127.0.0.1", *port); });
    CHECK(!remote);
  }
  SUBCASE("our CA trusted but another CA's certificate presented: the server refuses it") {
    // check_tls_files would refuse this pair; CAF is given it directly.
    auto cfg = tls_config(std::nullopt);
    cfg->load<caf::openssl::manager>();
    cfg->openssl_cafile = c.ours + "/ca.pem";
    cfg->openssl_certificate = c.theirs + "/w1.pem";
    cfg->openssl_key = c.theirs + "/w1.key";
    caf::actor_system client{*cfg};
    auto remote = within_deadline([&] { return caf::openssl::remote_actor<caf::actor>(client, "127.0.0.1", *port); });
    CHECK(!remote);
  }
  SUBCASE("no certificate (anonymous ECDH, what CAF speaks without files) does not") {
    auto cfg = tls_config(std::nullopt, true);
    caf::actor_system client{*cfg};
    CHECK_THROWS_WITH_AS(uses_tls(client), doctest::Contains("anonymous ECDH"), std::runtime_error);
    auto remote = within_deadline([&] { return caf::openssl::remote_actor<caf::actor>(client, "127.0.0.1", *port); });
    CHECK(!remote);
  }
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
}

TEST_CASE("TLS files are pinned at start: files renewed or moved on disk do not break later connections") {
  two_cas c;
  auto server_cfg = tls_config(c.node(c.ours, "head"));
  CHECK(server_cfg->openssl_key.rfind("/proc/self/fd/", 0) == 0);
  // Set up again (a Python rank retrying its join): the same copies, no new descriptors.
  CHECK(tls_config(c.node(c.ours, "head"))->openssl_key == server_cfg->openssl_key);
  caf::actor_system server{*server_cfg};
  auto echo = spawn_echo(server);
  auto port = publish_node(server, echo, 0, "127.0.0.1");
  REQUIRE(port);
  // CAF reads its files again at each connection: without the copies the
  // next one would throw on CAF's network thread and abort this process.
  std::filesystem::rename(c.ours + "/head.key", c.ours + "/head.key.old");
  std::filesystem::remove(c.ours + "/head.pem");
  CHECK(member_asks_echo(c.node(c.ours, "w1"), *port) == "echo hi");
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
}

TEST_CASE("an outsider's failed TLS handshakes do not drop a member's connection") {
  // OpenSSL keeps errors in a per-thread queue and SSL_get_error reads it;
  // CAF 0.17's openssl module never clears it, so one failed handshake made
  // the next idle read of another connection on CAF's I/O thread look failed.
  two_cas c;
  auto server_cfg = tls_config(c.node(c.ours, "head"));
  caf::actor_system server{*server_cfg};
  auto echo = spawn_echo(server);
  auto port = publish_node(server, echo, 0, "127.0.0.1");
  REQUIRE(port);
  auto member_cfg = tls_config(c.node(c.ours, "w1"));
  caf::actor_system member{*member_cfg};
  auto remote = within_deadline([&] { return connect_node<caf::actor>(member, "127.0.0.1", *port); });
  REQUIRE(remote);
  caf::scoped_actor self{member};
  self->monitor(*remote);
  auto ask = [&] { return ask_echo(member, self, *remote); };
  REQUIRE(ask() == "echo hi");
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    for (int i = 0; i < 3; ++i) {
      auto outsider_cfg = tls_config(std::nullopt, true);
      caf::actor_system outsider{*outsider_cfg};
      auto r = within_deadline(
        [&] { return caf::openssl::remote_actor<caf::actor>(outsider, "127.0.0.1", *port); });
      CHECK(!r);
    }
    CHECK(ask() == "echo hi");
    CHECK(ask() == "echo hi");
  }
  bool down = false;
  self->receive([&](caf::down_msg&) { down = true; }, caf::after(std::chrono::milliseconds(200)) >> [] {});
  CHECK(!down);
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
}

/// A cluster of `c`'s CA: the head at `port`, members w1 and w2 with an engine each.
topology tls_cluster(const two_cas& c, std::uint16_t port) {
  const std::string yaml = "name: t\n"
                           "model: {synthetic: {layers: 2, hidden_size: 64, heads: 4, kv_heads: 2, "
                           "intermediate_size: 128}}\n"
                           "nodes: [{name: head, address: 127.0.0.1, port: " + std::to_string(port) + "},"
                           " {name: w1, address: 127.0.0.1}, {name: w2, address: 127.0.0.1}]\n"
                           "cluster:\n"
                           "  tls: {ca: '" + c.ours + "/ca.pem', cert: '" + c.ours + "/{node}.pem', key: '"
                           + c.ours + "/{node}.key'}\n"
                           "  secret_file: '" + c.ours + "/{node}.secret'\n"
                           "  connect_deadline_ms: 5000\n"
                           "trainer: {node: head}\n"
                           "engines: [{name: e, node: w1}, {name: f, node: w2}]\n";
  return parse_topology(yaml, "t.yaml", "/");
}

TEST_CASE("a member that reaches a peer posing as the head over TLS (a certificate the CA signed) refuses it") {
  two_cas c;
  const auto port = free_port();
  auto t = tls_cluster(c, port);
  // Member w2 (a certificate of the same CA) listens where w1 expects its head.
  auto impostor_cfg = tls_config(std::nullopt);
  configure_node_tls(*impostor_cfg, t, "w2");
  caf::actor_system impostor{*impostor_cfg};
  auto fake = impostor.spawn(test::impostor_gate);
  REQUIRE(publish_node(impostor, fake, port, "127.0.0.1"));

  auto member_cfg = tls_config(std::nullopt);
  configure_node_tls(*member_cfg, t, "w1");
  caf::actor_system member{*member_cfg};
  std::string why;
  auto grant = join_cluster(member, t, *t.find_node("w1"), *t.find_node("head"),
                            read_cluster_secret(c.ours + "/w1.secret", ""), {}, why);
  CHECK_FALSE(grant);
  CHECK_MESSAGE(why.find("without proving it holds w1's secret: it is not head") != std::string::npos, why);
  caf::anon_send_exit(fake, caf::exit_reason::user_shutdown);
}

TEST_CASE("a head published over TLS admits a member, then stops cleanly and closes its port") {
  two_cas c;
  const auto port = free_port();
  auto t = tls_cluster(c, port);
  auto head_cfg = tls_config(std::nullopt);
  configure_node_tls(*head_cfg, t, "head");
  caf::actor_system head_sys{*head_cfg};
  std::vector<std::string> lines;
  std::mutex lines_mutex;
  auto head = std::make_unique<head_node>(head_sys, t, *t.find_node("head"), member_secrets(t, "head", ""),
                                          head_hooks{{}, [&](const std::string& l) {
                                                       std::lock_guard<std::mutex> g(lines_mutex);
                                                       lines.push_back(l);
                                                     }, {}});
  REQUIRE(head->port() == port);

  auto member_cfg = tls_config(std::nullopt);
  configure_node_tls(*member_cfg, t, "w1");
  caf::actor_system member{*member_cfg};
  auto gate = within_deadline([&] { return connect_node<gatekeeper_actor>(member, "127.0.0.1", port); });
  REQUIRE(gate);
  caf::scoped_actor self{member};
  std::string challenge, problem;
  // A node of another build is refused before any challenge, and the
  // refusal reaches it over the wire naming both fingerprints.
  self->request(*gate, std::chrono::seconds(10), hello_atom::value, std::string("w1"), std::string("0000000000000000"))
    .receive([&](const std::string& ch) { challenge = ch; }, [&](caf::error& e) { problem = member.render(e); });
  CHECK(challenge.empty());
  const auto named = problem.find("wire fingerprint 0000000000000000, the head's " + wire_fingerprint());
  CHECK_MESSAGE(named != std::string::npos, problem);
  self->request(*gate, std::chrono::seconds(10), hello_atom::value, std::string("w1"), wire_fingerprint())
    .receive([&](const std::string& ch) { challenge = ch; }, [&](caf::error& e) { problem = member.render(e); });
  REQUIRE_MESSAGE(!challenge.empty(), problem);
  // The node's side of admission, as members and `rlsync status` run it. A
  // wrong secret is refused at the admit step, naming no impostor.
  const auto refused = ask_admission(self, *gate, "w1", "not w1's secret",
                                     std::chrono::steady_clock::now() + std::chrono::seconds(10));
  CHECK_FALSE(refused.grant);
  CHECK_FALSE(refused.unproved);
  CHECK(std::string{refused.step} == "admission");
  CHECK(is(refused.error, errc::unauthenticated));
  // The right one gets the grant, which comes back only with the head's
  // proof of w1's secret.
  const auto answer = ask_admission(self, *gate, "w1", read_cluster_secret(c.ours + "/w1.secret", ""),
                                    std::chrono::steady_clock::now() + std::chrono::seconds(10));
  CHECK_FALSE(answer.unproved);
  REQUIRE_MESSAGE(answer.grant, member.render(answer.error));
  CHECK(answer.grant->coordinator != nullptr);

  CHECK(head->stop(std::chrono::seconds(10)));
  // The port is closed: nothing accepts a connection there any more. (Asked
  // through CAF, the member's middleman could answer from its cache of the
  // connection it already had.)
  CHECK(!tcp_accepts(port));
  head.reset();
}
