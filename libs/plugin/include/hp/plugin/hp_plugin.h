/*
 * hp backend plugin C ABI, version 1.
 *
 * A backend (cpu, cuda, ascend, ...) is a shared library `libhp-backend-<name>.so` that exports
 * `hp_backend_entry_v1`, returning a static table of function pointers (hp_backend_v1), and
 * optionally `hp_backend_probe`. Only plain C crosses the boundary: fixed-width integers, size_t,
 * double, function pointers and opaque handles. No C++ types, no exceptions, no ownership of host
 * strings.
 *
 * Versioning. HP_ABI_MAJOR changes when anything but an append happens; each major has its own
 * entry symbol (`hp_backend_entry_v2` later), so one plugin can serve two hosts during a
 * transition. HP_ABI_MINOR grows when members are appended to a table or struct. Every table and
 * every in/out struct starts with `struct_size`: the host only touches a member when
 *   offsetof(member) + sizeof(member) <= struct_size
 * (HP_HAS_MEMBER below), and a plugin fills only the members that fit the caller's struct_size.
 * Members marked "optional" may also be NULL. History: 1.0  the core surface: status, open/close,
 * devices, supports, memory, streams, events, copies, gemm, elementwise, optional graph execution
 *   1.1  appended event_query and mem_info
 *   1.2  appended supports_op and run_op: generic execution of one ONNX node (hp_op_desc), with
 *        tensor dtypes HP_BOOL and HP_U8 beyond the FLOP-rated set
 *   1.3  appended mem_stats: device bytes in use, their peak and an enforced budget (hp_mem_stats);
 *        later the tensor dtypes HP_I16, HP_U16, HP_U32 and HP_U64 (enum values only, no member, so
 *        no minor bump: a plugin that predates them declines them in supports_op)
 *
 * Errors. Fallible functions return `hp_status*`: NULL means success; otherwise an object allocated
 * by the plugin that the host reads with status_code/status_message and releases with status_free.
 *
 * Layout. Matrices are row-major (as in ONNX). Device pointers are opaque to the host unless the
 * device reports HP_CAP_HOST_VISIBLE.
 */
#ifndef HP_PLUGIN_HP_PLUGIN_H
#define HP_PLUGIN_HP_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HP_ABI_MAJOR 1
#define HP_ABI_MINOR 3

/** True when `member` of the struct pointed to by `p` lies inside `p->struct_size`. */
#define HP_HAS_MEMBER(p, type, member) \
  ((p)->struct_size >= offsetof(type, member) + sizeof(((type*)0)->member))

/** Opaque error object, allocated by the plugin (NULL = success). */
typedef struct hp_status hp_status;
/** Opaque per-open state of a backend (one per hp_backend_v1::open call). */
typedef struct hp_ctx hp_ctx;
/** Opaque in-order queue of work on one device. */
typedef struct hp_stream hp_stream;
/** Opaque marker recorded on a stream; completes when the work before it has completed. */
typedef struct hp_event hp_event;

/** Status codes. */
typedef enum hp_code {
  HP_OK = 0,          /**< never carried by a status object; NULL is success */
  HP_UNAVAILABLE = 1, /**< the backend cannot run on this machine (no runtime, driver or device) */
  HP_INVALID = 2,     /**< an argument is invalid (null pointer, bad device index, bad shape) */
  HP_NO_MEMORY = 3,   /**< an allocation failed */
  HP_UNSUPPORTED = 4, /**< the op / dtype / member is not implemented by this backend */
  HP_VERSION = 5, /**< ABI or vendor runtime version mismatch (e.g. a required symbol is absent) */
  HP_DEVICE_LOST = 6, /**< the device failed or was reset */
  HP_TIMEOUT = 7,     /**< an operation timed out */
  HP_INTERNAL = 8     /**< a bug in the plugin or the vendor runtime */
} hp_code;

/** Element types; also the index into hp_device_info::peak_flops. */
typedef enum hp_dtype {
  HP_F32 = 0,
  HP_F16 = 1,
  HP_BF16 = 2,
  HP_F64 = 3,
  HP_I8 = 4,
  HP_I32 = 5,
  HP_I64 = 6,
  HP_F8 = 7,
  HP_DTYPE_COUNT = 8, /**< size of the FLOP-rated set (hp_device_info::peak_flops) */
  /* 1.2: tensor element types that carry no FLOP figure */
  HP_BOOL = 8, /**< one byte per element, 0 or 1 */
  HP_U8 = 9,
  /* tensor element types of ONNX models beyond those above (same numbering as hp::DType) */
  HP_I16 = 10,
  HP_U16 = 11,
  HP_U32 = 12,
  HP_U64 = 13
} hp_dtype;

/** Where a device figure comes from. */
typedef enum hp_prov {
  HP_PROV_UNKNOWN = 0, /**< not known; the value is 0 */
  HP_PROV_TABLE = 1,   /**< looked up from a datasheet table or estimated from specs */
  HP_PROV_MEASURED = 2 /**< measured on this machine */
} hp_prov;

/** Device kinds. */
typedef enum hp_device_kind {
  HP_DEVICE_CPU = 0,
  HP_DEVICE_GPU = 1,
  HP_DEVICE_NPU = 2
} hp_device_kind;

/** Capability bits of hp_device_info::caps. */
#define HP_CAP_ASYNC 0x1u         /**< streams execute asynchronously to the caller */
#define HP_CAP_EVENTS 0x2u        /**< events can be recorded, waited on and synchronised */
#define HP_CAP_PINNED_HOST 0x4u   /**< alloc with HP_MEM_PINNED_HOST returns page-locked memory */
#define HP_CAP_P2P 0x8u           /**< D2D copies between devices of this backend */
#define HP_CAP_GRAPH 0x10u        /**< graph_load / graph_run / graph_free are implemented */
#define HP_CAP_HOST_VISIBLE 0x20u /**< device memory is ordinary host memory (cpu backend) */

/** Device properties. The caller sets struct_size and zeroes the rest; the plugin fills what fits.
 */
typedef struct hp_device_info {
  size_t struct_size; /**< sizeof(hp_device_info) as the caller knows it */
  char name[64];      /**< marketing name, NUL-terminated ("Intel(R) Xeon(R) ...", "Ascend910B3") */
  char arch[32];      /**< architecture ("x86_64 avx2", "sm_90", "Ascend910B3") */
  char bus_id[32];    /**< PCI bus id or "" */
  int32_t kind;       /**< hp_device_kind */
  int32_t numa_node;  /**< NUMA node or -1 */
  uint64_t mem_total; /**< device memory in bytes */
  uint64_t mem_free;  /**< free device memory in bytes at query time */
  int32_t compute_units; /**< cores / SMs / AI cores */
  int32_t reserved0;     /**< zero */
  double clock_hz;       /**< nominal clock, 0 when unknown */
  double
      peak_flops[HP_DTYPE_COUNT]; /**< dense peak FLOP/s per hp_dtype (0 = not supported/unknown) */
  int32_t flops_prov[HP_DTYPE_COUNT]; /**< hp_prov of each peak_flops entry */
  double mem_Bps;                     /**< device memory bandwidth, bytes/s */
  double h2d_Bps;                     /**< host-to-device copy bandwidth, bytes/s */
  double d2h_Bps;                     /**< device-to-host copy bandwidth, bytes/s */
  double peer_Bps;                    /**< device-to-device (peer) bandwidth, bytes/s */
  int32_t mem_prov;                   /**< hp_prov of mem_Bps */
  int32_t h2d_prov;                   /**< hp_prov of h2d_Bps */
  int32_t d2h_prov;                   /**< hp_prov of d2h_Bps */
  int32_t peer_prov;                  /**< hp_prov of peer_Bps */
  uint64_t caps;                      /**< HP_CAP_* bits */
  char note[128]; /**< free text on how the figures were obtained (provenance detail) */
} hp_device_info;

/** Operations for supports(). */
typedef enum hp_op {
  HP_OP_GEMM = 1,
  /* binary elementwise: out = x (op) y */
  HP_OP_ADD = 16,
  HP_OP_SUB = 17,
  HP_OP_MUL = 18,
  HP_OP_DIV = 19,
  HP_OP_MAX = 20,
  HP_OP_MIN = 21,
  /* unary elementwise: out = f(x) */
  HP_OP_RELU = 32,
  HP_OP_GELU = 33, /**< exact (erf) GELU, as ONNX Gelu with approximate="none" */
  HP_OP_SILU = 34, /**< x * sigmoid(x) */
  HP_OP_SIGMOID = 35,
  HP_OP_TANH = 36,
  HP_OP_EXP = 37,
  HP_OP_NEG = 38,
  HP_OP_SQRT = 39,
  HP_OP_SCALE = 40 /**< out = x * scalar */
} hp_op;

/** Memory kinds for alloc / free_mem. */
#define HP_MEM_DEVICE 0      /**< device memory */
#define HP_MEM_PINNED_HOST 1 /**< page-locked host memory usable for async copies */

/** Copy directions for copy_async. */
typedef enum hp_copy_dir { HP_H2D = 0, HP_D2H = 1, HP_D2D = 2, HP_H2H = 3 } hp_copy_dir;

/**
 * A (batched, strided) GEMM in row-major layout: for b in [0, batch)
 *   C_b[m x n] = alpha * op(A_b) * op(B_b) + beta * C_b
 * with A_b = a + b*stride_a elements (A_b is m x k, stored k x m when trans_a), likewise B_b (k x
 * n, stored n x k when trans_b) and C_b. lda/ldb/ldc are row strides of the stored matrices in
 * elements. A batch stride of 0 broadcasts that operand over the batch. beta == 0 ignores C's old
 * contents.
 */
typedef struct hp_gemm_desc {
  size_t struct_size;                   /**< sizeof(hp_gemm_desc) as the caller knows it */
  int32_t trans_a;                      /**< nonzero: A is stored transposed (k x m) */
  int32_t trans_b;                      /**< nonzero: B is stored transposed (n x k) */
  int64_t m, n, k;                      /**< problem size, each >= 1 */
  int64_t lda, ldb, ldc;                /**< row strides in elements */
  int64_t batch;                        /**< number of matrices, >= 1 */
  int64_t stride_a, stride_b, stride_c; /**< elements between consecutive matrices */
  double alpha, beta;                   /**< scaling factors */
  int32_t type_a, type_b, type_c;       /**< hp_dtype of the operands */
  int32_t type_compute;                 /**< hp_dtype of the accumulation */
  const void* a;                        /**< device pointer to A_0 */
  const void* b;                        /**< device pointer to B_0 */
  void* c;                              /**< device pointer to C_0 */
} hp_gemm_desc;

/**
 * An elementwise op over n elements: out[i] = x[i] (op) y[i % y_len] for binary ops (y_len == 0
 * means n; a y_len dividing n broadcasts y over the trailing dimension, as for a bias), out[i] =
 * f(x[i]) for unary ops, out[i] = x[i] * scalar for HP_OP_SCALE. out may alias x.
 */
typedef struct hp_elementwise_desc {
  size_t struct_size; /**< sizeof(hp_elementwise_desc) as the caller knows it */
  int32_t op;         /**< hp_op (not HP_OP_GEMM) */
  int32_t dtype;      /**< hp_dtype of x, y and out */
  int64_t n;          /**< number of output elements */
  int64_t y_len;      /**< elements of y (0 = n); must divide n */
  double scalar;      /**< HP_OP_SCALE factor */
  const void* x;      /**< device pointer */
  const void* y;      /**< device pointer (binary ops) or NULL */
  void* out;          /**< device pointer */
} hp_elementwise_desc;

/** Attribute kinds of hp_op_attr (1.2). */
typedef enum hp_attr_kind {
  HP_ATTR_INT = 0,    /**< i */
  HP_ATTR_FLOAT = 1,  /**< f */
  HP_ATTR_STRING = 2, /**< s (NUL-terminated) */
  HP_ATTR_INTS = 3,   /**< ints[0..n) */
  HP_ATTR_FLOATS = 4, /**< floats[0..n) */
  HP_ATTR_TENSOR = 5, /**< tensor (a host-memory hp_tensor_desc, e.g. Constant's value) */
  /** n strings stored back to back in s, each NUL-terminated (an RNN's activations). Sent by hosts
   * since 1.3 without a layout change; a plugin that does not know the kind ignores the attribute.
   */
  HP_ATTR_STRINGS = 6
} hp_attr_kind;

/** Maximum rank of an hp_tensor_desc. */
#define HP_MAX_RANK 8

/**
 * A dense, row-major (contiguous) tensor (1.2). `data` is a device pointer of the backend that runs
 * the op, except for attribute tensors, which live in host memory. A rank-0 tensor is a scalar with
 * one element; a dim of 0 gives an empty tensor (data may then be NULL).
 */
typedef struct hp_tensor_desc {
  int32_t dtype; /**< hp_dtype */
  int32_t rank;  /**< 0..HP_MAX_RANK */
  int64_t dims[HP_MAX_RANK];
  void* data;
} hp_tensor_desc;

/** One node attribute (1.2). Strings and arrays are owned by the host and valid during the call. */
typedef struct hp_op_attr {
  const char* name;
  int32_t kind; /**< hp_attr_kind */
  int64_t i;
  double f;
  const char* s;
  const int64_t* ints;
  const double* floats;
  int64_t n; /**< element count of ints / floats */
  const hp_tensor_desc* tensor;
} hp_op_attr;

/**
 * Output allocation callback of run_op (1.2). Output shapes are the plugin's to compute (some
 * depend on input values: Reshape, Range, TopK), so the plugin asks the host for each output's
 * buffer once it knows the shape. The host fills out->data with device memory of this backend (NULL
 * for an empty tensor) and returns nonzero on success, 0 when it cannot allocate.
 */
typedef int32_t (*hp_alloc_output_fn)(void* user, int32_t index, int32_t dtype, int32_t rank,
                                      const int64_t* dims, hp_tensor_desc* out);

/**
 * One ONNX node to execute (1.2). Inputs omitted in the model (optional, empty name) have
 * dtype -1 and data NULL. Outputs are obtained through alloc_output, exactly once per output index
 * in [0, n_outputs).
 */
typedef struct hp_op_desc {
  size_t struct_size;    /**< sizeof(hp_op_desc) as the caller knows it */
  const char* op_type;   /**< ONNX op type, e.g. "MatMul" */
  const char* domain;    /**< "" for ai.onnx */
  int64_t opset;         /**< the model's opset of that domain */
  const char* node_name; /**< for messages; may be "" */
  const hp_op_attr* attrs;
  int64_t n_attrs;
  const hp_tensor_desc* inputs;
  int64_t n_inputs;
  int64_t n_outputs;
  hp_alloc_output_fn alloc_output;
  void* alloc_user;
} hp_op_desc;

/**
 * Device-memory accounting of one device (1.3): what alloc(HP_MEM_DEVICE) handed out and not yet
 * freed. A backend opened with a device budget (the cpu backend's "device_budget=BYTES") refuses,
 * with HP_NO_MEMORY, an allocation that would take in_use past `limit`; that is how a host-memory
 * backend stands in for a device of that size (offload schedules are then really exercised).
 */
typedef struct hp_mem_stats {
  size_t struct_size; /**< sizeof(hp_mem_stats) as the caller knows it */
  uint64_t in_use;    /**< bytes of live device allocations (as the backend rounds them) */
  uint64_t peak;      /**< the most in_use since open or the last reset */
  uint64_t limit;     /**< the enforced budget in bytes; 0 = none */
  uint64_t allocs;    /**< device allocations that succeeded */
  uint64_t refused;   /**< device allocations refused because of the limit */
} hp_mem_stats;

/** The function table of ABI major 1. Members are appended only; see the version history above. */
typedef struct hp_backend_v1 {
  size_t struct_size;  /**< sizeof(hp_backend_v1) as the plugin was compiled */
  uint16_t abi_major;  /**< HP_ABI_MAJOR the plugin implements (must equal the host's) */
  uint16_t abi_minor;  /**< HP_ABI_MINOR the plugin was compiled with */
  const char* name;    /**< short name: "cpu", "cuda", "ascend" (static storage) */
  const char* version; /**< plugin version string (static storage) */

  /** Code of a status object (never HP_OK). */
  hp_code (*status_code)(const hp_status* s);
  /** Message of a status object; lower-case, names the backend and the failing call. Valid until
   * freed. */
  const char* (*status_message)(const hp_status* s);
  /** Releases a status object; NULL is allowed. */
  void (*status_free)(hp_status* s);

  /**
   * Initialises the backend: resolves the vendor runtime, initialises it, counts devices. `kv`
   * holds n_kv "key=value" option strings owned by the host. Fails with HP_UNAVAILABLE (and the
   * reason) when the runtime, driver or devices are missing, HP_VERSION when the runtime is too
   * old.
   */
  hp_status* (*open)(const char* const* kv, size_t n_kv, hp_ctx** out);
  /** Releases what open created. The plugin library itself stays loaded. */
  void (*close)(hp_ctx* ctx);

  /** Number of devices (may be 0; the host then rejects the backend). */
  hp_status* (*device_count)(hp_ctx* ctx, int32_t* out);
  /** Properties of device `dev`; `out->struct_size` is set by the caller. */
  hp_status* (*device_info)(hp_ctx* ctx, int32_t dev, hp_device_info* out);
  /** 1 when `op` (hp_op) on `dtype` (hp_dtype) runs on device `dev`, else 0. Never fails. */
  int32_t (*supports)(hp_ctx* ctx, int32_t dev, int32_t op, int32_t dtype);

  /** Allocates `bytes` of memory of `kind` (HP_MEM_*) for device `dev`. */
  hp_status* (*alloc)(hp_ctx* ctx, int32_t dev, size_t bytes, int32_t kind, void** out);
  /** Frees memory from alloc with the same dev and kind; NULL is allowed. */
  hp_status* (*free_mem)(hp_ctx* ctx, int32_t dev, void* p, int32_t kind);

  /** Creates an in-order stream on device `dev`. */
  hp_status* (*stream_create)(hp_ctx* ctx, int32_t dev, hp_stream** out);
  /** Blocks until all work queued on `s` has completed. */
  hp_status* (*stream_sync)(hp_ctx* ctx, hp_stream* s);
  /** Waits for `s`, then destroys it. */
  hp_status* (*stream_destroy)(hp_ctx* ctx, hp_stream* s);

  /** Creates an event on device `dev`. */
  hp_status* (*event_create)(hp_ctx* ctx, int32_t dev, hp_event** out);
  /** Records `e` on `s`: it completes when all work queued on `s` before it has completed. */
  hp_status* (*event_record)(hp_ctx* ctx, hp_event* e, hp_stream* s);
  /** Makes later work on `s` wait until `e` (as last recorded) has completed; does not block the
   * host. */
  hp_status* (*stream_wait_event)(hp_ctx* ctx, hp_stream* s, hp_event* e);
  /** Blocks the host until `e` has completed. */
  hp_status* (*event_sync)(hp_ctx* ctx, hp_event* e);
  /** Destroys an event. */
  hp_status* (*event_destroy)(hp_ctx* ctx, hp_event* e);

  /** Queues a copy of `bytes` bytes on `s`; `dir` (hp_copy_dir) says where dst and src live. */
  hp_status* (*copy_async)(hp_ctx* ctx, hp_stream* s, void* dst, const void* src, size_t bytes,
                           int32_t dir);
  /** Queues a GEMM on `s` (see hp_gemm_desc). */
  hp_status* (*gemm)(hp_ctx* ctx, hp_stream* s, const hp_gemm_desc* desc);
  /** Queues an elementwise op on `s` (see hp_elementwise_desc). */
  hp_status* (*elementwise)(hp_ctx* ctx, hp_stream* s, const hp_elementwise_desc* desc);

  /** Optional (HP_CAP_GRAPH): compiles an ONNX model for device `dev`. */
  hp_status* (*graph_load)(hp_ctx* ctx, int32_t dev, const void* onnx, size_t bytes, void** out);
  /** Optional (HP_CAP_GRAPH): runs a compiled graph on `s`. */
  hp_status* (*graph_run)(hp_ctx* ctx, void* g, hp_stream* s, void* const* in, size_t n_in,
                          void* const* out, size_t n_out);
  /** Optional (HP_CAP_GRAPH): releases a compiled graph. */
  hp_status* (*graph_free)(hp_ctx* ctx, void* g);

  /* ---- 1.1 ---- */
  /** Optional (1.1): *done = 1 when `e` has completed, else 0; never blocks. */
  hp_status* (*event_query)(hp_ctx* ctx, hp_event* e, int32_t* done);
  /** Optional (1.1): current free and total memory of device `dev` in bytes. */
  hp_status* (*mem_info)(hp_ctx* ctx, int32_t dev, uint64_t* free_bytes, uint64_t* total_bytes);

  /* ---- 1.2 ---- */
  /**
   * Optional (1.2): 1 when ONNX op `op_type` of `domain` ("" = ai.onnx) at `opset` runs on device
   * `dev` with inputs of the given hp_dtypes (-1 for an omitted optional input), else 0. With
   * input_dtypes NULL the question is whether the op type is implemented for some dtypes (the host
   * asks this before it knows every tensor's dtype). Never fails.
   */
  int32_t (*supports_op)(hp_ctx* ctx, int32_t dev, const char* op_type, const char* domain,
                         int64_t opset, const int32_t* input_dtypes, int64_t n_inputs);
  /** Optional (1.2): queues the node `desc` on `s` (see hp_op_desc). */
  hp_status* (*run_op)(hp_ctx* ctx, hp_stream* s, const hp_op_desc* desc);

  /* ---- 1.3 ---- */
  /**
   * Optional (1.3): device-memory accounting of device `dev` (see hp_mem_stats); `out->struct_size`
   * is set by the caller. With reset_peak nonzero, peak restarts from in_use after it was read.
   */
  hp_status* (*mem_stats)(hp_ctx* ctx, int32_t dev, int32_t reset_peak, hp_mem_stats* out);
} hp_backend_v1;

/** Size of a 1.0 table: everything up to and including graph_free. */
#define HP_BACKEND_V1_0_SIZE (offsetof(hp_backend_v1, graph_free) + sizeof(void (*)(void)))

/** Signature of the exported entry symbol "hp_backend_entry_v1". */
typedef const hp_backend_v1* (*hp_backend_entry_v1_fn)(uint16_t host_minor);
/** Signature of the optional exported symbol "hp_backend_probe". */
typedef int32_t (*hp_backend_probe_fn)(void);

/**
 * Exported by every ABI-1 plugin. `host_minor` is the host's HP_ABI_MINOR, so a plugin may adapt;
 * the host gates members on struct_size either way. Returns a table in static storage, or NULL when
 * the plugin cannot serve that host.
 */
const hp_backend_v1* hp_backend_entry_v1(uint16_t host_minor);

/**
 * Optional and cheap: must not initialise devices. 0 means "cannot work here"; a larger value is a
 * preference score (the cpu backend returns 1, accelerators more). The host still calls open to
 * learn the reason when it is 0.
 */
int32_t hp_backend_probe(void);

#ifdef __cplusplus
}
#endif

#endif /* HP_PLUGIN_HP_PLUGIN_H */
