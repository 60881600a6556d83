// HyperShard layouts (docs/shard.md, "Layouts" to "Partial state"): a logical device mesh, and per
// tensor dimension the mesh axes it is split over. Semantics exactly as HyperParallel's Layout:
// rank_list[i] is the global rank at row-major mesh position i (last axis fastest); a tuple entry
// splits one dimension over several axes, first axis major; the integer tensor_map counts axes from
// the right and exists only for interop.
//
// Contract shared by the layout algebra, redistribution planning, propagation and partitioning.
// Axes are stored as indices into Mesh::axes (0 = the first alias, the slowest-varying axis).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hp/core/expected.h"

namespace hp::shard {

/// Layout(device_matrix, alias_name, rank_list): the logical mesh.
struct Mesh {
  std::vector<std::int64_t> dims;       ///< device_matrix
  std::vector<std::string> axes;        ///< alias_name, one unique name per axis ("None" reserved)
  std::vector<std::int64_t> rank_list;  ///< size == prod(dims); iota when not given

  /// Validates (docs/shard.md, "Validation": axis count vs names, sizes > 0, unique non-"None"
  /// aliases, rank_list length/duplicates/negatives) and fills rank_list. Errors are
  /// Errc::bad_input with the messages listed there ("layout: rank_list has 6 entries, mesh has 8
  /// devices").
  static Expected<Mesh> make(std::vector<std::int64_t> dims, std::vector<std::string> axes,
                             std::vector<std::int64_t> rank_list = {});

  std::int64_t size() const;                     ///< prod(dims)
  int axis_index(std::string_view alias) const;  ///< -1 when absent
  bool holds(std::int64_t global_rank) const;
  /// Mesh coordinates of a global rank (one per axis); the rank must be in rank_list.
  std::vector<std::int64_t> coords(std::int64_t global_rank) const;
  std::int64_t rank_at(const std::vector<std::int64_t>& coords) const;
  /// The ranks whose coordinates differ from `global_rank`'s only on `axes`, ordered by the
  /// mixed-radix number of those coordinates (first listed axis major): the chunk order for gathers
  /// and splits. Empty for a rank not on the mesh.
  std::vector<std::int64_t> group(std::int64_t global_rank, const std::vector<int>& axes) const;
  /// Every such group, each ordered as group(), groups ordered by their smallest mesh position.
  std::vector<std::vector<std::int64_t>> groups(const std::vector<int>& axes) const;
  friend bool operator==(const Mesh&, const Mesh&) = default;
};

enum class ReduceOp { sum, max, min, avg, prod };
const char* reduce_op_name(ReduceOp op);  ///< "sum", ... (also the hp.AllReduce `op` attribute)

/// A pending reduction over one mesh axis (Partial(op)).
struct PartialAxis {
  int axis = 0;
  ReduceOp op = ReduceOp::sum;
  friend bool operator==(const PartialAxis&, const PartialAxis&) = default;
};

/// How one tensor is laid out on a mesh.
struct Sharding {
  std::vector<std::vector<int>>
      dims;                          ///< per tensor dim: mesh axis indices, first major; {} = None
  std::vector<PartialAxis> partial;  ///< axes holding partial values (never also sharding a dim)
  friend bool operator==(const Sharding&, const Sharding&) = default;

  static Sharding replicated(std::size_t rank) {
    return Sharding{std::vector<std::vector<int>>(rank), {}};
  }
};

/// Uneven dimensions: rejected (default), or split torch.chunk-style: chunk = ceil(N / n), shard k
/// holds [k*chunk, min(N, (k+1)*chunk)), so trailing shards may be short or empty.
enum class Uneven { reject, chunk };

/// Parses a tensor_map given as aliases: per dim "None", an alias, or several aliases (a tuple).
/// Errors (bad_input, `where` = tensor name): unknown alias, an axis used twice (also inside
/// tuples), length != tensor rank when `tensor_rank` >= 0.
Expected<Sharding> parse_tensor_map(const Mesh& mesh,
                                    const std::vector<std::vector<std::string>>& map,
                                    std::string_view tensor, int tensor_rank = -1);

/// Checks a Sharding built in code against the mesh: axis indices in range, no axis on two dims or
/// twice in one, partial axes neither sharding a dim nor listed twice. check_shape calls it.
Status check_sharding(const Mesh& mesh, const Sharding& s, std::string_view tensor);

/// Checks `shape` against the sharding: rank match, and (Uneven::reject) every dim divisible by its
/// shard count: "layout: dim 0 of 'w' (5) is not divisible by 4 (dp*mp)".
Status check_shape(const Mesh& mesh, const Sharding& s, const std::vector<std::int64_t>& shape,
                   std::string_view tensor, Uneven uneven = Uneven::reject);

/// Half-open index range of one dimension.
struct Range {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
  friend bool operator==(const Range&, const Range&) = default;
};

/// Block k of `parts` of a dim of n_global elements (reject: n_global / parts each; chunk: as
/// above).
Range chunk_range(std::int64_t n_global, std::int64_t parts, std::int64_t k,
                  Uneven uneven = Uneven::reject);
/// Mesh axes no dim of `s` is split over (ascending): the axes its replicas (or partial addends)
/// span.
std::vector<int> unused_axes(const Mesh& mesh, const Sharding& s);
/// Whether members along the mesh's last axis (tp on the [dp, tp] stage mesh) hold different
/// values of `s`: it splits a dim over that axis or is partial over it, and the axis has more
/// than one member. Partitions list such tensors; training all-reduces where they begin.
bool varies_on_last_axis(const Mesh& mesh, const Sharding& s);

/// The slice of the global tensor `global_rank` holds (one Range per dim). Precondition:
/// check_shape. Empty for a rank not on the mesh.
std::vector<Range> slice_of(const Mesh& mesh, const Sharding& s,
                            const std::vector<std::int64_t>& shape, std::int64_t global_rank,
                            Uneven uneven = Uneven::reject);
/// Shard count per dim (prod of the dim's axis sizes).
std::vector<std::int64_t> shard_counts(const Mesh& mesh, const Sharding& s);
/// Local shape on `global_rank` (even: shape / counts).
std::vector<std::int64_t> local_shape(const Mesh& mesh, const Sharding& s,
                                      const std::vector<std::int64_t>& shape,
                                      std::int64_t global_rank, Uneven uneven = Uneven::reject);
/// prod(dims) / prod(sizes of the axes used by dims): how many ranks hold each slice.
std::int64_t repeat_num(const Mesh& mesh, const Sharding& s);
/// Groups of ranks holding the same slice (same values unless partial), each ascending by mesh
/// position.
std::vector<std::vector<std::int64_t>> replication_groups(const Mesh& mesh, const Sharding& s);
/// The integer tensor_map (axis i -> len(axes)-1-i, None -> -1; a tuple gives several) for interop.
std::vector<std::vector<int>> tensor_map_ints(const Mesh& mesh, const Sharding& s);
/// "(dp, (sp, mp), None)" plus " partial(sum: mp)" when partial.
std::string format_sharding(const Mesh& mesh, const Sharding& s);

}  // namespace hp::shard
