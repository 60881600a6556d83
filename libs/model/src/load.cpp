// Loading and validating ONNX files.
//
// An .onnx file is a protobuf ModelProto. Protobuf is a forgiving format: a random byte string
// often parses "successfully" as a message full of unknown fields, and a truncated file may parse
// up to the cut. So a successful parse proves little; what makes a file a model is its content.
// After parsing we check what every later stage relies on — a graph, an IR version and opset
// imports, every node input defined before use (the graph is in topological order, as ONNX
// requires), every initializer's stored size matching its dims — and report all problems found, not
// just the first.
//
// Weights may live outside the file (data_location = EXTERNAL, `location` relative to the model's
// directory); models over 2 GiB must store them so, because protobuf cannot parse a larger message.
// Planning needs only dims, so we never open those files here: we only stat them, record the absent
// ones, and fail only when the caller asked for the data (LoadMode::require_data).
//
// The checks also guard what comes after the load: libonnx's shape inference crashes (rather than
// fails) on a graph input without an element type, and hp's cost arithmetic would overflow on dims
// near INT64_MAX. So a graph input must have a name and a valid element type, every declared dim
// and every initializer's and Constant's element count must lie within the limits of
// hp/core/checked.h, and a Constant's stored data must match its dims before anything reads it
// (docs/hardening.md, "Bad files"). External data locations must stay inside the model's directory
// (hp/model/external_data.h).
#include <fmt/core.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <climits>
#include <filesystem>
#include <set>
#include <unordered_set>

#include "hp/core/checked.h"
#include "hp/core/fs.h"
#include "hp/model/external_data.h"
#include "hp/model/model.h"
#include "onnx_util.h"

namespace hp::model {
namespace {

namespace fs = std::filesystem;

// A recipe handed where a model is expected ("hp plan recipe.toml") would otherwise fail as a
// corrupt protobuf; its extension or its first meaningful line (a [table] or a key = value) says
// what it is.
bool looks_like_toml(const fs::path& path, std::string_view bytes) {
  if (path.extension() == ".toml") return true;
  std::size_t pos = 0;
  while (pos < bytes.size()) {
    std::size_t end = bytes.find('\n', pos);
    std::string_view line =
        bytes.substr(pos, end == std::string_view::npos ? bytes.npos : end - pos);
    pos = end == std::string_view::npos ? bytes.size() : end + 1;
    std::size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string_view::npos || line[b] == '#') continue;
    line = line.substr(b);
    if (line[0] == '[') return line.find(']') != std::string_view::npos;
    std::size_t eq = line.find('=');
    if (eq == std::string_view::npos) return false;
    std::string_view key = line.substr(0, eq);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.remove_suffix(1);
    // A bare or dotted key (a.b-c_1) or a quoted one; words separated by spaces are no key.
    return !key.empty() &&
           (key.front() == '"' || key.front() == '\'' ||
            key.find_first_not_of(
                "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") ==
                std::string_view::npos);
  }
  return false;
}

Error recipe_given(const std::string& where) {
  return Error(Errc::bad_input, "this is a recipe (TOML), not an onnx model", where,
               "did you mean `hp launch RECIPE` or `hp verify RECIPE`?");
}

constexpr std::size_t kMaxDiagnostics = 20;

struct Checker {
  std::string where;
  std::vector<Diagnostic> diags;
  void fail(std::string message, std::string hint = {}) {
    if (diags.size() < kMaxDiagnostics)
      diags.push_back({where, std::move(message), std::move(hint)});
  }
};

// Number of stored elements in the typed field that holds this data type (ONNX proto comments).
std::int64_t typed_field_count(const onnx::TensorProto& t) {
  using T = onnx::TensorProto;
  switch (t.data_type()) {
    case T::FLOAT:
    case T::COMPLEX64: return t.float_data_size();
    case T::DOUBLE:
    case T::COMPLEX128: return t.double_data_size();
    case T::INT64: return t.int64_data_size();
    case T::UINT32:
    case T::UINT64: return t.uint64_data_size();
    case T::STRING: return t.string_data_size();
    default: return t.int32_data_size();
  }
}

// An initializer's (or, with `files` null, a Constant node's) dims, type and stored data.
void check_initializer(const onnx::TensorProto& t, const fs::path& model_dir, Checker& c,
                       std::map<std::string, ExternalFile>* files,
                       std::string_view kind = "initializer") {
  std::string name = t.name().empty() ? std::string("<unnamed>") : t.name();
  if (t.data_type() <= 0 || t.data_type() > onnx::TensorProto::DataType_MAX)
    return c.fail(fmt::format("{} '{}' has invalid data type {}", kind, name, t.data_type()));
  auto numel = bounded_numel(t.dims());
  if (!numel)
    return c.fail(
        fmt::format("{} '{}' has dims {} beyond hp's limits (each dim at most 2^40, at "
                    "most 2^56 elements)",
                    kind, name, fmt::join(t.dims(), "x")));
  if (t.data_location() == onnx::TensorProto::EXTERNAL) {
    if (!files) return c.fail(fmt::format("{} '{}' has external data", kind, name));
    auto ext = resolve_external_data(t, model_dir);
    if (!ext) return c.fail(ext.error().message(), ext.error().what.hint);
    auto& f = (*files)[ext->location];
    if (f.location.empty()) {
      f.location = ext->location;
      f.path = ext->path;
    }
    std::int64_t length = ext->length >= 0 ? ext->length : *numel * elem_size(t.data_type());
    auto end = checked_add(ext->offset, length);
    if (!end)
      return c.fail(fmt::format("initializer '{}': external data offset {} + length {} overflows",
                                name, ext->offset, length));
    f.bytes_needed = std::max<std::uint64_t>(f.bytes_needed, static_cast<std::uint64_t>(*end));
    ++f.initializers;
    return;
  }
  int es = elem_size(t.data_type());
  if (t.data_type() == onnx::TensorProto::STRING || es == 0) return;
  if (!t.raw_data().empty()) {
    if (static_cast<std::int64_t>(t.raw_data().size()) != *numel * es)
      c.fail(fmt::format("{} '{}' holds {} bytes but its dims need {}", kind, name,
                         t.raw_data().size(), *numel * es));
    return;
  }
  std::int64_t stored = typed_field_count(t);
  std::int64_t want = *numel * (t.data_type() == onnx::TensorProto::COMPLEX64 ||
                                        t.data_type() == onnx::TensorProto::COMPLEX128
                                    ? 2
                                    : 1);
  if (stored != want)
    c.fail(fmt::format("{} '{}' holds {} elements but its dims need {}", kind, name, stored, want));
}

// What libonnx's shape inference reads of the graph inputs without checking: the name it keys
// them by, the element type it dispatches on, and dims it multiplies.
void check_inputs(const onnx::GraphProto& g, Checker& c) {
  std::unordered_set<std::string> inits;
  for (const auto& t : g.initializer()) inits.insert(t.name());
  int index = 0;
  for (const auto& v : g.input()) {
    std::string label = v.name().empty() ? fmt::format("#{}", index) : "'" + v.name() + "'";
    ++index;
    if (inits.count(v.name())) continue;
    if (v.name().empty()) c.fail(fmt::format("graph input {} has an empty name", label));
    if (!v.type().has_tensor_type()) continue;
    const auto& tt = v.type().tensor_type();
    if (tt.elem_type() <= 0 || tt.elem_type() > onnx::TensorProto::DataType_MAX)
      c.fail(fmt::format("graph input {} has invalid element type {}", label, tt.elem_type()));
    for (const auto& d : tt.shape().dim())
      if (d.has_dim_value() && (d.dim_value() < 0 || d.dim_value() > kMaxDim))
        c.fail(
            fmt::format("graph input {} declares dim {}, outside [0, 2^40]", label, d.dim_value()));
  }
}

// Constant nodes carry a tensor as an attribute; the same checks as an initializer's, so a 4-byte
// Constant declared as [2^31] floats is refused here instead of being materialised later.
void check_constants(const onnx::GraphProto& g, const fs::path& dir, Checker& c) {
  for (const auto& n : g.node()) {
    for (const auto& a : n.attribute()) {
      if (a.has_t()) check_initializer(a.t(), dir, c, nullptr, "constant");
      for (const auto& sub : a.graphs()) check_constants(sub, dir, c);
      if (a.has_g()) check_constants(a.g(), dir, c);
    }
  }
}

void check_graph(const onnx::GraphProto& g, Checker& c) {
  std::unordered_set<std::string> defined;
  for (const auto& v : g.input()) defined.insert(v.name());
  for (const auto& t : g.initializer()) defined.insert(t.name());
  if (g.node_size() == 0) c.fail("the graph has no nodes");
  if (g.output_size() == 0) c.fail("the graph has no outputs");
  int index = 0;
  for (const auto& n : g.node()) {
    std::string label =
        n.name().empty() ? fmt::format("#{} ({})", index, n.op_type()) : "'" + n.name() + "'";
    if (n.op_type().empty()) c.fail(fmt::format("node {} has no op type", label));
    for (const auto& in : n.input()) {
      if (in.empty() || defined.count(in)) continue;
      c.fail(fmt::format("node {} uses tensor '{}' that is not defined before it", label, in),
             "every node input must be a graph input, an initializer or an earlier node's output");
    }
    for (const auto& out : n.output()) {
      if (out.empty()) continue;
      if (!defined.insert(out).second)
        c.fail(fmt::format("tensor '{}' is defined twice (node {})", out, label));
    }
    ++index;
  }
  for (const auto& o : g.output())
    if (!defined.count(o.name()))
      c.fail(fmt::format("graph output '{}' is never computed", o.name()));
}

Status check_external_files(Model& m, LoadMode mode) {
  std::vector<Diagnostic> diags;
  for (auto& f : m.external_files) {
    std::error_code ec;
    f.present = fs::is_regular_file(f.path, ec);
    if (!f.present) {
      m.missing_external_data.push_back(f.location);
      if (mode == LoadMode::require_data)
        diags.push_back(
            {m.path.string(),
             fmt::format("external data file '{}' is missing ({} initializers, {} bytes)",
                         f.path.string(), f.initializers, f.bytes_needed),
             "copy the weights next to the model, or plan without them"});
      continue;
    }
    auto size = fs::file_size(f.path, ec);
    if (mode == LoadMode::require_data && !ec && size < f.bytes_needed)
      diags.push_back({m.path.string(),
                       fmt::format("external data file '{}' has {} bytes but the model needs {}",
                                   f.path.string(), size, f.bytes_needed),
                       ""});
  }
  if (diags.empty()) return Status::success();
  return collect_errors(Errc::bad_input, std::move(diags));
}

}  // namespace

Expected<Model> load_model(const fs::path& path, const LoadOptions& options) {
  const std::string where = path.string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return Error(Errc::bad_input, "no such file", where);
  if (fs::is_directory(path, ec))
    return Error(Errc::bad_input, "is a directory, expected an onnx file", where);
  auto size = fs::file_size(path, ec);
  if (ec) return Error(Errc::bad_input, "cannot read: " + ec.message(), where);
  if (size == 0) return Error(Errc::bad_input, "file is empty, expected an onnx model", where);
  if (path.extension() == ".toml") return recipe_given(where);
  if (size > static_cast<std::uintmax_t>(INT_MAX))
    return Error(Errc::bad_input, "model file is larger than 2 GiB, which protobuf cannot parse",
                 where,
                 "save the model with external data (onnx.save(..., save_as_external_data=True))");
  HP_ASSIGN_OR_RETURN(auto bytes, read_file(path));
  return parse_model(bytes, path, options);
}

Expected<Model> parse_model(const std::string& bytes, const fs::path& path,
                            const LoadOptions& options) {
  const std::string where = path.string();
  auto proto = std::make_shared<onnx::ModelProto>();
  if (!proto->ParseFromString(bytes)) {
    if (looks_like_toml(path, bytes)) return recipe_given(where);
    return Error(Errc::bad_input,
                 "not an onnx model: protobuf parse failed (truncated or corrupt file?)", where);
  }
  Checker c{where, {}};
  if (!proto->has_graph()) c.fail("not an onnx model: no graph");
  if (proto->ir_version() <= 0 || proto->ir_version() > 20)
    c.fail(fmt::format("not an onnx model: ir_version {} is out of range", proto->ir_version()));
  if (proto->opset_import_size() == 0) c.fail("not an onnx model: no opset imports");
  for (const auto& op : proto->opset_import())
    if (op.version() <= 0)
      c.fail(fmt::format("opset import '{}' has version {}", op.domain(), op.version()));
  if (!c.diags.empty()) return collect_errors(Errc::bad_input, std::move(c.diags));

  Model m;
  m.path = path;
  m.ir_version = proto->ir_version();
  for (const auto& op : proto->opset_import())
    m.opsets[op.domain() == "ai.onnx" ? "" : op.domain()] = op.version();
  check_graph(proto->graph(), c);
  std::map<std::string, ExternalFile> files;
  fs::path dir = path.parent_path();
  for (const auto& t : proto->graph().initializer()) check_initializer(t, dir, c, &files);
  check_inputs(proto->graph(), c);
  check_constants(proto->graph(), dir, c);
  if (!c.diags.empty()) return collect_errors(Errc::bad_input, std::move(c.diags));
  for (auto& [loc, f] : files) m.external_files.push_back(std::move(f));
  m.proto = std::move(proto);
  HP_TRY(check_external_files(m, options.mode));
  return m;
}

}  // namespace hp::model
