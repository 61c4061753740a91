// config.json in Hugging Face's style, read with Boost.PropertyTree's strict
// JSON parser (it keeps values as text; we convert and check each field).
#include "runtime/config/model_config.hpp"

#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace rlsync {

namespace {

namespace pt = boost::property_tree;

[[noreturn]] void fail(const std::string& path, const std::string& field, const std::string& why) {
  throw std::runtime_error(path + ": " + field + ": " + why);
}

std::int64_t read_int(const pt::ptree& root, const std::string& path, const char* field,
                      const std::int64_t* fallback) {
  auto child = root.get_child_optional(field);
  if (!child) {
    if (fallback)
      return *fallback;
    fail(path, field, "missing required field");
  }
  if (!child->empty())
    fail(path, field, "expected an integer, got an object or array");
  const std::string& text = child->data();
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE)
    fail(path, field, "expected an integer, got '" + text + "'");
  return v;
}

double read_double(const pt::ptree& root, const std::string& path, const char* field, double fallback) {
  auto child = root.get_child_optional(field);
  if (!child)
    return fallback;
  const std::string& text = child->data();
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  if (!child->empty() || text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
    fail(path, field, "expected a number, got '" + text + "'");
  return v;
}

bool read_bool(const pt::ptree& root, const std::string& path, const char* field, bool fallback) {
  auto child = root.get_child_optional(field);
  if (!child)
    return fallback;
  if (child->data() == "true" && child->empty())
    return true;
  if (child->data() == "false" && child->empty())
    return false;
  fail(path, field, "expected true or false, got '" + child->data() + "'");
}

} // namespace

model_config read_config_json(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    fail(path, "config.json", "cannot open file");
  pt::ptree root;
  try {
    pt::read_json(in, root);
  } catch (const pt::json_parser_error& e) {
    throw std::runtime_error(path + ":" + std::to_string(e.line()) + ": invalid JSON: " + e.message());
  }
  model_config c;
  c.vocab_size = read_int(root, path, "vocab_size", nullptr);
  c.hidden_size = read_int(root, path, "hidden_size", nullptr);
  c.intermediate_size = read_int(root, path, "intermediate_size", nullptr);
  c.num_hidden_layers = read_int(root, path, "num_hidden_layers", nullptr);
  c.num_attention_heads = read_int(root, path, "num_attention_heads", nullptr);
  c.num_key_value_heads = read_int(root, path, "num_key_value_heads", &c.num_attention_heads);
  c.max_position_embeddings = read_int(root, path, "max_position_embeddings", &c.max_position_embeddings);
  c.rms_norm_eps = read_double(root, path, "rms_norm_eps", c.rms_norm_eps);
  c.rope_theta = read_double(root, path, "rope_theta", c.rope_theta);
  c.tie_word_embeddings = read_bool(root, path, "tie_word_embeddings", c.tie_word_embeddings);
  auto errs = validate(c);
  if (!errs.empty())
    throw std::runtime_error(path + ": " + errs.front());
  return c;
}

void write_config_json(const std::string& path, const model_config& c) {
  std::ostringstream os;
  os.precision(17);
  os << "{\n"
     << "  \"architectures\": [\"LlamaForCausalLM\"],\n"
     << "  \"model_type\": \"llama\",\n"
     << "  \"hidden_act\": \"silu\",\n"
     << "  \"vocab_size\": " << c.vocab_size << ",\n"
     << "  \"hidden_size\": " << c.hidden_size << ",\n"
     << "  \"intermediate_size\": " << c.intermediate_size << ",\n"
     << "  \"num_hidden_layers\": " << c.num_hidden_layers << ",\n"
     << "  \"num_attention_heads\": " << c.num_attention_heads << ",\n"
     << "  \"num_key_value_heads\": " << c.num_key_value_heads << ",\n"
     << "  \"max_position_embeddings\": " << c.max_position_embeddings << ",\n"
     << "  \"rms_norm_eps\": " << c.rms_norm_eps << ",\n"
     << "  \"rope_theta\": " << c.rope_theta << ",\n"
     << "  \"tie_word_embeddings\": " << (c.tie_word_embeddings ? "true" : "false") << ",\n"
     << "  \"bos_token_id\": " << token_bos << ",\n"
     << "  \"eos_token_id\": " << token_eos << "\n"
     << "}\n";
  std::ofstream out(path, std::ios::trunc);
  out << os.str();
  if (!out)
    throw std::runtime_error(path + ": cannot write file");
}

} // namespace rlsync
