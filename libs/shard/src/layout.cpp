// The HyperShard layout algebra (docs/shard.md, "Layouts" to "Uneven dimensions"). Everything here
// follows from two rules: a rank's mesh coordinates are its rank_list position written row-major
// (last axis fastest), and a tensor dim split over axes A is cut into prod(A) blocks numbered by
// the mixed-radix value of the rank's coordinates on A, first axis most significant. Errors carry
// the wording of docs/shard.md, "Validation", so users can grep them.
#include "hp/shard/layout.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <algorithm>
#include <set>

namespace hp::shard {
namespace {

Error bad(std::string message, std::string_view where = {}) {
  return Error(Errc::bad_input, std::move(message), std::string(where));
}

/// "dp*mp": the axes a dim is split over, for messages.
std::string axes_product(const Mesh& mesh, const std::vector<int>& axes) {
  std::vector<std::string> names;
  for (int a : axes) names.push_back(mesh.axes[static_cast<std::size_t>(a)]);
  return fmt::format("{}", fmt::join(names, "*"));
}

std::int64_t position_of(const Mesh& mesh, std::int64_t global_rank) {
  auto it = std::find(mesh.rank_list.begin(), mesh.rank_list.end(), global_rank);
  return it == mesh.rank_list.end() ? -1 : static_cast<std::int64_t>(it - mesh.rank_list.begin());
}

std::vector<std::int64_t> coords_of_position(const Mesh& mesh, std::int64_t pos) {
  std::vector<std::int64_t> c(mesh.dims.size());
  for (std::size_t a = mesh.dims.size(); a-- > 0;) {
    c[a] = pos % mesh.dims[a];
    pos /= mesh.dims[a];
  }
  return c;
}

}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::avg: return "avg";
    case ReduceOp::prod: return "prod";
  }
  return "?";
}

Expected<Mesh> Mesh::make(std::vector<std::int64_t> dims, std::vector<std::string> axes,
                          std::vector<std::int64_t> rank_list) {
  if (dims.size() != axes.size())
    return bad(fmt::format("layout: device_matrix has {} axes but alias_name has {}", dims.size(),
                           axes.size()));
  if (dims.empty()) return bad("layout: device_matrix has no axes");
  std::int64_t size = 1;
  for (std::size_t a = 0; a < dims.size(); ++a) {
    if (dims[a] <= 0) return bad(fmt::format("layout: axis '{}' has size {}", axes[a], dims[a]));
    size *= dims[a];
  }
  std::set<std::string> seen;
  for (std::size_t a = 0; a < axes.size(); ++a) {
    if (axes[a].empty()) return bad(fmt::format("layout: axis {} has an empty alias", a));
    if (axes[a] == "None") return bad("layout: alias 'None' is reserved for an unsplit dim");
    if (!seen.insert(axes[a]).second)
      return bad(fmt::format("layout: alias '{}' appears twice", axes[a]));
  }
  // MindSpore's virtual micro-interleaving axis: only meaningful as the last axis. Its per-rank
  // sub-slice lists are not modelled yet, so a valid use is refused as not implemented.
  for (std::size_t a = 0; a < axes.size(); ++a) {
    if (axes[a] != "interleaved_parallel") continue;
    if (a + 1 != axes.size()) return bad("layout: 'interleaved_parallel' must be the last axis");
    return Error(Errc::not_implemented, "layout: 'interleaved_parallel' is not supported yet");
  }
  if (rank_list.empty()) {
    rank_list.resize(static_cast<std::size_t>(size));
    for (std::int64_t i = 0; i < size; ++i) rank_list[static_cast<std::size_t>(i)] = i;
  }
  if (static_cast<std::int64_t>(rank_list.size()) != size)
    return bad(fmt::format("layout: rank_list has {} entries, mesh has {} devices",
                           rank_list.size(), size));
  std::set<std::int64_t> ranks;
  for (std::int64_t r : rank_list) {
    if (r < 0) return bad(fmt::format("layout: rank_list entry {} is negative", r));
    if (!ranks.insert(r).second)
      return bad(fmt::format("layout: rank {} appears twice in rank_list", r));
  }
  return Mesh{std::move(dims), std::move(axes), std::move(rank_list)};
}

std::int64_t Mesh::size() const {
  std::int64_t n = 1;
  for (std::int64_t d : dims) n *= d;
  return n;
}

int Mesh::axis_index(std::string_view alias) const {
  for (std::size_t a = 0; a < axes.size(); ++a)
    if (axes[a] == alias) return static_cast<int>(a);
  return -1;
}

bool Mesh::holds(std::int64_t global_rank) const { return position_of(*this, global_rank) >= 0; }

std::vector<std::int64_t> Mesh::coords(std::int64_t global_rank) const {
  std::int64_t pos = position_of(*this, global_rank);
  return pos < 0 ? std::vector<std::int64_t>{} : coords_of_position(*this, pos);
}

std::int64_t Mesh::rank_at(const std::vector<std::int64_t>& c) const {
  std::int64_t pos = 0;
  for (std::size_t a = 0; a < dims.size(); ++a) pos = pos * dims[a] + c[a];
  return rank_list[static_cast<std::size_t>(pos)];
}

std::vector<std::int64_t> Mesh::group(std::int64_t global_rank,
                                      const std::vector<int>& group_axes) const {
  std::vector<std::int64_t> c = coords(global_rank);
  if (c.empty()) return {};  // not on the mesh
  std::int64_t n = 1;
  for (int a : group_axes) n *= dims[static_cast<std::size_t>(a)];
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(n));
  for (std::int64_t k = 0; k < n; ++k) {
    // k written mixed-radix over group_axes, the last listed axis fastest.
    std::int64_t rest = k;
    for (std::size_t i = group_axes.size(); i-- > 0;) {
      auto a = static_cast<std::size_t>(group_axes[i]);
      c[a] = rest % dims[a];
      rest /= dims[a];
    }
    out.push_back(rank_at(c));
  }
  return out;
}

std::vector<std::vector<std::int64_t>> Mesh::groups(const std::vector<int>& group_axes) const {
  std::vector<std::vector<std::int64_t>> out;
  for (std::int64_t pos = 0; pos < size(); ++pos) {
    std::vector<std::int64_t> c = coords_of_position(*this, pos);
    bool first = std::all_of(group_axes.begin(), group_axes.end(),
                             [&](int a) { return c[static_cast<std::size_t>(a)] == 0; });
    if (first) out.push_back(group(rank_list[static_cast<std::size_t>(pos)], group_axes));
  }
  return out;
}

Expected<Sharding> parse_tensor_map(const Mesh& mesh,
                                    const std::vector<std::vector<std::string>>& map,
                                    std::string_view tensor, int tensor_rank) {
  if (tensor_rank >= 0 && static_cast<int>(map.size()) != tensor_rank)
    return bad(fmt::format("layout: tensor '{}' has rank {} but layout has {} entries", tensor,
                           tensor_rank, map.size()),
               tensor);
  Sharding s;
  std::vector<int> used_by(mesh.axes.size(), -1);
  for (std::size_t d = 0; d < map.size(); ++d) {
    std::vector<int> axes;
    for (const std::string& alias : map[d]) {
      if (alias == "None") {
        if (map[d].size() > 1)
          return bad(fmt::format("layout: dim {} of '{}' mixes 'None' with axes", d, tensor),
                     tensor);
        continue;
      }
      int a = mesh.axis_index(alias);
      if (a < 0)
        return bad(
            fmt::format("layout: axis '{}' is not in ({})", alias, fmt::join(mesh.axes, ", ")),
            tensor);
      int& owner = used_by[static_cast<std::size_t>(a)];
      if (owner == static_cast<int>(d))
        return bad(fmt::format("layout: axis '{}' appears twice in dim {}", alias, d), tensor);
      if (owner >= 0)
        return bad(fmt::format("layout: axis '{}' shards both dim {} and dim {}", alias, owner, d),
                   tensor);
      owner = static_cast<int>(d);
      axes.push_back(a);
    }
    s.dims.push_back(std::move(axes));
  }
  return s;
}

Status check_sharding(const Mesh& mesh, const Sharding& s, std::string_view tensor) {
  std::vector<int> used_by(mesh.axes.size(), -1);
  for (std::size_t d = 0; d < s.dims.size(); ++d) {
    for (int a : s.dims[d]) {
      if (a < 0 || a >= static_cast<int>(mesh.axes.size()))
        return bad(fmt::format("layout: dim {} of '{}' names mesh axis {}, mesh has {} axes", d,
                               tensor, a, mesh.axes.size()),
                   tensor);
      int& owner = used_by[static_cast<std::size_t>(a)];
      if (owner >= 0)
        return bad(fmt::format("layout: axis '{}' shards both dim {} and dim {}",
                               mesh.axes[static_cast<std::size_t>(a)], owner, d),
                   tensor);
      owner = static_cast<int>(d);
    }
  }
  std::vector<bool> partial(mesh.axes.size(), false);
  for (const PartialAxis& p : s.partial) {
    if (p.axis < 0 || p.axis >= static_cast<int>(mesh.axes.size()))
      return bad(fmt::format("layout: '{}' is partial over mesh axis {}, mesh has {} axes", tensor,
                             p.axis, mesh.axes.size()),
                 tensor);
    const std::string& name = mesh.axes[static_cast<std::size_t>(p.axis)];
    if (used_by[static_cast<std::size_t>(p.axis)] >= 0)
      return bad(
          fmt::format("layout: axis '{}' both shards dim {} of '{}' and holds partial values", name,
                      used_by[static_cast<std::size_t>(p.axis)], tensor),
          tensor);
    if (partial[static_cast<std::size_t>(p.axis)])
      return bad(fmt::format("layout: axis '{}' is partial twice in '{}'", name, tensor), tensor);
    partial[static_cast<std::size_t>(p.axis)] = true;
  }
  return {};
}

Status check_shape(const Mesh& mesh, const Sharding& s, const std::vector<std::int64_t>& shape,
                   std::string_view tensor, Uneven uneven) {
  HP_TRY(check_sharding(mesh, s, tensor));
  if (shape.size() != s.dims.size())
    return bad(fmt::format("layout: tensor '{}' has rank {} but layout has {} entries", tensor,
                           shape.size(), s.dims.size()),
               tensor);
  std::vector<std::int64_t> counts = shard_counts(mesh, s);
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0)
      return bad(fmt::format("layout: dim {} of '{}' has negative size {}", d, tensor, shape[d]),
                 tensor);
    if (uneven == Uneven::reject && shape[d] % counts[d] != 0)
      return bad(fmt::format("layout: dim {} of '{}' ({}) is not divisible by {} ({})", d, tensor,
                             shape[d], counts[d], axes_product(mesh, s.dims[d])),
                 tensor);
  }
  return {};
}

std::vector<std::int64_t> shard_counts(const Mesh& mesh, const Sharding& s) {
  std::vector<std::int64_t> counts;
  for (const auto& axes : s.dims) {
    std::int64_t n = 1;
    for (int a : axes) n *= mesh.dims[static_cast<std::size_t>(a)];
    counts.push_back(n);
  }
  return counts;
}

Range chunk_range(std::int64_t n_global, std::int64_t parts, std::int64_t k, Uneven uneven) {
  if (uneven == Uneven::reject) {
    std::int64_t len = n_global / parts;
    return {k * len, (k + 1) * len};
  }
  std::int64_t chunk = (n_global + parts - 1) / parts;
  return {std::min(n_global, k * chunk), std::min(n_global, (k + 1) * chunk)};
}

std::vector<Range> slice_of(const Mesh& mesh, const Sharding& s,
                            const std::vector<std::int64_t>& shape, std::int64_t global_rank,
                            Uneven uneven) {
  std::vector<std::int64_t> c = mesh.coords(global_rank);
  if (c.empty()) return {};  // not on the mesh (a precondition; never index past the coordinates)
  std::vector<Range> out;
  for (std::size_t d = 0; d < s.dims.size(); ++d) {
    std::int64_t n = 1, id = 0;
    for (int a : s.dims[d]) {
      auto ai = static_cast<std::size_t>(a);
      n *= mesh.dims[ai];
      id = id * mesh.dims[ai] + c[ai];
    }
    out.push_back(chunk_range(shape[d], n, id, uneven));
  }
  return out;
}

std::vector<std::int64_t> local_shape(const Mesh& mesh, const Sharding& s,
                                      const std::vector<std::int64_t>& shape,
                                      std::int64_t global_rank, Uneven uneven) {
  std::vector<std::int64_t> out;
  for (const Range& r : slice_of(mesh, s, shape, global_rank, uneven)) out.push_back(r.size());
  return out;
}

std::int64_t repeat_num(const Mesh& mesh, const Sharding& s) {
  std::int64_t used = 1;
  for (std::int64_t n : shard_counts(mesh, s)) used *= n;
  return mesh.size() / used;
}

bool varies_on_last_axis(const Mesh& mesh, const Sharding& s) {
  const int last = static_cast<int>(mesh.axes.size()) - 1;
  if (last < 0 || mesh.dims[static_cast<std::size_t>(last)] < 2) return false;
  for (const auto& d : s.dims)
    if (std::find(d.begin(), d.end(), last) != d.end()) return true;
  for (const auto& a : s.partial)
    if (a.axis == last) return true;
  return false;
}

std::vector<int> unused_axes(const Mesh& mesh, const Sharding& s) {
  std::vector<bool> used(mesh.axes.size(), false);
  for (const auto& axes : s.dims)
    for (int a : axes) used[static_cast<std::size_t>(a)] = true;
  std::vector<int> out;
  for (std::size_t a = 0; a < used.size(); ++a)
    if (!used[a]) out.push_back(static_cast<int>(a));
  return out;
}

std::vector<std::vector<std::int64_t>> replication_groups(const Mesh& mesh, const Sharding& s) {
  return mesh.groups(unused_axes(mesh, s));
}

std::vector<std::vector<int>> tensor_map_ints(const Mesh& mesh, const Sharding& s) {
  std::vector<std::vector<int>> out;
  const int n = static_cast<int>(mesh.axes.size());
  for (const auto& axes : s.dims) {
    std::vector<int> ints;
    for (int a : axes) ints.push_back(n - 1 - a);
    if (ints.empty()) ints.push_back(-1);
    out.push_back(std::move(ints));
  }
  return out;
}

std::string format_sharding(const Mesh& mesh, const Sharding& s) {
  std::vector<std::string> entries;
  for (const auto& axes : s.dims) {
    std::vector<std::string> names;
    for (int a : axes) names.push_back(mesh.axes[static_cast<std::size_t>(a)]);
    if (names.empty())
      entries.emplace_back("None");
    else if (names.size() == 1)
      entries.push_back(names[0]);
    else
      entries.push_back(fmt::format("({})", fmt::join(names, ", ")));
  }
  std::string out = fmt::format("({})", fmt::join(entries, ", "));
  if (s.partial.empty()) return out;
  // Group the partial axes by op, ops in order of first appearance: " partial(sum: dp, mp; max:
  // sp)".
  std::vector<std::string> parts;
  std::vector<ReduceOp> ops;
  for (const PartialAxis& p : s.partial)
    if (std::find(ops.begin(), ops.end(), p.op) == ops.end()) ops.push_back(p.op);
  for (ReduceOp op : ops) {
    std::vector<std::string> names;
    for (const PartialAxis& p : s.partial)
      if (p.op == op) names.push_back(mesh.axes[static_cast<std::size_t>(p.axis)]);
    parts.push_back(fmt::format("{}: {}", reduce_op_name(op), fmt::join(names, ", ")));
  }
  return fmt::format("{} partial({})", out, fmt::join(parts, "; "));
}

}  // namespace hp::shard
