// The manifest of a prepared recipe, and writing the partition directory atomically.
#include <fmt/core.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <tuple>

#include "hp/core/fs.h"
#include "hp/shard/shard.h"

namespace hp::shard {
namespace {

namespace fs = std::filesystem;

std::vector<std::vector<std::string>> alias_map(const Mesh& m, const Sharding& s) {
  std::vector<std::vector<std::string>> out;
  for (const auto& e : s.dims) {
    std::vector<std::string> names;
    for (int a : e) names.push_back(m.axes[static_cast<std::size_t>(a)]);
    out.push_back(std::move(names));
  }
  return out;
}

// One file per rank, or per (rank, chunk) with interleaved virtual stages.
std::string rank_file(std::int64_t rank, int stage, std::int64_t pp, std::int64_t v) {
  return v > 1 ? fmt::format("rank{}.c{}.onnx", rank, stage / pp)
               : fmt::format("rank{}.onnx", rank);
}

std::int64_t chunks_of(const Prepared& p) {
  const auto& par = p.recipe.parallel;
  return par.schedule == recipe::Schedule::interleaved ? par.virtual_stages : 1;
}

Status write_plain(const fs::path& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
  f.close();
  if (!f) return Error(Errc::runtime, "could not write the file", path.string());
  return {};
}

}  // namespace

Manifest make_manifest(const Prepared& p) {
  const auto& mesh = p.prop.mesh;
  const auto& r = p.recipe;
  Manifest m;
  m.model = p.model_path.filename().string();
  m.recipe = p.recipe_path.filename().string();
  m.dp = r.parallel.dp;
  m.tp = r.parallel.tp;
  m.pp = r.parallel.pp;
  m.virtual_stages = chunks_of(p);
  m.device_matrix = mesh.dims;
  m.alias_name = mesh.axes;
  m.dims = p.dims;
  m.micro_batches = p.micro_batches;
  for (const auto& st : p.plan.stages) {
    for (std::size_t pos = 0; pos < st.ranks.size(); ++pos) {
      auto c = mesh.coords(static_cast<std::int64_t>(pos));
      m.ranks.push_back({st.ranks[pos], st.index,
                         rank_file(st.ranks[pos], st.index, m.pp, m.virtual_stages),
                         c[static_cast<std::size_t>(p.dp_axis)],
                         c[static_cast<std::size_t>(p.tp_axis)], st.index});
    }
    m.stages.push_back({st.index, st.layers, st.ranks});
    for (auto [axis, kind] : {std::pair{p.tp_axis, "tp"}, std::pair{p.dp_axis, "dp"}}) {
      auto groups = mesh.groups({axis});
      for (std::size_t i = 0; i < groups.size(); ++i) {
        std::vector<std::int64_t> members;
        for (auto pos : groups[i]) members.push_back(st.ranks[static_cast<std::size_t>(pos)]);
        m.groups.push_back({fmt::format("{}.s{}.{}", kind, st.index, i), kind, members});
      }
    }
  }
  std::sort(m.ranks.begin(), m.ranks.end(), [](const auto& a, const auto& b) {
    return std::tie(a.rank, a.stage) < std::tie(b.rank, b.stage);
  });
  if (!p.plan.stages.empty())
    for (std::size_t pos = 0; pos < p.plan.stages[0].ranks.size(); ++pos) {
      std::vector<std::int64_t> members;
      for (const auto& st : p.plan.stages)
        if (st.index < m.pp)
          members.push_back(st.ranks[pos]);  // chunks of a rank are on the same ranks
      m.groups.push_back({fmt::format("pp.{}", pos), "pp", members});
    }
  for (const auto& b : p.plan.boundaries)
    m.boundaries.push_back({p.graph.tensor(b.tensor).name, b.from_stage, b.to_stage, b.tag});
  for (std::size_t t = 0; t < p.graph.tensors.size(); ++t) {
    const auto& tensor = p.graph.tensors[t];
    if (tensor.kind == model::TensorKind::shape || tensor.kind == model::TensorKind::constant)
      continue;
    if (tensor.kind == model::TensorKind::initializer && tensor.consumers.empty()) continue;
    // A tensor whose shape is known only when it runs (a data-dependent routing loop's rows) is
    // whole on every rank (propagate.cpp, whole_on_every_rank); the manifest lists static shapes.
    if (!tensor.has_shape || std::any_of(tensor.dims.begin(), tensor.dims.end(),
                                         [](const model::Dim& d) { return !d.known(); }))
      continue;
    const auto& s = p.prop.layout[t];
    ManifestLayout l;
    l.tensor = tensor.name;
    l.shape = global_shape(tensor);
    l.tensor_map = alias_map(mesh, s);
    for (const auto& pa : s.partial)
      l.partial.push_back(mesh.axes[static_cast<std::size_t>(pa.axis)]);
    l.origin = p.prop.origin[t];
    m.layouts.push_back(std::move(l));
  }
  for (const auto& rd : p.prop.redistributions) {
    ManifestRedistribution x;
    x.tensor = p.graph.tensor(rd.tensor).name;
    x.consumer = rd.node >= 0 ? p.graph.node(rd.node).name : "";
    x.from = format_sharding(mesh, rd.from);
    x.to = format_sharding(mesh, rd.to);
    std::string d = describe_plan(mesh, rd.plan);
    for (std::size_t a = 0, b; a < d.size(); a = b + 1) {
      b = d.find('\n', a);
      if (b == std::string::npos) b = d.size();
      if (b > a) x.steps.push_back(d.substr(a, b - a));
    }
    m.redistributions.push_back(std::move(x));
  }
  // The graph's inputs and outputs as the ranks hold them: an output's final layout is the one its
  // graph-output redistribution (node -1) leaves, if any.
  const std::string last =
      fmt::format("stage {}", p.plan.stages.empty() ? 0 : p.plan.stages.back().index);
  auto io = [&](int t, const Sharding& s, std::string origin) {
    ManifestLayout l;
    l.tensor = p.graph.tensor(t).name;
    l.shape = global_shape(p.graph.tensor(t));
    l.tensor_map = alias_map(mesh, s);
    for (const auto& pa : s.partial)
      l.partial.push_back(mesh.axes[static_cast<std::size_t>(pa.axis)]);
    l.origin = std::move(origin);
    return l;
  };
  // Batched inputs: axis 0 is one of the batch dims (by the model's declared dim name). Every
  // output of a micro-batched run is concatenated along axis 0.
  const auto& proto_inputs = p.model.proto->graph().input();
  for (int t : p.graph.inputs) {
    auto l = io(t, p.prop.layout[static_cast<std::size_t>(t)], "graph input");
    for (const auto& in : proto_inputs) {
      const auto& shape = in.type().tensor_type().shape();
      if (in.name() == l.tensor && shape.dim_size() > 0 && shape.dim(0).has_dim_param())
        l.batched = p.micro_batches > 1 && p.batch_dims.count(shape.dim(0).dim_param()) > 0;
    }
    m.inputs.push_back(std::move(l));
  }
  for (int t : p.graph.outputs) {
    Sharding s = p.prop.layout[static_cast<std::size_t>(t)];
    for (const auto& rd : p.prop.redistributions)
      if (rd.node < 0 && rd.tensor == t) s = rd.to;
    auto l = io(t, s, last);
    l.batched = p.micro_batches > 1 && !l.shape.empty();
    m.outputs.push_back(std::move(l));
  }
  return m;
}

Expected<ShardReport> write_partitions(const Prepared& p, const fs::path& out_dir,
                                       const OutputDirOptions& guard) {
  OutputDirOptions o = guard;
  if (o.writer.empty()) o.writer = "hp shard";
  // Never over the model the partitions come from (nor a directory holding it).
  o.inputs.push_back(p.model_path);
  // Shard directories written before the marker existed hold only these.
  o.legacy = {"manifest.toml", "rank*.onnx", "rank*.onnx.data"};
  int files = 0, comm = 0, sends = 0;
  std::vector<std::string> written;
  std::int64_t weight_bytes = 0;
  bool weights = true;
  Manifest m = make_manifest(p);
  HP_TRY(replace_output_dir(
      out_dir,
      [&](const fs::path& tmp) -> Status {
        for (const auto& st : p.plan.stages)
          for (std::size_t pos = 0; pos < st.ranks.size(); ++pos) {
            HP_ASSIGN_OR_RETURN(auto part,
                                build_partition(p.plan, st.index, static_cast<std::int64_t>(pos)));
            const std::string name =
                rank_file(part.rank, part.stage, p.recipe.parallel.pp, chunks_of(p));
            HP_TRY(write_plain(tmp / name, part.onnx));
            written.push_back(name);
            ++files;
            comm += part.comm_nodes;
            sends += part.sends;
            weight_bytes += part.weight_bytes;
            weights = weights && part.weights_written;
          }
        m.weights = weights;
        return write_plain(tmp / "manifest.toml", format_manifest(m));
      },
      o));
  ShardReport rep;
  rep.summary = fmt::format(
      "wrote {} rank partitions (dp={} tp={} pp={}) and manifest.toml to {}\n"
      "  {} layouts, {} redistributions ({} comm nodes over all ranks), {} pipeline boundaries ({} "
      "sends)\n"
      "  weights: {}\n",
      files, m.dp, m.tp, m.pp, out_dir.string(), m.layouts.size(), m.redistributions.size(), comm,
      m.boundaries.size(), sends,
      weights ? fmt::format("{} bytes over all ranks", weight_bytes)
              : std::string("not written (the model has no weight data; shapes only)"));
  for (const auto& n : p.prop.notes) rep.summary += "  note: " + n + "\n";
  written.push_back("manifest.toml");
  written.push_back(kOutputMarker);
  nlohmann::ordered_json j{{"dir", out_dir.string()},
                           {"dp", m.dp},
                           {"tp", m.tp},
                           {"pp", m.pp},
                           {"files", written},
                           {"layouts", m.layouts.size()},
                           {"redistributions", m.redistributions.size()},
                           {"comm_nodes", comm},
                           {"boundaries", m.boundaries.size()},
                           {"sends", sends},
                           {"weights_written", weights},
                           {"weight_bytes", weights ? weight_bytes : 0}};
  j["notes"] = p.prop.notes;
  rep.json = j.dump();
  return rep;
}

}  // namespace hp::shard
