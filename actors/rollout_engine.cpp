#include "actors/rollout_engine.hpp"

#include "runtime/checksum.hpp"

#include <caf/actor_system.hpp>

namespace rlsync {

namespace {

caf::error to_error(const engine::engine_error& e) { return make_error(e.code, e.what); }

} // namespace

rollout_engine_impl::behavior_type
rollout_engine(rollout_engine_impl::stateful_pointer<rollout_engine_state> self, rollout_engine_config cfg) {
  self->state.core = std::make_unique<engine::engine_core>(cfg.model, cfg.options);
  self->state.node = cfg.node;
  self->state.self_stepping = cfg.self_stepping;
  const std::string name = cfg.options.name;

  // Keeps exactly one step message in flight while the engine has work.
  auto schedule_step = [self] {
    if (self->state.self_stepping && !self->state.step_scheduled && self->state.core->has_work()) {
      self->state.step_scheduled = true;
      self->send(self, step_atom::value);
    }
  };
  auto deliver_pause_if_done = [self] {
    if (!self->state.pause_promise)
      return;
    if (auto report = self->state.core->poll_pause()) {
      self->state.pause_promise->deliver(*report);
      self->state.pause_promise.reset();
    }
  };
  auto ack = [self, name] { return phase_ack{name, self->state.core->version()}; };

  return {
    [=](pause_atom, const pause_request& req) -> caf::result<pause_report> {
      if (auto why = check(req); !why.empty())
        return make_error(errc::malformed, why);
      if (self->state.pause_promise) // a newer pause supersedes one still in flight
        self->state.pause_promise->deliver(make_error(errc::pause_in_flight, name + ": superseded by a newer pause"));
      self->state.pause_promise.reset();
      self->state.core->pause(req);
      if (auto report = self->state.core->poll_pause())
        return *report;
      auto rp = self->make_response_promise<pause_report>();
      self->state.pause_promise = rp;
      schedule_step();
      return rp;
    },
    [=](flush_atom) -> phase_ack {
      self->state.core->flush();
      return ack();
    },
    [=](start_atom, std::uint64_t version) -> caf::result<phase_ack> {
      if (auto e = self->state.core->start_update(version))
        return to_error(*e);
      return ack();
    },
    [=](update_atom, const weight_bucket& bucket) -> caf::result<std::uint64_t> {
      if (auto why = check(bucket); !why.empty())
        return make_error(errc::malformed, why);
      if (xxh64(bucket.data.data(), bucket.data.size()) != bucket.checksum)
        return make_error(errc::checksum_mismatch, name + ": bucket of group " + std::to_string(bucket.group)
                                                     + " of version " + std::to_string(bucket.version));
      std::uint64_t applied = 0;
      for (const auto& e : bucket.entries) {
        if (e.tensor_offset != 0)
          return make_error(errc::malformed, e.name + ": split tensors are not accepted inline");
        tensor_view t;
        t.name = e.name;
        t.type = static_cast<dtype>(e.dtype);
        t.shape = e.shape;
        t.data = reinterpret_cast<const std::byte*>(bucket.data.data() + e.offset);
        t.size = e.bytes;
        if (auto err = self->state.core->apply_tensor(t))
          return to_error(*err);
        applied += e.bytes;
      }
      return applied;
    },
    [=](transfer_atom, const transfer_order& order) -> caf::result<transfer_report> {
      if (auto why = check(order); !why.empty())
        return make_error(errc::malformed, why);
      // The data-plane pull arrives with the transfer layer; inline updates
      // (update_atom) are the path that exists today.
      return make_error(errc::malformed, name + ": transfer backend '" + order.backend + "' is not available here");
    },
    [=](finish_atom, std::uint64_t version) -> caf::result<phase_ack> {
      if (auto e = self->state.core->finish_update(version))
        return to_error(*e);
      return ack();
    },
    [=](resume_atom) -> caf::result<phase_ack> {
      if (auto e = self->state.core->resume())
        return to_error(*e);
      schedule_step();
      return ack();
    },
    [=](generate_atom, generate_request req, token_sink_actor sink) -> caf::result<generate_result> {
      auto id = req.request_id;
      if (self->state.pending.count(id))
        return make_error(errc::malformed, name + ": request " + std::to_string(id) + " already running");
      engine::request_callbacks cb;
      cb.on_token = [self, sink](const token_event& ev) { self->send(sink, token_atom::value, ev); };
      cb.on_finish = [self, id](generate_result r) {
        auto it = self->state.pending.find(id);
        if (it == self->state.pending.end())
          return;
        it->second.deliver(std::move(r));
        self->state.pending.erase(it);
      };
      // Refusals are answered before a promise exists: once a promise is
      // made, CAF sends nothing for the handler's return value.
      if (auto e = self->state.core->add(std::move(req), std::move(cb)))
        return to_error(*e);
      auto rp = self->make_response_promise<generate_result>();
      self->state.pending.emplace(id, rp);
      schedule_step();
      return rp;
    },
    [=](abort_atom, std::uint64_t request_id) -> bool {
      bool found = self->state.core->abort(request_id);
      deliver_pause_if_done();
      return found;
    },
    [=](status_atom) -> engine_status { return self->state.core->status(); },
    [=](heartbeat_atom, const heartbeat& hb) -> heartbeat { return {name, hb.seq}; },
    [=](step_atom) {
      self->state.step_scheduled = false;
      self->state.core->step();
      deliver_pause_if_done();
      schedule_step();
    },
  };
}

rollout_engine_actor spawn_rollout_engine(caf::actor_system& sys, rollout_engine_config cfg) {
  return caf::actor_cast<rollout_engine_actor>(sys.spawn<caf::detached>(rollout_engine, std::move(cfg)));
}

} // namespace rlsync
