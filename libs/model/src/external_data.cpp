// Resolving and confining external data locations (see hp/model/external_data.h for the rule).
#include "hp/model/external_data.h"

#include <fmt/core.h>
#include <onnx/onnx_pb.h>

#include <charconv>

namespace hp::model {
namespace fs = std::filesystem;

namespace {

// The whole string must be a non-negative decimal integer that fits an int64.
bool parse_count(const std::string& s, std::int64_t& out) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && out >= 0;
}

// Is `p` (both lexically normal and absolute) `dir` itself or below it?
bool inside(const fs::path& dir, const fs::path& p) {
  auto d = dir.begin(), q = p.begin();
  for (; d != dir.end(); ++d, ++q) {
    if (d->empty()) continue;  // the trailing "" of "dir/"
    if (q == p.end() || *d != *q) return false;
  }
  return true;
}

}  // namespace

Expected<fs::path> confine_external_path(const fs::path& model_dir, const std::string& location) {
  const fs::path loc(location);
  if (location.empty()) return Error(Errc::bad_input, "external data has no location");
  if (loc.is_absolute() || loc.has_root_name() || loc.has_root_directory())
    return Error(Errc::bad_input,
                 fmt::format("external data location '{}' is an absolute path", location), "",
                 "external data must lie in the model's directory (a relative location)");
  std::error_code ec;
  // weakly_canonical resolves the symlinks of the part that exists and normalises the rest, so
  // "w/../../x" and a symlink to /etc both end up outside.
  const fs::path base = fs::weakly_canonical(fs::absolute(model_dir.empty() ? "." : model_dir), ec);
  if (ec)
    return Error(Errc::bad_input, fmt::format("cannot resolve the model's directory '{}': {}",
                                              model_dir.string(), ec.message()));
  const fs::path target = fs::weakly_canonical(base / loc, ec);
  if (ec || !inside(base, target) || target == base)
    return Error(
        Errc::bad_input,
        fmt::format("external data location '{}' resolves to '{}', outside the model's "
                    "directory '{}'",
                    location, ec ? (base / loc).lexically_normal().string() : target.string(),
                    base.string()),
        "", "external data must lie in the model's directory");
  return (model_dir.empty() ? fs::path(".") : model_dir) / loc;
}

Expected<ExternalData> resolve_external_data(const onnx::TensorProto& t,
                                             const fs::path& model_dir) {
  ExternalData r;
  const std::string name = t.name().empty() ? std::string("<unnamed>") : t.name();
  for (const auto& kv : t.external_data()) {
    if (kv.key() == "location") {
      r.location = kv.value();
    } else if (kv.key() == "offset" || kv.key() == "length") {
      std::int64_t v = 0;
      if (!parse_count(kv.value(), v))
        return Error(Errc::bad_input,
                     fmt::format("tensor '{}': external data {} '{}' is not a non-negative integer",
                                 name, kv.key(), kv.value()));
      (kv.key() == "offset" ? r.offset : r.length) = v;
    }
  }
  if (r.location.empty())
    return Error(Errc::bad_input,
                 fmt::format("tensor '{}' has external data without a location", name));
  auto path = confine_external_path(model_dir, r.location);
  if (!path)
    return Error(Errc::bad_input, fmt::format("tensor '{}': {}", name, path.error().message()), "",
                 path.error().what.hint);
  r.path = std::move(*path);
  return r;
}

}  // namespace hp::model
