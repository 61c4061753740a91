#include "actors/assembly/serve_node.hpp"
#include "gpu/engine_device.hpp"

#include "actors/assembly/local_deployment.hpp"
#include "actors/fleet_metrics.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/metrics/http_endpoint.hpp"

#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <stdexcept>

namespace rlsync {

namespace {

/// One blocking call to the engine at start-up, with a deadline.
template <class T, class... Ts>
T ask(caf::actor_system& sys, const rollout_engine_impl& engine, std::chrono::milliseconds deadline,
      const std::string& what, Ts&&... xs) {
  caf::scoped_actor self{sys};
  std::optional<T> out;
  std::string failure;
  self->request(engine, deadline, std::forward<Ts>(xs)...)
    .receive([&](T& value) { out = std::move(value); }, [&](caf::error& err) { failure = sys.render(err); });
  if (!out)
    throw std::runtime_error(what + ": " + failure);
  return std::move(*out);
}

} // namespace

serve_node::serve_node(caf::actor_system& sys, serve_node_options options) : sys_(sys), options_(std::move(options)) {
  const auto& dir = options_.checkpoint_dir;
  auto ckpt = checkpoint::open(dir);
  const dtype weights_dtype = checkpoint_dtype(ckpt);
  auto problems = check_llama_parameters(ckpt, ckpt.config(), weights_dtype,
                                         [&](const std::string& n) { return ignored_weight(ckpt.config(), n); });
  if (!problems.empty())
    throw std::runtime_error(dir + ": " + problems.front());
  for (auto& e : validate_tp(ckpt.config(), options_.tp, options_.expert_parallel))
    throw std::runtime_error((e.rfind("expert parallelism", 0) == 0 ? "--expert-parallel: " : "--tp: ") + e);
  for (auto& e : validate_dp(ckpt.config(), options_.tp, options_.dp, options_.expert_parallel))
    throw std::runtime_error("--dp: " + e);

  rollout_engine_config cfg;
  cfg.model = ckpt.config();
  cfg.options.name = "serve";
  cfg.options.tp = options_.tp;
  cfg.options.expert_parallel = options_.expert_parallel;
  cfg.options.dp = options_.dp;
  cfg.options.weights = options_.weights;
  if (options_.on_cuda) // throws gpu_error naming the missing device
    cfg.options.device = gpu::make_engine_device(0);
  cfg.options.source_dtype = weights_dtype;
  cfg.node = "serve";
  cfg.faults = options_.faults;
  cfg.metrics = engine_metrics_in(metrics_, cfg.options.name);
  ctx_.engine = spawn_rollout_engine(sys_, std::move(cfg));
  ctx_.settings.model_name = dir;
  ctx_.settings.checkpoint_dir = dir;
  ctx_.settings.max_model_len = ckpt.config().max_position_embeddings;
  ctx_.settings.tp = options_.tp;
  ctx_.settings.dp = options_.dp;
  ctx_.settings.strict_vllm = options_.strict_vllm;

  // The first weights go in as any update does: a session of version 1.
  try {
    const auto deadline = ctx_.settings.load_deadline;
    ask<pause_report>(sys_, ctx_.engine, deadline, "pause", pause_atom::value, pause_request{pause_mode::keep, false});
    ask<phase_ack>(sys_, ctx_.engine, deadline, "start", start_atom::value, std::uint64_t{1});
    ask<std::uint64_t>(sys_, ctx_.engine, deadline, "load " + dir, load_atom::value, dir);
    ask<phase_ack>(sys_, ctx_.engine, deadline, "finish", finish_atom::value, std::uint64_t{1});
    ask<phase_ack>(sys_, ctx_.engine, deadline, "resume", resume_atom::value);
  } catch (...) {
    caf::anon_send_exit(ctx_.engine, caf::exit_reason::user_shutdown);
    throw;
  }

  mount(ckpt.config());
}

serve_node::serve_node(caf::actor_system& sys, serve_node_options options, rollout_engine_impl engine,
                       const model_config& model, std::string model_name)
    : sys_(sys), options_(std::move(options)), owns_engine_(false) {
  ctx_.engine = std::move(engine);
  ctx_.settings.model_name = std::move(model_name);
  ctx_.settings.max_model_len = model.max_position_embeddings;
  ctx_.settings.tp = options_.tp;
  ctx_.settings.dp = options_.dp;
  ctx_.settings.strict_vllm = options_.strict_vllm;
  ctx_.settings.coordinated = true;
  ctx_.labels->label_by_number(true);
  mount(model);
}

void serve_node::mount(const model_config& model) {
  if (options_.metrics)
    metrics_ = options_.metrics;
  ctx_.settings.pause_deadline = options_.pause_deadline;
  ctx_.settings.session_idle_deadline = options_.session_idle_deadline;
  const auto completion_deadline = ctx_.settings.request_deadline;
  ctx_.settings.request_deadline = options_.control_deadline;
  control_ = serve::spawn_serve_control(sys_, ctx_);
  server_ = std::make_unique<http::server>(options_.http);
  serve::mount_engine_routes(*server_, sys_, control_, ctx_);

  completions_route_config rc;
  rc.served_model = ctx_.settings.model_name;
  rc.model = {model.vocab_size, model.max_position_embeddings};
  rc.strict = options_.strict_vllm;
  rc.request_deadline = completion_deadline;
  if (ctx_.settings.coordinated) // the router numbers the requests it sends this engine from 2^56
    rc.first_request_id = serve_node_first_request_id;
  rc.label = [labels = ctx_.labels](std::uint64_t v) { return labels->label_of(v); };
  // /abort_requests finds a completion by its id; choice i > 0 as "ID-i".
  auto name = [](const std::string& id, std::size_t i) { return i == 0 ? id : id + "-" + std::to_string(i); };
  rc.on_start = [requests = ctx_.requests, name](const std::string& id, const std::vector<std::uint64_t>& ids) {
    for (std::size_t i = 0; i < ids.size(); ++i)
      requests->add(name(id, i), ids[i]);
  };
  rc.on_end = [requests = ctx_.requests, name](const std::string& id, const std::vector<std::uint64_t>& ids) {
    for (std::size_t i = 0; i < ids.size(); ++i)
      requests->remove(name(id, i));
  };
  completions_ = std::make_unique<completions_route>(
    sys_, std::move(rc), target_of(caf::actor_cast<rollout_engine_actor>(ctx_.engine)));
  completions_->mount(*server_);
  metrics::mount_metrics(*server_, metrics_); // vLLM's engine metrics, behind the token when one is set
}

serve_node::~serve_node() { stop(); }

std::uint16_t serve_node::start() { return server_->start(); }

void serve_node::stop() {
  if (stopped_)
    return;
  stopped_ = true;
  if (server_)
    server_->stop();
  // Waited for, not just told: the engine records into metrics_, which
  // this object owns, until it has stopped (bounded: never a hang).
  std::vector<caf::actor> actors;
  if (control_)
    actors.push_back(control_);
  if (owns_engine_)
    actors.push_back(caf::actor_cast<caf::actor>(ctx_.engine));
  stop_and_await(sys_, std::move(actors));
}

} // namespace rlsync
