// The `rlsync` Python module's native part (`rlsync._rlsync`): a PyTorch
// trainer publishes its state_dict as an external trainer rank
// (actors/assembly/external_rank.hpp), and topologies validate with the
// same file:line:col errors as `rlsync validate`. Tensors are read through
// their Python attributes (dtype, device, shape, data_ptr), so the module
// links no libtorch: the one copy is external_source::push, made with the
// GIL released. CUDA tensors are handed over by device pointer (after their
// device's current stream finished writing them): the push copies them to
// host memory, and to the trainer's device copy when the backend serves from
// the device.
#include "actors/assembly/external_rank.hpp"
#include "runtime/base/dtype.hpp"
#include "runtime/config/topology.hpp"
#include "runtime/config/topology_names.hpp"
#include "runtime/control/round_figures.hpp"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace py = pybind11;

namespace rlsync::python {

namespace {

[[noreturn]] void raise(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw py::error_already_set();
}

topology load(const std::string& path) {
  try {
    return load_topology(path);
  } catch (const topology_error& e) {
    std::string all;
    for (const auto& line : e.errors)
      all += (all.empty() ? "" : "\n") + line;
    raise(PyExc_ValueError, all);
  }
}

py::dict model_dict(const model_config& c) {
  py::dict d;
  d["vocab_size"] = c.vocab_size;
  d["hidden_size"] = c.hidden_size;
  d["intermediate_size"] = c.intermediate_size;
  d["num_hidden_layers"] = c.num_hidden_layers;
  d["num_attention_heads"] = c.num_attention_heads;
  d["num_key_value_heads"] = c.num_key_value_heads;
  d["max_position_embeddings"] = c.max_position_embeddings;
  d["rms_norm_eps"] = c.rms_norm_eps;
  d["rope_theta"] = c.rope_theta;
  d["tie_word_embeddings"] = c.tie_word_embeddings;
  d["head_dim"] = c.head_dim();
  d["model_type"] = to_string(c.arch);
  if (c.arch == model_arch::qwen3_moe) {
    d["num_experts"] = c.num_experts;
    d["num_experts_per_tok"] = c.num_experts_per_tok;
    d["moe_intermediate_size"] = c.moe_intermediate_size;
    d["norm_topk_prob"] = c.norm_topk_prob;
    d["decoder_sparse_step"] = c.decoder_sparse_step;
    d["mlp_only_layers"] = c.mlp_only_layers;
  }
  return d;
}

/// What Python sees of a topology.
struct topology_view {
  topology t;

  explicit topology_view(const std::string& path) : t(load(path)) {}

  std::string dtype_name() const {
    if (t.model.weights_dtype)
      return std::string(safetensors_name(*t.model.weights_dtype));
    return "checkpoint"; // the checkpoint's tensors decide (TrainerRank knows)
  }
  py::list ranks() const {
    py::list out;
    for (const auto& r : t.trainer.ranks) {
      py::dict d;
      d["node"] = r.node;
      d["layers"] = r.layers;
      if (r.experts)
        d["experts"] = *r.experts;
      else
        d["experts"] = py::none();
      out.append(d);
    }
    return out;
  }
  py::list engines() const {
    py::list out;
    for (const auto& e : t.engines)
      out.append(e.name);
    return out;
  }
  /// "http://address:port" of the head's completions endpoint; None when
  /// router.http_port is absent or ephemeral (0: only its process knows).
  py::object router_url() const {
    if (!t.router.http_port || *t.router.http_port == 0)
      return py::none();
    const node_spec* n = t.find_node(t.router.node);
    return py::str("http://" + n->address + ":" + std::to_string(*t.router.http_port));
  }
};

/// torch.bfloat16 / float16 / float32 -> dtype; anything else refused by name.
dtype dtype_of(const std::string& name, const py::handle& tensor) {
  const std::string torch_name = py::str(tensor.attr("dtype"));
  if (torch_name == "torch.bfloat16")
    return dtype::bf16;
  if (torch_name == "torch.float16")
    return dtype::f16;
  if (torch_name == "torch.float32")
    return dtype::f32;
  raise(PyExc_ValueError,
        "tensor '" + name + "': unsupported dtype " + torch_name + " (publish bf16, f16 or f32, as the topology's model)");
}

bool on_cuda(const py::handle& tensor) {
  return py::hasattr(tensor, "device") && std::string(py::str(tensor.attr("device"))).rfind("cuda", 0) == 0;
}

/// The CUDA device a CUDA tensor is on.
int cuda_index(const py::handle& tensor) {
  auto index = tensor.attr("device").attr("index");
  return index.is_none() ? 0 : index.cast<int>();
}

/// A CUDA tensor copied to host memory by PyTorch (a blocking copy), for a
/// build of rlsync without CUDA, which cannot read device memory itself.
py::object on_host(const std::string& name, const py::handle& tensor) {
  try {
    return tensor.attr("to")("cpu");
  } catch (const py::error_already_set& e) {
    raise(PyExc_RuntimeError, "tensor '" + name + "': copying it from " + std::string(py::str(tensor.attr("device")))
                                + " to host memory failed: " + e.what());
  }
}

/// Waits for the work queued on `device`'s current stream (which wrote the
/// tensors, as PyTorch's contract has it: work on side streams is joined to
/// the current one before its results are used) to finish: rlsync copies
/// them with cudaMemcpy, outside PyTorch's streams. Not the whole device:
/// that would wait for rlsync's own transfers on it too.
void finish_writes(int device, const std::string& first_tensor) {
  try {
    py::module_::import("torch").attr("cuda").attr("current_stream")(device).attr("synchronize")();
  } catch (const py::error_already_set& e) {
    raise(PyExc_RuntimeError, "tensor '" + first_tensor + "': waiting for cuda:" + std::to_string(device)
                                + " to finish writing it failed: " + e.what());
  }
}

/// One state_dict entry as a borrowed tensor_input, or a clear error.
transfer::tensor_input input_of(const std::string& name, const py::handle& tensor) {
  if (!py::hasattr(tensor, "data_ptr") || !py::hasattr(tensor, "is_contiguous"))
    raise(PyExc_TypeError, "tensor '" + name + "': expected a torch.Tensor, got "
                             + std::string(py::str(py::type::of(tensor).attr("__name__"))));
  const std::string device = py::str(tensor.attr("device"));
  if (device != "cpu" && !on_cuda(tensor))
    raise(PyExc_ValueError, "tensor '" + name + "' is on " + device + ": only CPU and CUDA tensors can be published");
  if (py::hasattr(tensor, "layout") && std::string(py::str(tensor.attr("layout"))) != "torch.strided")
    raise(PyExc_ValueError, "tensor '" + name + "': layout " + std::string(py::str(tensor.attr("layout")))
                              + " (only dense tensors can be published)");
  transfer::tensor_input in;
  in.name = name;
  in.type = dtype_of(name, tensor);
  if (!tensor.attr("is_contiguous")().cast<bool>())
    raise(PyExc_ValueError, "tensor '" + name + "' is not contiguous: publish tensor.contiguous()");
  for (auto d : tensor.attr("shape"))
    in.shape.push_back(d.cast<std::int64_t>());
  const auto numel = tensor.attr("numel")().cast<std::uint64_t>();
  const auto element = tensor.attr("element_size")().cast<std::uint64_t>();
  if (element != 0 && numel > UINT64_MAX / element)
    raise(PyExc_ValueError, "tensor '" + name + "': too large");
  in.bytes = numel * element;
  in.data = reinterpret_cast<const void*>(tensor.attr("data_ptr")().cast<std::uintptr_t>());
  if (on_cuda(tensor))
    in.device = cuda_index(tensor);
  return in;
}

py::dict report_dict(const sync_report& r) {
  py::dict d;
  d["version"] = r.version;
  d["engines_synced"] = r.engines_synced;
  d["evicted"] = r.evicted;
  d["stall_ms"] = ms_of(r.stall_ns);
  d["transfer_ms"] = ms_of(r.transfer_ns);
  d["control_ms"] = ms_of(r.control_ns);
  d["bytes"] = r.bytes;
  d["aborted"] = r.aborted;
  for (const auto& [name, value] : slowest_pull_ms(r))
    d[name.c_str()] = value;
  return d;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

py::dict status_dict(const coordinator_status& s) {
  py::dict d;
  d["version"] = s.version;
  d["rounds"] = s.rounds;
  d["live"] = s.live;
  py::dict engines;
  for (const auto& m : s.members) {
    py::dict e;
    e["version"] = m.version;
    e["dirty"] = m.dirty;
    e["node"] = m.node;
    e["incarnation"] = m.incarnation;
    e["routable"] = contains(s.routable, m.name);
    e["reachable"] = !contains(s.unreachable, m.name);
    if (auto it = s.last_evictions.find(m.name); it != s.last_evictions.end())
      e["last_eviction"] = it->second;
    engines[py::str(m.name)] = e;
  }
  d["engines"] = engines;
  d["last_round"] = s.history.empty() ? py::object(py::none()) : py::object(report_dict(s.history.back()));
  py::list ranks;
  for (const auto& r : s.ranks) {
    py::dict e;
    e["rank"] = r.rank;
    e["node"] = r.node;
    e["incarnation"] = r.incarnation;
    e["latest_version"] = r.latest_version;
    e["pinned_version"] = r.pinned_version;
    e["reachable"] = r.reachable;
    ranks.append(e);
  }
  d["ranks"] = ranks;
  d["retired"] = s.retired;
  return d;
}

/// "rollout-0 v3, rollout-1 v4 (dirty), rollout-2 unreachable".
std::string engines_line(const coordinator_status& s) {
  std::string out;
  for (const auto& m : s.members) {
    out += (out.empty() ? "" : ", ") + m.name + " v" + std::to_string(m.version);
    if (m.dirty)
      out += " (dirty)";
    if (contains(s.unreachable, m.name))
      out += " (unreachable)";
  }
  return out.empty() ? "no engine registered" : out;
}

/// The Python TrainerRank: an external_rank, closed by close() or `with`.
class trainer_rank_handle {
public:
  trainer_rank_handle(const py::object& topology_or_path, std::uint32_t rank, const std::optional<std::string>& secret_file,
                      bool allow_nonfinite, bool verbose) {
    topology t = py::isinstance<topology_view>(topology_or_path)
                   ? topology_or_path.cast<const topology_view&>().t
                   : load(py::str(topology_or_path));
    external_rank_options o;
    o.secret_file = secret_file.value_or("");
    o.allow_nonfinite = allow_nonfinite;
    if (verbose)
      o.log = [rank](const std::string& line) {
        std::fprintf(stderr, "rlsync trainer rank %u: %s\n", rank, line.c_str()); // no GIL needed
      };
    try {
      py::gil_scoped_release free; // joining takes up to connect_deadline; other Python threads run
      rank_ = std::make_unique<external_rank>(t, rank, std::move(o));
    } catch (const std::invalid_argument& e) {
      raise(PyExc_ValueError, e.what());
    } catch (const std::exception& e) {
      raise(PyExc_RuntimeError, e.what());
    }
  }

  void publish(std::uint64_t version, const py::object& state_dict) {
    auto& r = open();
    if (!py::hasattr(state_dict, "items"))
      raise(PyExc_TypeError, "publish: expected a mapping of names to tensors (model.state_dict())");
    std::vector<transfer::tensor_input> inputs;
    std::vector<py::object> alive; // the tensors stay referenced through the copy
    // CUDA tensors copied to the host, by storage: a tied model's two names
    // for one storage keep one (external_source checks they share it).
    std::map<std::string, py::object> staged;
    for (auto item : state_dict.attr("items")()) {
      auto pair = item.cast<py::tuple>();
      if (!py::isinstance<py::str>(pair[0]))
        raise(PyExc_TypeError, "publish: tensor names must be strings");
      const std::string name = pair[0].cast<std::string>();
      py::object tensor = py::reinterpret_borrow<py::object>(pair[1]);
      if (on_cuda(tensor) && !r.reads_device_tensors()) {
        const std::string key = std::string(py::str(tensor.attr("device"))) + " "
                                + std::to_string(tensor.attr("data_ptr")().cast<std::uintptr_t>()) + " "
                                + std::string(py::str(tensor.attr("shape"))) + " "
                                + std::string(py::str(tensor.attr("dtype")));
        auto it = staged.find(key);
        if (it == staged.end())
          it = staged.emplace(key, on_host(name, tensor)).first;
        tensor = it->second;
      }
      // The storage too, taken before its address is read: a parameter whose
      // .data another thread replaces meanwhile must not free the bytes the copy reads.
      if (py::hasattr(tensor, "untyped_storage"))
        alive.push_back(tensor.attr("untyped_storage")());
      inputs.push_back(input_of(name, tensor));
      alive.push_back(std::move(tensor));
    }
    std::set<int> synchronized;
    for (const auto& in : inputs)
      if (in.device >= 0 && synchronized.insert(in.device).second)
        finish_writes(in.device, in.name);
    try {
      py::gil_scoped_release free;
      r.publish(version, inputs);
    } catch (const std::invalid_argument& e) {
      raise(PyExc_ValueError, e.what());
    } catch (const std::exception& e) {
      raise(PyExc_RuntimeError, e.what());
    }
  }

  py::dict wait_synced(std::uint64_t version, double timeout_s) {
    auto& r = open();
    if (!(timeout_s >= 0) || !std::isfinite(timeout_s) || timeout_s > 24 * 3600)
      raise(PyExc_ValueError, "wait_synced: timeout_s must be in [0, 86400], got " + topology_names::format_double(timeout_s));
    bool interrupted = false;
    sync_progress p;
    {
      py::gil_scoped_release free;
      p = r.wait_synced(version, std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000)), [&] {
        py::gil_scoped_acquire hold; // Ctrl-C reaches Python between polls
        interrupted = PyErr_CheckSignals() != 0;
        return interrupted;
      });
    }
    if (interrupted)
      throw py::error_already_set();
    if (!p.synced && r.closed())
      raise(PyExc_RuntimeError, "this TrainerRank was closed while waiting for version " + std::to_string(version));
    if (!p.synced)
      raise(PyExc_TimeoutError,
            "version " + std::to_string(version) + " not served by every live engine within "
              + topology_names::format_double(timeout_s) + " s: "
              + (p.answered ? "the fleet is at version " + std::to_string(p.status.version) + " (" + engines_line(p.status)
                                + "); a round needs every rank's publish of a version, and sync.every_versions decides "
                                  "which versions are synced"
                            : std::string("the coordinator did not answer")));
    return status_dict(p.status);
  }

  py::dict status() {
    auto& r = open();
    try {
      coordinator_status s;
      {
        py::gil_scoped_release free;
        s = r.status();
      }
      auto d = status_dict(s);
      d["rank"] = r.rank();
      d["last_published"] = r.last_published();
      return d;
    } catch (const std::exception& e) {
      raise(PyExc_RuntimeError, e.what());
    }
  }

  std::vector<std::string> drill_withhold(std::uint64_t version, double release_after_s) {
    auto& r = open();
    if (!(release_after_s >= 0) || !std::isfinite(release_after_s) || release_after_s > 3600)
      raise(PyExc_ValueError, "release_after_s must be in [0, 3600]");
    return r.drill_withhold(version, std::chrono::milliseconds(static_cast<std::int64_t>(release_after_s * 1000)));
  }

  void close() {
    if (!rank_)
      return;
    py::gil_scoped_release free;
    rank_->close();
  }
  // Collected without close(): the rank closes (joining its threads) without
  // holding the GIL, so other Python threads run meanwhile.
  ~trainer_rank_handle() {
    if (!rank_ || !Py_IsInitialized())
      return;
    py::gil_scoped_release free;
    rank_.reset();
  }

  bool closed() const { return !rank_ || rank_->closed(); }
  std::uint32_t rank() const { return rank_->rank(); }
  std::string node() const { return rank_->node(); }
  std::uint64_t last_published() const { return rank_->last_published(); }
  bool reads_cuda_tensors() const { return rank_->reads_device_tensors(); }
  std::string dtype_name() const { return std::string(safetensors_name(rank_->source().type())); }

private:
  external_rank& open() {
    if (!rank_ || rank_->closed())
      raise(PyExc_RuntimeError, "this TrainerRank is closed");
    return *rank_;
  }

  std::unique_ptr<external_rank> rank_;
};

} // namespace

} // namespace rlsync::python

PYBIND11_MODULE(_rlsync, m) {
  using namespace rlsync::python;
  m.doc() = "rlsync: publish a PyTorch trainer's weights to a fleet of rollout engines";

  py::class_<topology_view>(m, "Topology", "A validated topology (ValueError lists every problem as file:line:col)")
    .def(py::init<const std::string&>(), py::arg("path"))
    .def_property_readonly("path", [](const topology_view& v) { return v.t.source; })
    .def_property_readonly("name", [](const topology_view& v) { return v.t.name; })
    .def_property_readonly("model", [](const topology_view& v) { return model_dict(v.t.model.config); })
    .def_property_readonly("dtype", &topology_view::dtype_name)
    .def_property_readonly("source", [](const topology_view& v) { return std::string(rlsync::to_string(v.t.trainer.source)); })
    .def_property_readonly("ranks", &topology_view::ranks)
    .def_property_readonly("engines", &topology_view::engines)
    .def_property_readonly("router_url", &topology_view::router_url)
    .def("__repr__", [](const topology_view& v) { return "<rlsync.Topology " + v.t.source + ">"; });

  py::class_<rlsync::python::trainer_rank_handle>(m, "TrainerRank")
    .def(py::init<const py::object&, std::uint32_t, const std::optional<std::string>&, bool, bool>(),
         py::arg("topology"), py::arg("rank") = 0, py::kw_only(), py::arg("secret_file") = py::none(),
         py::arg("allow_nonfinite") = false, py::arg("verbose") = false)
    .def("publish", &trainer_rank_handle::publish, py::arg("version"), py::arg("state_dict"))
    .def("wait_synced", &trainer_rank_handle::wait_synced, py::arg("version"), py::arg("timeout_s") = 60.0)
    .def("status", &trainer_rank_handle::status)
    .def("close", &trainer_rank_handle::close)
    // Fault drills: withhold the first group held of `version` (as `rlsync
    // drill` does to a node's ranks) so that a kill lands mid-transfer.
    .def("_drill_withhold", &trainer_rank_handle::drill_withhold, py::arg("version"), py::arg("release_after_s"))
    .def_property_readonly("closed", &trainer_rank_handle::closed)
    .def_property_readonly("rank", &trainer_rank_handle::rank)
    .def_property_readonly("node", &trainer_rank_handle::node)
    .def_property_readonly("dtype", &trainer_rank_handle::dtype_name)
    .def_property_readonly("last_published", &trainer_rank_handle::last_published)
    // True in a build with CUDA: CUDA tensors are read where they lie; else
    // publish copies them to host memory with PyTorch first.
    .def_property_readonly("reads_cuda_tensors", &trainer_rank_handle::reads_cuda_tensors)
    .def("__enter__", [](py::object self) { return self; })
    .def("__exit__", [](trainer_rank_handle& self, const py::object&, const py::object&, const py::object&) {
      self.close();
      return false;
    });
}
