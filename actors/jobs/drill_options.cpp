#include "actors/jobs/drill_options.hpp"

#include <ctime>
#include <filesystem>

namespace rlsync::jobs {

std::optional<throughput_verdict> parse_throughput_verdict(std::string_view text) {
  if (text == "judge")
    return throughput_verdict::judge;
  if (text == "report")
    return throughput_verdict::report;
  return std::nullopt;
}

std::string default_report_dir(const std::string& drill_name) {
  char stamp[32];
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &local);
  std::string base = "rlsync-drill-" + drill_name + "-" + stamp;
  std::string dir = base;
  for (int k = 2; std::filesystem::exists(dir); ++k)
    dir = base + "-" + std::to_string(k);
  return dir;
}

} // namespace rlsync::jobs
