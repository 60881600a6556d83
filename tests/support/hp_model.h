// An empty ONNX model that imports the default domain (opset 17) and the "hp" domain of
// communication nodes (hp_domain.h): the start of every hand-built partition in the tests and
// benches.
#pragma once

#include <onnx/onnx_pb.h>

#include "hp/core/hp_domain.h"

inline onnx::ModelProto hp_domain_model() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* hp = m.add_opset_import();
  hp->set_domain(std::string(hp::domain::kDomain));
  hp->set_version(hp::domain::kOpsetVersion);
  return m;
}
