// Host tensors and the ONNX backend-test file layout.
//
// A HostTensor is what crosses hp's edges: inputs read from `input_K.pb`, outputs written to
// `output_K.pb`, expected outputs compared by `hp verify`, initializers before they are placed on a
// device. Element types are the plugin ABI's hp_dtype values (the executor runs all of them but f8:
// the floats, the signed and unsigned integers and bool); conversion from and to ONNX TensorProto
// types lives here too.
//
// Directory layout: a folder holds input_0.pb, input_1.pb, ... (or output_K.pb), each one
// serialized onnx.TensorProto, K following the graph's input (output) order, as in the ONNX backend
// test data.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/core/fs.h"

namespace hp::exec {

/// A dense row-major tensor in host memory.
struct HostTensor {
  std::string name;  ///< TensorProto name (may be empty)
  int dtype = -1;    ///< hp_dtype
  std::vector<std::int64_t> dims;
  std::vector<unsigned char> data;  ///< numel * dtype_size bytes

  std::int64_t numel() const;
  template <class T>
  const T* as() const {
    return reinterpret_cast<const T*>(data.data());
  }
  template <class T>
  T* as() {
    return reinterpret_cast<T*>(data.data());
  }
};

/// A graph value: a tensor, or a sequence of tensors (ONNX seq(tensor); the sequence ops and
/// control flow produce them, docs/executor.md "Sequences").
struct HostValue {
  bool is_sequence = false;
  HostTensor tensor;              ///< the value when !is_sequence
  int elem_dtype = -1;            ///< a sequence's element hp_dtype (-1 when unknown)
  std::vector<HostTensor> items;  ///< a sequence's elements
};

/// Bytes per element of an hp_dtype the executor handles; 0 otherwise.
int dtype_size(int dtype);
/// hp_dtype of an ONNX TensorProto::DataType; -1 when the executor cannot hold it (string, the
/// float8 formats, complex).
int dtype_from_onnx(std::int32_t onnx_type);
/// ONNX TensorProto::DataType of an hp_dtype.
std::int32_t dtype_to_onnx(int dtype);
/// "f32", "i64", "bool", ...
std::string dtype_label(int dtype);
/// "[2,3]" for messages.
std::string dims_label(const std::vector<std::int64_t>& dims);

/// Reads one serialized TensorProto. Errc::bad_input naming the file when it is missing, does not
/// parse, has an element type hp cannot run, or its data does not match its dims.
Expected<HostTensor> read_tensor_file(const std::filesystem::path& path);
/// Serializes `t` as a TensorProto (raw_data) into `path`, atomically.
Status write_tensor_file(const std::filesystem::path& path, const HostTensor& t);

/// Reads one file holding a serialized TensorProto, or a SequenceProto of tensors when `sequence`.
/// Errc::bad_input naming the file as read_tensor_file does (also for a sequence of non-tensors).
Expected<HostValue> read_value_file(const std::filesystem::path& path, bool sequence);

/// Every initializer of the ONNX model file `model` with its data (external data resolved against
/// the model's directory), in graph order. Errc::bad_input when the model does not load or an
/// initializer's data is missing or malformed.
Expected<std::vector<HostTensor>> read_initializers(const std::filesystem::path& model);

/// Reads `<dir>/<prefix>_0.pb`, `<prefix>_1.pb`, ... while they exist (prefix "input" or "output").
/// Errc::bad_input when `dir` is not a directory.
Expected<std::vector<HostTensor>> read_tensor_dir(const std::filesystem::path& dir,
                                                  const std::string& prefix);
/// Writes `<dir>/output_K.pb` for every tensor, atomically as a whole through replace_output_dir
/// (hp/core/fs.h): an existing `dir` is replaced only when it is hp's own earlier output (or
/// `o.force`), never when it is or holds one of `o.inputs`, and only once all files wrote.
/// Errc::bad_input naming the foreign entry or the input otherwise.
Status write_tensor_dir(const std::filesystem::path& dir, const std::vector<HostTensor>& tensors,
                        const std::string& prefix = "output", const OutputDirOptions& o = {});

}  // namespace hp::exec
