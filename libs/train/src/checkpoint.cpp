// Checkpoint directories (docs/training.md, "Optimizers, checkpoints", gives the layout).
//
// A checkpoint is three files: model.onnx (save_model's output, so the weights load anywhere an
// ONNX model loads), optimizer.bin (the optimizer state tensors, raw little-endian f32 one after
// another) and state.json (the counters and the index of optimizer.bin). state.json is written
// last and read first.
//
// Replacing a checkpoint: the new one is written complete into a temporary sibling directory; then
// the old directory is renamed aside, the new one renamed into place, and only then the old one
// removed. A failure before the swap leaves the old checkpoint untouched; a crash between the two
// renames leaves it under `.<name>.old` beside the new one's temporary directory, and
// load_checkpoint reads that aside copy when `dir` itself is missing.
#include <fmt/core.h>
#include <unistd.h>

#include <map>
#include <nlohmann/json.hpp>

#include "hp/core/fs.h"
#include "hp/core/interrupt.h"
#include "hp/plugin/hp_plugin.h"
#include "hp/train/checkpoint.h"
#include "hp/train/sharded_checkpoint.h"

#include "checkpoint_dir.h"
#include "initializer_bytes.h"

namespace hp::train {

namespace fs = std::filesystem;
using exec::HostTensor;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "hp-train-checkpoint";
constexpr int kVersion = 1;
constexpr const char* kModel = "model.onnx";
constexpr const char* kOptimizer = "optimizer.bin";
constexpr const char* kState = "state.json";

/// The state tensor lists optimizer.bin holds, in file order, with their names in state.json.
struct StateList {
  const char* key;
  std::vector<HostTensor> OptimizerState::*list;
};
constexpr StateList kLists[] = {{"exp_avg", &OptimizerState::exp_avg},
                                {"exp_avg_sq", &OptimizerState::exp_avg_sq}};

fs::path aside_dir(const fs::path& dir, const char* what) {
  const fs::path parent = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
  return parent / fmt::format(".{}.{}", dir.filename().string(), what);
}

Status check_checkpoint(const Checkpoint& c) {
  HP_TRY(parse_optimizer_kind(c.optimizer));
  for (const StateList& l : kLists) {
    const auto& list = c.state.*l.list;
    if (!list.empty() && list.size() != c.params.size())
      return Error(Errc::bad_input,
                   fmt::format("optimizer state has {} {} tensors for {} parameters", list.size(),
                               l.key, c.params.size()));
    for (std::size_t i = 0; i < list.size(); ++i) {
      const HostTensor& t = list[i];
      if (t.dtype != HP_F32 || t.dims != c.params[i].dims ||
          static_cast<std::int64_t>(t.data.size()) != t.numel() * 4)
        return Error(
            Errc::bad_input,
            fmt::format("optimizer state {} of '{}' is {} {} ({} bytes), expected f32 {}", l.key,
                        c.params[i].name, exec::dtype_label(t.dtype), exec::dims_label(t.dims),
                        t.data.size(), exec::dims_label(c.params[i].dims)));
    }
  }
  return {};
}

/// state.json and optimizer.bin's bytes for `c`.
std::pair<std::string, std::string> encode(const Checkpoint& c) {
  json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["step"] = c.step;
  j["data_position"] = c.data_position;
  j["seed"] = c.seed;
  j["optimizer"] = c.optimizer;
  j["optimizer_step"] = c.state.step;
  j["model"] = kModel;
  json params = json::array();
  for (const HostTensor& p : c.params)
    params.push_back({{"name", p.name}, {"dtype", exec::dtype_label(p.dtype)}, {"dims", p.dims}});
  j["params"] = std::move(params);
  if (!c.buffers.empty()) {
    json buffers = json::array();
    for (const HostTensor& b : c.buffers)
      buffers.push_back(
          {{"name", b.name}, {"dtype", exec::dtype_label(b.dtype)}, {"dims", b.dims}});
    j["buffers"] = std::move(buffers);
  }
  std::string bin;
  json state;
  state["file"] = kOptimizer;
  for (const StateList& l : kLists) {
    json entries = json::array();
    for (const HostTensor& t : c.state.*l.list) {
      entries.push_back({{"offset", bin.size()}, {"bytes", t.data.size()}});
      bin.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
    }
    state[l.key] = std::move(entries);
  }
  state["bytes"] = bin.size();
  j["optimizer_state"] = std::move(state);
  return {j.dump(1) + "\n", std::move(bin)};
}

Status write_into(const model::Model& forward, const Checkpoint& c, const fs::path& dir) {
  if (c.buffers.empty()) {
    HP_TRY(save_model(forward, c.params, dir / kModel));
  } else {  // model.onnx holds the buffers beside the parameters
    std::vector<HostTensor> values = c.params;
    values.insert(values.end(), c.buffers.begin(), c.buffers.end());
    HP_TRY(save_model(forward, values, dir / kModel));
  }
  auto [state, bin] = encode(c);
  HP_TRY(write_file_atomic(dir / kOptimizer, bin));
  return write_file_atomic(dir / kState, state);
}

Error fs_error(const std::string& what, const fs::path& p, const std::error_code& ec) {
  return Error(Errc::runtime, fmt::format("{}: {}", what, ec.message()), p.string());
}

}  // namespace

namespace {

// Only an earlier checkpoint is replaced: a directory holding anything else is the user's
// (docs/hardening.md, "Output directories and signals"), unless `force`. Checkpoints written
// before the marker hold only these files.
OutputDirOptions checkpoint_guard(bool force, std::vector<fs::path> inputs) {
  OutputDirOptions guard;
  guard.writer = "hp launch --checkpoint";
  guard.legacy = {kModel, std::string(kModel) + ".data", kOptimizer, kState};
  guard.inputs = std::move(inputs);
  guard.force = force;
  return guard;
}

}  // namespace

Status check_checkpoint_dir(const fs::path& dir, bool force, const std::vector<fs::path>& inputs) {
  return check_output_dir(dir, checkpoint_guard(force, inputs));
}

Status save_checkpoint(const model::Model& forward, const Checkpoint& c, const fs::path& dir,
                       bool force) {
  HP_TRY(check_checkpoint(c));
  const OutputDirOptions guard = checkpoint_guard(force, {});
  HP_TRY(check_output_dir(dir, guard));
  std::error_code ec;
  const fs::path tmp = aside_dir(dir, fmt::format("hp-tmp-{}", ::getpid()).c_str());
  remove_stale_temporaries(tmp.parent_path());
  fs::remove_all(tmp, ec);
  const TemporaryGuard on_signal(tmp);
  if (!fs::create_directories(tmp, ec))
    return fs_error("cannot create the checkpoint directory", tmp, ec);
  Status st = write_into(forward, c, tmp);
  if (st) st = write_output_marker(tmp, guard.writer);
  if (!st) {
    fs::remove_all(tmp, ec);
    return st;
  }
  return detail::swap_checkpoint_into_place(tmp, dir);
}

namespace detail {

fs::path checkpoint_aside(const fs::path& dir, const char* what) { return aside_dir(dir, what); }

Status check_checkpoint_guard(const fs::path& dir, bool force) {
  return check_output_dir(dir, checkpoint_guard(force, {}));
}

Status swap_checkpoint_into_place(const fs::path& tmp, const fs::path& dir) {
  std::error_code ec;
  // The swap: old aside, new in, old removed.
  const fs::path old = aside_dir(dir, "old");
  fs::remove_all(old, ec);
  const bool had_old = fs::exists(dir, ec);
  if (had_old) {
    fs::rename(dir, old, ec);
    if (ec) {
      fs::remove_all(tmp, ec);
      return fs_error("cannot move the previous checkpoint aside", dir, ec);
    }
  }
  fs::rename(tmp, dir, ec);
  if (ec) {
    const Error e = fs_error("cannot move the new checkpoint into place", dir, ec);
    if (had_old) fs::rename(old, dir, ec);
    fs::remove_all(tmp, ec);
    return e;
  }
  fs::remove_all(old, ec);
  return {};
}

}  // namespace detail

namespace {

Error bad(const fs::path& file, const std::string& msg) {
  return Error(Errc::bad_input, msg, file.string());
}

/// The state.json fields, read with type checks (nlohmann throws on a wrong type; the caller turns
/// that into an error naming the file).
struct Index {
  json j;
  /// Tensors model.onnx holds, as state.json lists them.
  struct Listed {
    std::string name, dtype;  // dtype label
    std::vector<std::int64_t> dims;
  };
  std::vector<Listed> params, buffers;
};

Expected<Checkpoint> read_state(const fs::path& dir, Index& index) {
  const fs::path file = dir / kState;
  HP_ASSIGN_OR_RETURN(std::string text, read_file(file));
  Checkpoint c;
  try {
    json j = json::parse(text);
    if (!j.is_object() || j.value("format", "") != kFormat)
      return bad(file, fmt::format("not an hp checkpoint index (no \"format\": \"{}\")", kFormat));
    if (j.at("version").get<int>() != kVersion)
      return bad(file, fmt::format("checkpoint version {} is not supported (this hp reads {})",
                                   j.at("version").dump(), kVersion));
    c.step = j.at("step").get<std::int64_t>();
    c.data_position = j.at("data_position").get<std::int64_t>();
    c.seed = j.at("seed").get<std::uint64_t>();
    c.optimizer = j.at("optimizer").get<std::string>();
    c.state.step = j.at("optimizer_step").get<std::int64_t>();
    if (c.step < 0 || c.data_position < 0 || c.state.step < 0)
      return bad(file, "step, data_position and optimizer_step must not be negative");
    if (!parse_optimizer_kind(c.optimizer).ok())
      return bad(file, fmt::format("unknown optimizer '{}'", c.optimizer));
    auto listed = [](const json& p) {
      return Index::Listed{p.at("name").get<std::string>(), p.at("dtype").get<std::string>(),
                           p.at("dims").get<std::vector<std::int64_t>>()};
    };
    for (const json& p : j.at("params")) index.params.push_back(listed(p));
    if (j.contains("buffers"))
      for (const json& b : j.at("buffers")) index.buffers.push_back(listed(b));
    index.j = std::move(j);
  } catch (const json::exception& e) {
    return bad(file, fmt::format("malformed checkpoint index: {}", e.what()));
  }
  return c;
}

Status read_params(const fs::path& dir, const Index& index, Checkpoint& c) {
  const fs::path file = dir / kModel;
  model::LoadOptions lo;
  lo.mode = model::LoadMode::require_data;
  HP_ASSIGN_OR_RETURN(model::Model m, model::load_model(file, lo));
  std::map<std::string, const onnx::TensorProto*> inits;
  for (const auto& t : m.proto->graph().initializer()) inits[t.name()] = &t;
  auto read = [&](const std::vector<Index::Listed>& list, const char* what,
                  std::vector<HostTensor>& into) -> Status {
    for (const auto& [name, dtype, dims] : list) {
      auto it = inits.find(name);
      if (it == inits.end())
        return bad(file, fmt::format("{} '{}' of {} is not an initializer", what, name, kState));
      HP_ASSIGN_OR_RETURN(HostTensor t, initializer_tensor(*it->second, dir, file.string()));
      if (exec::dtype_label(t.dtype) != dtype || t.dims != dims)
        return bad(file, fmt::format("{} '{}' is {} {}, {} says {} {}", what, name,
                                     exec::dtype_label(t.dtype), exec::dims_label(t.dims), kState,
                                     dtype, exec::dims_label(dims)));
      into.push_back(std::move(t));
    }
    return {};
  };
  HP_TRY(read(index.params, "parameter", c.params));
  return read(index.buffers, "buffer", c.buffers);
}

Status read_optimizer(const fs::path& dir, const Index& index, Checkpoint& c) {
  const fs::path state_file = dir / kState;
  const fs::path file = dir / kOptimizer;
  try {
    const json& s = index.j.at("optimizer_state");
    if (s.at("file").get<std::string>() != kOptimizer)
      return bad(state_file, fmt::format("optimizer_state.file is not '{}'", kOptimizer));
    const auto total = s.at("bytes").get<std::uint64_t>();
    HP_ASSIGN_OR_RETURN(std::string bin, read_file(file));
    if (bin.size() != total)
      return bad(file, fmt::format("has {} bytes, {} says {} (truncated or from another "
                                   "checkpoint)",
                                   bin.size(), kState, total));
    for (const StateList& l : kLists) {
      const json& entries = s.at(l.key);
      if (!entries.is_array() || (!entries.empty() && entries.size() != c.params.size()))
        return bad(state_file, fmt::format("optimizer_state.{} has {} entries for {} parameters",
                                           l.key, entries.size(), c.params.size()));
      auto& list = c.state.*l.list;
      for (std::size_t i = 0; i < entries.size(); ++i) {
        const auto offset = entries[i].at("offset").get<std::uint64_t>();
        const auto bytes = entries[i].at("bytes").get<std::uint64_t>();
        const HostTensor& p = c.params[i];
        if (p.dtype != HP_F32 || bytes != p.data.size())
          return bad(state_file,
                     fmt::format("optimizer_state.{}[{}] has {} bytes, parameter '{}' ({} {}) "
                                 "needs f32 {}",
                                 l.key, i, bytes, p.name, exec::dtype_label(p.dtype),
                                 exec::dims_label(p.dims), p.numel() * 4));
        if (offset > total || bytes > total - offset)
          return bad(state_file, fmt::format("optimizer_state.{}[{}] (offset {}, {} bytes) is "
                                             "outside {}'s {} bytes",
                                             l.key, i, offset, bytes, kOptimizer, total));
        HostTensor t;
        t.name = p.name;
        t.dtype = HP_F32;
        t.dims = p.dims;
        t.data.assign(bin.begin() + static_cast<std::ptrdiff_t>(offset),
                      bin.begin() + static_cast<std::ptrdiff_t>(offset + bytes));
        list.push_back(std::move(t));
      }
    }
  } catch (const json::exception& e) {
    return bad(state_file, fmt::format("malformed checkpoint index: {}", e.what()));
  }
  if (c.optimizer == "adamw" && c.state.exp_avg.empty() != c.state.exp_avg_sq.empty())
    return bad(state_file, "adamw state has exp_avg or exp_avg_sq but not both");
  return {};
}

}  // namespace

Expected<Checkpoint> load_checkpoint(const fs::path& requested) {
  std::error_code ec;
  fs::path dir = requested;
  // A crash between save_checkpoint's two renames leaves only the aside copy.
  if (!fs::exists(dir, ec) && fs::is_directory(aside_dir(requested, "old"), ec))
    dir = aside_dir(requested, "old");
  if (!fs::is_directory(dir, ec)) return bad(requested, "no checkpoint directory here");
  if (is_sharded_checkpoint(dir)) {  // read whole (the callers pick tensors by name)
    HP_ASSIGN_OR_RETURN(auto sharded, ShardedCheckpoint::open(dir));
    return sharded.whole();
  }
  Index index;
  HP_ASSIGN_OR_RETURN(Checkpoint c, read_state(dir, index));
  HP_TRY(read_params(dir, index, c));
  HP_TRY(read_optimizer(dir, index, c));
  return c;
}

Expected<Checkpoint> load_checkpoint(const fs::path& dir, OptimizerKind kind) {
  HP_ASSIGN_OR_RETURN(auto c, load_checkpoint(dir));
  if (c.optimizer != optimizer_name(kind))
    return Error(Errc::bad_input,
                 fmt::format("the checkpoint was written by {}, the recipe trains with another "
                             "optimizer",
                             c.optimizer),
                 dir.string());
  return c;
}

}  // namespace hp::train
