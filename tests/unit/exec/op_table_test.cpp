// The model library's table of supported ops (hp/model/ops.h: what `hp plan --summary` calls
// unsupported) against what the cpu plugin really runs: every op in the table must run on the cpu
// backend (or be one the executor runs itself: control flow, sequences), and every standard ONNX op
// the cpu backend or the executor runs must be in the table. Without this check
// the two drift apart (the summary once listed GlobalAveragePool as unsupported although it ran).
#include <onnx/defs/schema.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <string>

#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/model/ops.h"

TEST_CASE("op table: the model library's supported ops are exactly the cpu backend's", "[exec]") {
  auto backends = hp::exec::open_backends("cpu", 1, {});
  REQUIRE(backends);
  const auto& cpu = *backends->cpu;
  const auto table = hp::model::supported_ops();
  for (const auto& op : table) {
    INFO(op);
    CHECK((cpu.supports_op_type(0, op.c_str(), "", 17) || hp::exec::is_executor_op("", op)));
  }
  std::set<std::string> onnx_ops;
  for (const auto& schema : onnx::OpSchemaRegistry::get_all_schemas())
    if (schema.domain().empty() || schema.domain() == "ai.onnx") onnx_ops.insert(schema.Name());
  REQUIRE(onnx_ops.size() > 100);
  for (const auto& op : onnx_ops) {
    if (!cpu.supports_op_type(0, op.c_str(), "", 17) && !hp::exec::is_executor_op("", op)) continue;
    INFO(op << " runs on the cpu backend but is missing from libs/model/src/ops.cpp");
    CHECK(std::find(table.begin(), table.end(), op) != table.end());
  }
}
