// The cpu backend's generic op execution (ABI 1.2 supports_op / run_op): the shared vocabulary of
// the kernel files cpu_ops_*.cpp.
//
// A kernel receives an OpCall: the node's attributes, its inputs as Views (dtype, dims, data) and a
// way to allocate each output once its shape is known (through the host's alloc_output callback,
// since the host owns tensor memory). Kernels report errors by throwing OpError; run_op turns that
// into an hp_status with the node named, so no exception crosses the C boundary. Each family file
// registers its ops in the OpTable with the dtypes it accepts (a predicate over the input dtypes),
// which is all supports_op looks at: shapes and attribute values are checked when the op runs.
//
// Layout is row-major and contiguous throughout; "device" memory is host memory
// (HP_CAP_HOST_VISIBLE).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu_internal.h"

namespace hp_cpu {

/// Thrown by kernels; becomes an hp_status (HP_INVALID unless `code` says otherwise).
struct OpError : std::runtime_error {
  explicit OpError(const std::string& m, hp_code c = HP_INVALID) : std::runtime_error(m), code(c) {}
  hp_code code;
};

using Dims = std::vector<int64_t>;

/// Bytes per element of an hp_dtype (0 for types the cpu kernels do not handle).
int dtype_size(int dtype);
int64_t numel(const Dims& d);
/// Row-major strides of `d` in elements.
Dims strides_of(const Dims& d);
/// "[2,3,4]" for messages.
std::string dims_str(const Dims& d);

/// A tensor argument: dtype -1 and data null for an omitted optional input.
struct View {
  int dtype = -1;
  Dims dims;
  void* data = nullptr;
  bool present() const { return dtype >= 0; }
  int64_t numel() const { return hp_cpu::numel(dims); }
  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
  /// Values of an integer (i32/i64) or bool tensor as int64, e.g. a shape or axes input.
  std::vector<int64_t> ints() const;
  /// Values of a float/int tensor as double (Clip bounds, Range limits).
  double scalar() const;
};

/// One node being executed.
class OpCall {
 public:
  OpCall(const hp_op_desc& d, hp_ctx* ctx, hp_stream* s);

  const std::string& op() const { return op_; }
  int64_t opset() const { return desc_.opset; }
  hp_ctx* ctx() const { return ctx_; }
  hp_stream* stream() const { return stream_; }

  size_t n_inputs() const { return inputs_.size(); }
  /// Input i; an absent optional input (or i past the end) is a View with dtype -1.
  const View& in(size_t i) const;
  /// Input i, which must be present.
  const View& need(size_t i) const;
  int64_t n_outputs() const { return desc_.n_outputs; }
  /// Allocates output i with this dtype and shape (through the host) and returns it.
  View out(int64_t i, int dtype, const Dims& dims);

  bool has(const char* name) const;
  int64_t i(const char* name, int64_t dflt) const;
  double f(const char* name, double dflt) const;
  std::string s(const char* name, const std::string& dflt) const;
  std::vector<int64_t> ints(const char* name) const;
  std::vector<double> floats(const char* name) const;
  /// A string-list attribute (HP_ATTR_STRINGS); empty when absent.
  std::vector<std::string> strings(const char* name) const;
  /// A tensor attribute (host memory), or null.
  const hp_tensor_desc* tensor(const char* name) const;

  /// Normalises an axis in [-rank, rank) to [0, rank); throws otherwise.
  int64_t axis(int64_t a, int64_t rank) const;
  [[noreturn]] void fail(const std::string& message) const;

 private:
  const hp_op_attr* find(const char* name) const;
  const hp_op_desc& desc_;
  hp_ctx* ctx_;
  hp_stream* stream_;
  std::string op_;
  std::vector<View> inputs_;
  View absent_;
};

using Kernel = std::function<void(OpCall&)>;
/// Whether the kernel takes these input dtypes (-1 = omitted input).
using DtypeCheck = std::function<bool(const std::vector<int32_t>&)>;

struct OpEntry {
  Kernel run;
  DtypeCheck accepts;
  /// f16/bf16 inputs run through the f32 kernel (cpu_ops_half.cpp); set by op_table().
  bool halves = false;
};

/// Dtype predicate: every present input float32, or every one float64.
bool same_float(const std::vector<int32_t>& d);

/// Op type -> kernel; ops of other domains than ai.onnx are keyed "domain.type".
using OpTable = std::map<std::string, OpEntry>;

void register_elementwise_ops(OpTable& t);
/// Cast and CastLike (cpu_ops_cast.cpp).
void register_cast_ops(OpTable& t);
void register_shape_ops(OpTable& t);
void register_index_ops(OpTable& t);
void register_nn_ops(OpTable& t);
void register_attention_ops(OpTable& t);
/// hp.nn.Attention (cpu_ops_sdpa.cpp), registered by register_attention_ops.
void attention(OpCall& c);
void register_conv_ops(OpTable& t);
void register_reduce_ops(OpTable& t);
void register_pool_ops(OpTable& t);
void register_resample_ops(OpTable& t);
void register_scatter_ops(OpTable& t);
void register_rnn_ops(OpTable& t);
void register_loss_ops(OpTable& t);
void register_misc_ops(OpTable& t);
void register_norm_ops(OpTable& t);
void register_convt_ops(OpTable& t);
void register_quant_ops(OpTable& t);
void register_signal_ops(OpTable& t);
void register_vision_ops(OpTable& t);
void register_linalg_ops(OpTable& t);
void register_qconv_ops(OpTable& t);
void register_optim_ops(OpTable& t);
void register_text_ops(OpTable& t);
void register_random_ops(OpTable& t);
/// The "hp.train" gradient ops (docs/training.md): cpu_ops_grad.cpp, which registers ConvGrad and
/// the pool gradients of cpu_ops_grad_conv.cpp through register_grad_conv_ops.
void register_grad_ops(OpTable& t);
/// The vocabulary-parallel cross entropy's row kernels (cpu_ops_vocab.cpp).
void register_vocab_ops(OpTable& t);
void register_grad_conv_ops(OpTable& t);
/// RecurrentGrad, the LSTM / GRU / RNN gradient (cpu_ops_grad_rnn.cpp).
void register_grad_rnn_ops(OpTable& t);
/// The activation names of an LSTM, GRU or RNN node (`op`), lower case, one list per direction:
/// its `activations` attribute (one direction's list serves both) or the op's defaults
/// (cpu_ops_rnn.cpp; the gradient kernel reads the same list).
std::vector<std::string> recurrent_activation_names(const OpCall& c, const std::string& op,
                                                    int dirs);
/// SliceGrad, GatherGrad, GatherElementsGrad (cpu_ops_grad_index.cpp).
void register_grad_index_ops(OpTable& t);

/// op(a, b) for floats; for integers the bits two's complement arithmetic gives (what numpy and
/// ONNX Runtime return), without the undefined behaviour of signed overflow.
template <class T, class Op>
T wrapping(T a, T b, Op op) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(op(static_cast<U>(a), static_cast<U>(b))));
  } else {
    return static_cast<T>(op(a, b));
  }
}

/// The 16-bit float type among the input dtypes, or -1.
int half_input_type(const int32_t* dtypes, int64_t n);
/// Runs `e` on f32 copies of the f16/bf16 inputs of `d`, converting its f32 outputs back.
void run_widened(const OpEntry& e, const hp_op_desc& d, int half, hp_ctx* ctx, hp_stream* s);
/// Whether `e` accepts these dtypes with f16/bf16 read as f32.
bool accepts_widened(const OpEntry& e, std::vector<int32_t> dtypes);

/// Dropout in training mode (cpu_ops_random.cpp): each element kept with probability 1 - ratio and
/// scaled by 1 / (1 - ratio), the optional mask output saying which were kept.
void dropout_training(OpCall& c, double ratio);

/// The table, built once.
const OpTable& op_table();

hp_status* run_op(hp_ctx* ctx, hp_stream* s, const hp_op_desc* desc);
int32_t supports_op(hp_ctx* ctx, int32_t dev, const char* op_type, const char* domain,
                    int64_t opset, const int32_t* input_dtypes, int64_t n_inputs);

/// ONNX multidirectional broadcasting of two shapes; throws on incompatible dims.
Dims broadcast_shapes(const Dims& a, const Dims& b, const OpCall& c);
/// Strides of `in` seen as a tensor of shape `out` (0 on broadcast dims), out-rank long.
Dims broadcast_strides(const Dims& in, const Dims& out);

/// Common dtype predicates.
bool all_f32(const std::vector<int32_t>& d);
bool is_num(int32_t t);    ///< f32, f64 and the integers i8..i64, u8..u64 (not bool)
bool is_float(int32_t t);  ///< f32, f64
bool is_int(int32_t t);    ///< i8..i64, u8..u64

/// Calls f(T{}) with T the C++ type of dtype (f32, f64, the signed and unsigned integers, bool
/// as uint8_t). f16/bf16 are not among them: kernels that take them convert (cpu_half.h).
template <class F>
void dispatch(int dtype, F&& f) {
  switch (dtype) {
    case HP_F32: f(float{}); break;
    case HP_F64: f(double{}); break;
    case HP_I8: f(int8_t{}); break;
    case HP_I16: f(int16_t{}); break;
    case HP_I32: f(int32_t{}); break;
    case HP_I64: f(int64_t{}); break;
    case HP_BOOL:
    case HP_U8: f(uint8_t{}); break;
    case HP_U16: f(uint16_t{}); break;
    case HP_U32: f(uint32_t{}); break;
    case HP_U64: f(uint64_t{}); break;
    default: throw OpError("unsupported dtype " + std::to_string(dtype), HP_UNSUPPORTED);
  }
}

/// dispatch() restricted to the numeric types (is_num: no bool).
template <class F>
void dispatch_num(int dtype, F&& f) {
  if (dtype == HP_BOOL) throw OpError("unsupported dtype bool", HP_UNSUPPORTED);
  dispatch(dtype, std::forward<F>(f));
}

}  // namespace hp_cpu
