// Transpose on the cpu plugin at sizes the ONNX backend tests do not reach: a permutation that
// moves the contiguous axis away from the innermost one runs as a tiled 2-D transpose
// (plugins/cpu/cpu_ops_shape.cpp, transpose_tiles), with tiles cut at ragged edges, the other
// axes as an outer loop, and the tiles split across threads when the tensor is large. Every
// element is compared with the index arithmetic of the ONNX definition, for 1-, 2-, 4- and 8-byte
// elements.
#include <catch2/catch.hpp>

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <vector>

#include "exec_test_util.h"
#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/exec/tensor.h"

using namespace hp;
using namespace hp::exec;
using namespace hp::exec::test;

namespace {

struct Case {
  std::vector<std::int64_t> dims;
  std::vector<std::int64_t> perm;
  int onnx_type;
  int hp_type;
  int bytes;
};

// Runs Transpose(x, perm) where element i of x holds i (truncated to the element's width) and
// checks every output element against x at the permuted index.
void check_transpose(const Case& c) {
  INFO("dims " << c.dims.size() << "-d, perm[0] " << c.perm[0] << ", " << c.bytes << " bytes");
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(14);
  auto* g = m.mutable_graph();
  std::vector<std::int64_t> out_dims;
  for (auto p : c.perm) out_dims.push_back(c.dims[static_cast<std::size_t>(p)]);
  add_value(g->mutable_input(), "x", c.dims, c.onnx_type);
  add_value(g->mutable_output(), "y", out_dims, c.onnx_type);
  auto* n = add_node(g, "Transpose", {"x"}, {"y"}, "t");
  auto* a = n->add_attribute();
  a->set_name("perm");
  a->set_type(onnx::AttributeProto::INTS);
  for (auto p : c.perm) a->add_ints(p);
  fs::path d = temp_dir("transpose");
  auto mm = load(write_model(d, m));
  Backends b = cpu();
  auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
  REQUIRE(ex.ok());

  std::int64_t n_el = 1;
  for (auto v : c.dims) n_el *= v;
  HostTensor x;
  x.name = "x";
  x.dtype = c.hp_type;
  x.dims = c.dims;
  x.data.resize(static_cast<std::size_t>(n_el * c.bytes));
  for (std::int64_t i = 0; i < n_el; ++i) {
    const std::uint64_t v = static_cast<std::uint64_t>(i) * 2654435761u;  // distinct low bytes
    std::memcpy(x.data.data() + i * c.bytes, &v, static_cast<std::size_t>(c.bytes));
  }
  auto out = (*ex)->run({x});
  REQUIRE(out.ok());
  const HostTensor& y = (*out)[0];
  REQUIRE(y.dims == out_dims);
  const std::size_t r = c.dims.size();
  std::vector<std::int64_t> in_st(r, 1);
  for (std::size_t k = r - 1; k-- > 0;) in_st[k] = in_st[k + 1] * c.dims[k + 1];
  std::int64_t bad = 0;
  for (std::int64_t o = 0; o < n_el; ++o) {
    std::int64_t rest = o, src = 0;
    for (std::size_t k = r; k-- > 0;) {
      src += (rest % out_dims[k]) * in_st[static_cast<std::size_t>(c.perm[k])];
      rest /= out_dims[k];
    }
    if (std::memcmp(y.data.data() + o * c.bytes, x.data.data() + src * c.bytes,
                    static_cast<std::size_t>(c.bytes)) != 0)
      ++bad;
  }
  CHECK(bad == 0);
  fs::remove_all(d);
}

}  // namespace

TEST_CASE("transposes that move the contiguous axis give ONNX's values at every size", "[exec]") {
  const std::vector<std::int64_t> attention{3, 37, 4, 29};  // [b, t, h, d] with ragged tiles
  const std::vector<std::vector<std::int64_t>> perms{
      {0, 2, 3, 1},  // attention's key transpose [b, t, h, d] -> [b, h, d, t]
      {0, 2, 1, 3},  // [b, h, t, d]: keeps the innermost axis (rows of memcpy)
      {3, 2, 1, 0},  // reversed
      {0, 3, 1, 2},  // channels-last to channels-first
  };
  for (const auto& p : perms) check_transpose({attention, p, onnx::TensorProto::FLOAT, HP_F32, 4});
  // Large enough (>= 2^16 elements) for the tiles to be split across threads.
  check_transpose({{2, 128, 8, 64}, {0, 2, 3, 1}, onnx::TensorProto::FLOAT, HP_F32, 4});
  check_transpose({{130, 300}, {1, 0}, onnx::TensorProto::FLOAT, HP_F32, 4});
  // Other element widths.
  check_transpose({attention, {0, 2, 3, 1}, onnx::TensorProto::INT64, HP_I64, 8});
  check_transpose({attention, {3, 1, 0, 2}, onnx::TensorProto::UINT8, HP_U8, 1});
  check_transpose({attention, {0, 3, 2, 1}, onnx::TensorProto::FLOAT16, HP_F16, 2});
  // Axes shorter than a tile's minimum keep the row-by-row copy.
  check_transpose({{5, 3, 7}, {2, 1, 0}, onnx::TensorProto::FLOAT, HP_F32, 4});
}
