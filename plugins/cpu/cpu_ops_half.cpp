// f16 and bf16 inputs for float kernels: the node runs on f32 copies of its 16-bit inputs and
// every f32 output the kernel asks for is converted back to the 16-bit type. This is what numpy and
// PyTorch's cpu path do for half math (compute in f32, round the result once), so one widening
// step gives every marked kernel the 16-bit types without a second implementation.
//
// Only ops whose float outputs follow their float inputs' type are marked (OpEntry::halves);
// outputs of other dtypes (a comparison's bool, ArgMax's indices) pass through unchanged.
#include <cstring>
#include <vector>

#include "cpu_half.h"
#include "cpu_ops.h"

namespace hp_cpu {
namespace {

struct Widened {
  const hp_op_desc* orig;
  struct Out {
    bool used = false;
    Dims dims;
    std::vector<float> buf;
  };
  std::vector<Out> outs;
};

/// alloc_output seen by the kernel: f32 outputs land in temporaries, others go to the host.
int32_t widened_alloc(void* user, int32_t index, int32_t dtype, int32_t rank, const int64_t* dims,
                      hp_tensor_desc* out) {
  auto* w = static_cast<Widened*>(user);
  if (dtype != HP_F32 || index < 0 || index >= static_cast<int32_t>(w->outs.size()))
    return w->orig->alloc_output(w->orig->alloc_user, index, dtype, rank, dims, out);
  Widened::Out& o = w->outs[static_cast<size_t>(index)];
  o.used = true;
  o.dims.assign(dims, dims + rank);
  o.buf.assign(static_cast<size_t>(std::max<int64_t>(numel(o.dims), 1)), 0.f);
  out->dtype = HP_F32;
  out->rank = rank;
  if (rank > 0)  // a scalar's dims may be null
    std::memcpy(out->dims, dims, sizeof(int64_t) * static_cast<size_t>(rank));
  out->data = o.buf.data();
  return 1;
}

}  // namespace

int half_input_type(const int32_t* dtypes, int64_t n) {
  for (int64_t k = 0; k < n; ++k)
    if (dtypes[k] == HP_F16 || dtypes[k] == HP_BF16) return dtypes[k];
  return -1;
}

void run_widened(const OpEntry& e, const hp_op_desc& d, int half, hp_ctx* ctx, hp_stream* s) {
  std::vector<hp_tensor_desc> ins(d.inputs, d.inputs + d.n_inputs);
  std::vector<std::vector<float>> bufs(ins.size());
  for (size_t k = 0; k < ins.size(); ++k) {
    hp_tensor_desc& t = ins[k];
    if (!t.data && t.dtype < 0) continue;
    if (t.dtype != HP_F16 && t.dtype != HP_BF16) continue;
    if (t.dtype != half) throw OpError("inputs mix float16 and bfloat16", HP_UNSUPPORTED);
    const int64_t n = numel(Dims(t.dims, t.dims + t.rank));
    bufs[k].resize(static_cast<size_t>(std::max<int64_t>(n, 1)));
    const auto* src = static_cast<const uint16_t*>(t.data);
    for (int64_t i = 0; i < n; ++i)
      bufs[k][i] = half == HP_F16 ? half_to_float(src[i]) : bf16_to_float(src[i]);
    t.dtype = HP_F32;
    t.data = bufs[k].data();
  }
  Widened w{&d, std::vector<Widened::Out>(static_cast<size_t>(std::max<int64_t>(d.n_outputs, 0)))};
  hp_op_desc wd = d;
  wd.inputs = ins.data();
  wd.alloc_output = widened_alloc;
  wd.alloc_user = &w;
  OpCall call(wd, ctx, s);
  e.run(call);
  // Convert back through an OpCall on the original desc, so allocation failures read the same.
  OpCall host(d, ctx, s);
  for (size_t k = 0; k < w.outs.size(); ++k) {
    const Widened::Out& o = w.outs[k];
    if (!o.used) continue;
    View y = host.out(static_cast<int64_t>(k), half, o.dims);
    auto* dst = y.as<uint16_t>();
    for (int64_t i = 0, n = numel(o.dims); i < n; ++i)
      dst[i] = half == HP_F16 ? float_to_half(o.buf[i]) : float_to_bf16(o.buf[i]);
  }
}

bool accepts_widened(const OpEntry& e, std::vector<int32_t> dtypes) {
  for (int32_t& t : dtypes)
    if (t == HP_F16 || t == HP_BF16) t = HP_F32;
  return e.accepts(dtypes);
}

}  // namespace hp_cpu
