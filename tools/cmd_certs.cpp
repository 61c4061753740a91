// rlsync certs make: a cluster's CA, per-node certificates and keys, and
// per-node secrets (actors/certs.hpp), for cluster.tls and a secret_file
// with {node}.
#include "actors/certs.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"

#include <iostream>

namespace rlsync::tools {

namespace {

const char* certs_usage =
  "usage: rlsync certs make --out DIR --nodes a,b,c [--days N] [--force]\n"
  "\nRun 'rlsync certs make --help' for options.\n";

const char* make_description =
  "Makes a cluster's credentials in DIR, with OpenSSL's library:\n"
  "  ca.pem, ca.key          the cluster's CA (ca.key: keep it off the nodes)\n"
  "  NODE.pem, NODE.key      each node's certificate (signed by the CA) and key\n"
  "  NODE.secret             each node's secret (32 random bytes, hex)\n"
  "Keys and secrets are written mode 0600. Use them in the topology as\n"
  "  cluster:\n"
  "    tls: {ca: DIR/ca.pem, cert: DIR/{node}.pem, key: DIR/{node}.key}\n"
  "    secret_file: DIR/{node}.secret\n"
  "and copy to each node only ca.pem and its own NODE.* files; the head needs every\n"
  "member's NODE.secret. Existing files are never replaced unless --force.";

std::vector<std::string> split_nodes(const std::string& list) {
  std::vector<std::string> names;
  std::size_t start = 0;
  for (;;) {
    auto comma = list.find(',', start);
    names.push_back(list.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos)
      return names;
    start = comma + 1;
  }
}

int make(const arg_list& argv) {
  CLI::App app(make_description, "rlsync certs make");
  cli::configure(app);
  certs_options o;
  std::string nodes;
  std::uint64_t days = 365;
  auto out_flag = app.add_option("--out", o.out_dir, "the directory to write (made when missing)")->type_name("DIR");
  auto nodes_flag = app.add_option("--nodes", nodes, "the topology's node names, comma-separated")->type_name("a,b,c");
  cli::add_count(app, "--days", days, "how long the certificates are valid")->default_val(days);
  auto force = app.add_flag("--force", "replace existing files");
  if (!cli::parse(app, argv))
    return 0;
  cli::require(out_flag);
  cli::require(nodes_flag);
  if (days < 1 || days > static_cast<std::uint64_t>(max_cert_days))
    throw cli::usage_error("--days: must be between 1 and " + std::to_string(max_cert_days) + ", got "
                           + std::to_string(days));
  o.days = static_cast<long>(days);
  o.nodes = split_nodes(nodes);
  o.force = force->count() > 0;
  try {
    for (const auto& path : make_certs(o))
      std::cout << path << "\n";
  } catch (const std::runtime_error& e) {
    std::cerr << "rlsync " << e.what() << "\n";
    return 1;
  }
  return 0;
}

} // namespace

int cmd_certs(const arg_list& argv) {
  if (argv.empty())
    throw cli::usage_error("expected 'make'\n" + std::string(certs_usage));
  const std::string& sub = argv.front();
  arg_list rest(argv.begin() + 1, argv.end());
  if (sub == "--help" || sub == "-h" || sub == "help") {
    std::cout << certs_usage;
    return 0;
  }
  if (sub == "make")
    return make(rest);
  throw cli::usage_error("unknown certs subcommand '" + sub + "' (expected make)");
}

} // namespace rlsync::tools
