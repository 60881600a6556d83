// The trained model file: the forward graph as exported, its trainable initializers replaced by the
// trained values.
//
// The copy keeps everything else of the forward proto (opsets, metadata, value infos, initializers
// that are not trained). Weights are written as raw_data, or, when the model would pass the
// threshold, as ONNX external data in one `<file>.data` beside it: protobuf cannot serialize a
// message of 2 GiB, which GPT-2 medium's weights already pass. Every tensor in the data file starts
// at a multiple of 64 bytes so it can be mapped and read with aligned vector loads. Initializers
// the forward model kept in its own external files are copied in too, so the result never points at
// the forward model's directory.
//
// Both files are written with write_file_atomic (temporary file, then rename): the data file first,
// then the model, so the model on disk never refers to data that is not yet there.
#include <fmt/core.h>

#include <map>

#include "hp/core/fs.h"
#include "hp/train/checkpoint.h"
#include "initializer_bytes.h"

namespace hp::train {

namespace fs = std::filesystem;
using exec::HostTensor;

namespace {

constexpr std::uint64_t kAlign = 64;

/// Checks `params` against the forward model's initializers; returns name -> index into params.
Expected<std::map<std::string, std::size_t>> match_params(const onnx::GraphProto& g,
                                                          const std::vector<HostTensor>& params) {
  std::map<std::string, const onnx::TensorProto*> inits;
  for (const auto& t : g.initializer()) inits[t.name()] = &t;
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const HostTensor& p = params[i];
    auto it = inits.find(p.name);
    if (it == inits.end())
      return Error(Errc::bad_input,
                   fmt::format("parameter '{}' is not an initializer of the model", p.name));
    if (!index.emplace(p.name, i).second)
      return Error(Errc::bad_input, fmt::format("parameter '{}' is given twice", p.name));
    const onnx::TensorProto& init = *it->second;
    const std::vector<std::int64_t> dims(init.dims().begin(), init.dims().end());
    if (exec::dtype_to_onnx(p.dtype) != init.data_type() || dims != p.dims)
      return Error(Errc::bad_input,
                   fmt::format("parameter '{}' is {} {}, the model's initializer {} {}", p.name,
                               exec::dtype_label(p.dtype), exec::dims_label(p.dims),
                               exec::dtype_label(exec::dtype_from_onnx(init.data_type())),
                               exec::dims_label(dims)));
    if (static_cast<std::int64_t>(p.data.size()) != p.numel() * exec::dtype_size(p.dtype))
      return Error(Errc::bad_input, fmt::format("parameter '{}' has {} bytes, its dims {} need {}",
                                                p.name, p.data.size(), exec::dims_label(p.dims),
                                                p.numel() * exec::dtype_size(p.dtype)));
  }
  return index;
}

void clear_data(onnx::TensorProto& t) {
  t.clear_raw_data();
  t.clear_float_data();
  t.clear_double_data();
  t.clear_int32_data();
  t.clear_int64_data();
  t.clear_uint64_data();
  t.clear_external_data();
  t.clear_data_location();
}

void add_entry(onnx::TensorProto& t, const std::string& key, const std::string& value) {
  auto* kv = t.add_external_data();
  kv->set_key(key);
  kv->set_value(value);
}

}  // namespace

Status save_model(const model::Model& forward, const std::vector<HostTensor>& params,
                  const fs::path& path, std::uint64_t external_threshold) {
  if (!forward.proto) return Error(Errc::internal, "save_model: the forward model is not loaded");
  const std::string where = path.string();
  HP_ASSIGN_OR_RETURN(auto index, match_params(forward.proto->graph(), params));

  // The bytes of every initializer that will be rewritten: the trained ones, and those the forward
  // model kept externally (read now, before anything is written: `path` may be the forward model).
  onnx::ModelProto out = *forward.proto;
  auto* inits = out.mutable_graph()->mutable_initializer();
  std::vector<std::string> bytes(static_cast<std::size_t>(inits->size()));
  std::vector<bool> moved(bytes.size(), false);
  std::uint64_t total = 0;
  const fs::path source_dir = forward.path.parent_path();
  for (int i = 0; i < inits->size(); ++i) {
    onnx::TensorProto& t = (*inits)[i];
    const auto k = static_cast<std::size_t>(i);
    if (auto it = index.find(t.name()); it != index.end()) {
      const HostTensor& p = params[it->second];
      bytes[k].assign(reinterpret_cast<const char*>(p.data.data()), p.data.size());
      moved[k] = true;
    } else if (is_external(t)) {
      HP_ASSIGN_OR_RETURN(bytes[k], initializer_bytes(t, source_dir, forward.path.string()));
      moved[k] = true;
    }
    total += moved[k] ? bytes[k].size() : t.ByteSizeLong();
  }

  const bool external = total > external_threshold;
  if (external) {
    const std::string location = path.filename().string() + ".data";
    std::string data;
    for (std::size_t k = 0; k < bytes.size(); ++k) {
      if (!moved[k]) continue;
      data.resize((data.size() + kAlign - 1) / kAlign * kAlign, '\0');
      onnx::TensorProto& t = (*inits)[static_cast<int>(k)];
      clear_data(t);
      t.set_data_location(onnx::TensorProto::EXTERNAL);
      add_entry(t, "location", location);
      add_entry(t, "offset", std::to_string(data.size()));
      add_entry(t, "length", std::to_string(bytes[k].size()));
      data += bytes[k];
      std::string().swap(bytes[k]);
    }
    HP_TRY(write_file_atomic(fs::path(path).replace_filename(location), data));
  } else {
    for (std::size_t k = 0; k < bytes.size(); ++k) {
      if (!moved[k]) continue;
      onnx::TensorProto& t = (*inits)[static_cast<int>(k)];
      clear_data(t);
      t.set_raw_data(std::move(bytes[k]));
    }
  }
  std::string serialized;
  if (out.ByteSizeLong() >= (std::uint64_t{1} << 31) || !out.SerializeToString(&serialized))
    return Error(Errc::bad_input,
                 fmt::format("the model is {} bytes, too large for one protobuf message",
                             out.ByteSizeLong()),
                 where, "save with a lower external-data threshold");
  return write_file_atomic(path, serialized);
}

}  // namespace hp::train
