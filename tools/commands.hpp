#pragma once
// The rlsync subcommands. Each takes its arguments (without the subcommand
// name) and returns the process exit status.
#include <string>
#include <vector>

namespace rlsync::tools {

using arg_list = std::vector<std::string>;

int cmd_version(const arg_list& args);
int cmd_devices(const arg_list& args);
int cmd_checkpoint(const arg_list& args);
int cmd_validate(const arg_list& args);
int cmd_plan(const arg_list& args);
int cmd_generate(const arg_list& args);
int cmd_bench(const arg_list& args);
int bench_sync(const arg_list& args);   // tools/cmd_bench_sync.cpp
int bench_control(const arg_list& args);
int bench_http(const arg_list& args);
int cmd_run(const arg_list& args);
int cmd_node(const arg_list& args);
int cmd_ping(const arg_list& args);
int cmd_launch(const arg_list& args);
int cmd_drill(const arg_list& args);
int cmd_certs(const arg_list& args);
int cmd_soak(const arg_list& args);
int cmd_serve(const arg_list& args);  // tools/cmd_serve.cpp
int cmd_status(const arg_list& args);

} // namespace rlsync::tools
