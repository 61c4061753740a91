#pragma once
// A fresh directory under $TMPDIR (or /tmp) for one test, removed with
// everything in it when the test ends.
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace rlsync::test {

class scratch_dir {
public:
  scratch_dir() {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base && *base ? base : "/tmp") + "/rlsync-test-XXXXXX";
    if (!::mkdtemp(templ.data()))
      throw std::runtime_error("mkdtemp failed for " + templ);
    path_ = templ;
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }

  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

private:
  std::string path_;
};

} // namespace rlsync::test
