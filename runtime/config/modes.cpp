#include "runtime/config/modes.hpp"

namespace rlsync {

std::string to_string(pause_mode x) {
  switch (x) {
    case pause_mode::abort: return "abort";
    case pause_mode::wait: return "wait";
    case pause_mode::keep: return "keep";
  }
  return "pause_mode(" + std::to_string(static_cast<int>(x)) + ")";
}

std::string to_string(transfer_mode x) {
  switch (x) {
    case transfer_mode::sharded: return "sharded";
    case transfer_mode::broadcast: return "broadcast";
  }
  return "transfer_mode(" + std::to_string(static_cast<int>(x)) + ")";
}

std::string_view to_string(sync_phase x) {
  switch (x) {
    case sync_phase::pause: return "pause";
    case sync_phase::flush: return "flush";
    case sync_phase::start: return "start";
    case sync_phase::transfer: return "transfer";
    case sync_phase::finish: return "finish";
    case sync_phase::resume: return "resume";
    case sync_phase::done: return "done";
  }
  return "?";
}

sync_phase next(sync_phase x) {
  return x == sync_phase::done ? x : static_cast<sync_phase>(static_cast<int>(x) + 1);
}

} // namespace rlsync
