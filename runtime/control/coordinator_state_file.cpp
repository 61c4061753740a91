#include "runtime/control/coordinator_state_file.hpp"

#include "runtime/base/regular_file.hpp"
#include "runtime/config/yaml_fields.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <stdexcept>
#include <system_error>

namespace rlsync {

namespace {

using yaml_fields::describe;
using yaml_fields::diagnostics;
using yaml_fields::map_reader;
using yaml_fields::presence;

constexpr std::int64_t current_format = 1;
// A state file holds a few lines per engine; anything this large is not one.
constexpr std::size_t state_file_bytes_max = std::size_t(16) << 20;

const std::vector<std::string> top_keys = {"format", "synced_version", "newest_version", "rounds",
                                           "members"};
const std::vector<std::string> member_keys = {"name",    "incarnation", "restarts",
                                              "retired", "version",     "routable"};

std::string errno_text(int err) { return std::generic_category().message(err); }

std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (auto& l : lines)
    out += (out.empty() ? "" : "\n") + l;
  return out;
}

[[noreturn]] void fail(const diagnostics& d) { throw std::runtime_error(join_lines(d.lines())); }

bool all_digits(const std::string& s, std::size_t from) {
  return from < s.size() && std::all_of(s.begin() + static_cast<std::ptrdiff_t>(from), s.end(),
                                        [](unsigned char c) { return std::isdigit(c) != 0; });
}

// A required unsigned field. By hand rather than map_reader::read, whose
// integers stop at INT64_MAX: whatever the writer emits must read back.
bool read_unsigned(const map_reader& m, const std::string& key, std::uint64_t max, std::uint64_t& out) {
  if (!m.require(key))
    return false;
  YAML::Node n = m.get(key);
  const std::string text = n.IsScalar() ? n.Scalar() : std::string();
  if (!text.empty() && text[0] == '-' && all_digits(text, 1)) {
    m.error(key, "must not be negative, got " + text);
    return false;
  }
  if (!n.IsScalar() || !all_digits(text, 0)) {
    m.error(key, "expected a non-negative integer, got " + describe(n));
    return false;
  }
  errno = 0;
  unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE || v > max) {
    m.error(key, "integer out of range: " + describe(n));
    return false;
  }
  out = v;
  return true;
}

persisted_coordinator parse_state(const std::string& text, const std::string& file) {
  constexpr auto u64_max = std::numeric_limits<std::uint64_t>::max();
  diagnostics d(file);
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    d.add(e.mark, "", "not valid YAML: " + e.msg);
    fail(d);
  }
  if (docs.empty() || (docs.size() == 1 && docs[0].IsNull())) {
    d.add(YAML::Mark(), "", "the file is empty");
    fail(d);
  }
  if (docs.size() > 1) {
    d.add(docs[1].Mark(), "", "expected one YAML document, got " + std::to_string(docs.size()));
    fail(d);
  }
  const YAML::Node& doc = docs[0];
  if (!doc.IsMap()) {
    d.add(doc.Mark(), "", "expected a map of coordinator state fields, got " + describe(doc));
    fail(d);
  }
  // map_reader names the top level "topology" in these messages; say it here.
  for (auto it = doc.begin(); it != doc.end(); ++it)
    if (!it->first.IsScalar())
      d.add(it->first.Mark(), "", "keys must be names, got " + describe(it->first));
  if (!d.empty())
    fail(d);

  map_reader root(d, doc, "", top_keys);
  std::int64_t format = 0;
  if (root.read("format", format, {}, presence::required) && format != current_format) {
    // A newer layout: its other fields would only add noise.
    diagnostics only(file);
    only.add(root.mark("format"), "format",
             "unsupported format " + std::to_string(format) + " (this build reads format "
               + std::to_string(current_format) + ")");
    fail(only);
  }

  persisted_coordinator s;
  bool synced = read_unsigned(root, "synced_version", u64_max, s.synced_version);
  bool newest = read_unsigned(root, "newest_version", u64_max, s.newest_version);
  read_unsigned(root, "rounds", u64_max, s.rounds);
  if (synced && newest && s.synced_version > s.newest_version)
    root.error("synced_version", std::to_string(s.synced_version) + " is newer than newest_version "
                                   + std::to_string(s.newest_version));

  std::map<std::string, int> first_line; // name -> 1-based line of its first entry
  if (auto items = root.list("members", presence::required)) {
    for (auto& item : *items) {
      if (!item.node.IsMap()) {
        // An empty item's mark points past it, to the next line.
        bool placed = !item.node.IsNull() && !item.node.Mark().is_null();
        auto at = placed ? item.node.Mark() : root.mark("members");
        d.add(at, item.path, "expected a map, got " + describe(item.node));
        continue;
      }
      map_reader m(d, item.node, item.path, member_keys);
      persisted_member p;
      std::uint64_t restarts = 0;
      bool named = m.read("name", p.name, presence::required);
      bool ok = named;
      ok &= read_unsigned(m, "incarnation", u64_max, p.incarnation);
      ok &= read_unsigned(m, "restarts", std::numeric_limits<std::uint32_t>::max(), restarts);
      ok &= m.read("retired", p.retired, presence::required);
      bool versioned = read_unsigned(m, "version", u64_max, p.version);
      ok &= versioned;
      ok &= m.read("routable", p.routable, presence::required);
      p.restarts = static_cast<std::uint32_t>(restarts);
      if (named) {
        int line = m.mark("name").line + 1;
        auto [first, inserted] = first_line.emplace(p.name, line);
        if (!inserted) {
          m.error("name", "duplicate member '" + p.name + "' (first at line "
                            + std::to_string(first->second) + ")");
          ok = false;
        }
      }
      if (versioned && newest && p.version > s.newest_version) {
        m.error("version", std::to_string(p.version) + " is newer than newest_version "
                             + std::to_string(s.newest_version));
        ok = false;
      }
      if (ok)
        s.members.push_back(std::move(p));
    }
  }
  if (!d.empty())
    fail(d);
  std::sort(s.members.begin(), s.members.end(),
            [](const persisted_member& a, const persisted_member& b) { return a.name < b.name; });
  return s;
}

// The whole file; nullopt when it does not exist. A FIFO or device in its
// place is refused rather than read.
std::optional<std::string> read_whole_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 && errno == ENOENT)
    return std::nullopt;
  try {
    return read_regular_file(path, state_file_bytes_max, "coordinator state");
  } catch (const file_error& e) {
    throw std::runtime_error(e.what());
  }
}

std::vector<const persisted_member*> sorted_members(const persisted_coordinator& s) {
  std::vector<const persisted_member*> out;
  for (auto& m : s.members)
    out.push_back(&m);
  std::stable_sort(out.begin(), out.end(), [](auto* a, auto* b) { return a->name < b->name; });
  return out;
}

// What read_coordinator_state would reject, checked before anything is written.
void check_writable(const persisted_coordinator& s) {
  auto bad = [](const std::string& why) {
    throw std::invalid_argument("coordinator state not written: " + why);
  };
  if (s.synced_version > s.newest_version)
    bad("synced_version " + std::to_string(s.synced_version) + " is newer than newest_version "
        + std::to_string(s.newest_version));
  auto members = sorted_members(s);
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (i > 0 && members[i]->name == members[i - 1]->name)
      bad("duplicate member '" + members[i]->name + "'");
    if (members[i]->version > s.newest_version)
      bad("member '" + members[i]->name + "' version " + std::to_string(members[i]->version)
          + " is newer than newest_version " + std::to_string(s.newest_version));
  }
}

} // namespace

bool operator==(const persisted_member& a, const persisted_member& b) {
  return a.name == b.name && a.incarnation == b.incarnation && a.restarts == b.restarts
         && a.retired == b.retired && a.version == b.version && a.routable == b.routable;
}

bool operator==(const persisted_coordinator& a, const persisted_coordinator& b) {
  return a.synced_version == b.synced_version && a.newest_version == b.newest_version
         && a.rounds == b.rounds && a.members == b.members;
}

std::string to_yaml(const persisted_coordinator& s) {
  auto u64 = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
  YAML::Emitter out;
  out << YAML::Comment("rlsync coordinator state; written by the coordinator, do not edit while it runs");
  out << YAML::BeginMap;
  out << YAML::Key << "format" << YAML::Value << static_cast<long long>(current_format);
  out << YAML::Key << "synced_version" << YAML::Value << u64(s.synced_version);
  out << YAML::Key << "newest_version" << YAML::Value << u64(s.newest_version);
  out << YAML::Key << "rounds" << YAML::Value << u64(s.rounds);
  out << YAML::Key << "members" << YAML::Value << YAML::BeginSeq;
  for (auto* m : sorted_members(s)) {
    out << YAML::Flow << YAML::BeginMap;
    out << YAML::Key << "name" << YAML::Value << m->name;
    out << YAML::Key << "incarnation" << YAML::Value << u64(m->incarnation);
    out << YAML::Key << "restarts" << YAML::Value << static_cast<unsigned long>(m->restarts);
    out << YAML::Key << "retired" << YAML::Value << m->retired;
    out << YAML::Key << "version" << YAML::Value << u64(m->version);
    out << YAML::Key << "routable" << YAML::Value << m->routable;
    out << YAML::EndMap;
  }
  out << YAML::EndSeq << YAML::EndMap;
  if (!out.good())
    throw std::logic_error("coordinator state: YAML emitter failed: " + out.GetLastError());
  return std::string(out.c_str()) + "\n";
}

std::optional<persisted_coordinator> read_coordinator_state(const std::string& path) {
  auto text = read_whole_file(path);
  if (!text)
    return std::nullopt;
  return parse_state(*text, path);
}

void write_coordinator_state(const std::string& path, const persisted_coordinator& s) {
  check_writable(s);
  const std::string text = to_yaml(s);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  auto fail = [&](const std::string& step, int err) {
    throw std::runtime_error("cannot write coordinator state " + path + ": " + step + ": "
                             + errno_text(err));
  };

  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    fail("create " + tmp, errno);
  // Before the rename a failure leaves the old file as it was.
  auto abandon = [&](const std::string& step) {
    int err = errno;
    if (fd >= 0)
      ::close(fd);
    ::unlink(tmp.c_str());
    fail(step, err);
  };
  const char* p = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      abandon("write " + tmp);
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0)
    abandon("fsync " + tmp);
  int closed = ::close(fd);
  fd = -1;
  if (closed != 0)
    abandon("close " + tmp);
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    abandon("rename " + tmp + " to " + path);

  // Makes the rename itself durable.
  auto dir = std::filesystem::path(path).parent_path();
  const std::string dir_name = dir.empty() ? "." : dir.string();
  int dfd = ::open(dir_name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    fail("open directory " + dir_name, errno);
  if (::fsync(dfd) != 0) {
    int err = errno;
    ::close(dfd);
    fail("fsync directory " + dir_name, err);
  }
  ::close(dfd);
}

} // namespace rlsync
