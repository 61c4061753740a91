// Small subcommands: version, devices.
#include "gpu/device.hpp"
#include "runtime/base/version.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"

#include <iostream>

namespace rlsync::tools {

int cmd_version(const arg_list& argv) {
  CLI::App app("Prints the rlsync version and its wire fingerprint.", "rlsync version");
  cli::configure(app);
  if (!cli::parse(app, argv))
    return 0;
  // The fingerprint is what nodes must share to join one cluster.
  std::cout << "rlsync " << version_string() << " (wire fingerprint " << wire_fingerprint() << ")\n";
  return 0;
}

int cmd_devices(const arg_list& argv) {
  CLI::App app("Shows what the GPU layer was built with and which devices it sees.", "rlsync devices");
  cli::configure(app);
  if (!cli::parse(app, argv))
    return 0;
  auto info = gpu::query_devices();
  std::cout << "cuda:    " << (info.compiled_with_cuda ? "compiled in" : "not compiled in") << "\n"
            << "nccl:    "
            << (info.compiled_with_nccl ? "compiled in (" + gpu::nccl_version() + ")"
                                        : std::string("not compiled in"))
            << "\n"
            << "devices: " << info.device_count << " (" << info.detail << ")\n";
  return 0;
}

} // namespace rlsync::tools
