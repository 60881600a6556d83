// Shared test fixtures for the recipe tests: a recipe that uses every section and key.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "hp/core/error.h"
#include "hp/recipe/recipe.h"

namespace hp::recipe::test {

inline Recipe full_recipe() {
  Recipe r;
  r.name = "gpt-2x2x2";
  r.model = "../models/gpt.onnx";
  r.cluster = "dgx-h100";
  r.nodes = 1;
  r.dims = {{"batch", 8}, {"seq", 2048}};
  r.parallel = {2, 2, 2, 1, 4, 8, Schedule::interleaved, 2, true, 2};
  r.parallel.shard_group = 1;         // HSDP: every rank a shard group of its own
  r.parallel.bucket_mb = 25;          // written only when not the default
  r.parallel.routed_experts = false;  // likewise: expert_dispatch = "gather"
  r.parallel.optimizer_shard = 3;     // ZeRO-3, so that
  r.parallel.zero3_per_step = true;   // zero3_gather = "per-step" is written and valid
  for (int s = 0; s < 4; ++s) {
    Stage st;
    st.index = s;
    st.layers = {3 * s, 3 * s + 1, 3 * s + 2};
    st.recompute = s == 0 ? Recompute::selective : (s == 3 ? Recompute::full : Recompute::none);
    if (s == 1) st.recompute_layers = {{Recompute::full, {4, 5}}, {Recompute::selective, {3}}};
    int base = (s % 2) * 4;
    st.ranks = {base, base + 1, base + 2, base + 3};
    r.stages.push_back(st);
  }
  r.layouts["h.*.attn.c_attn.weight"] = Layout{{2, 2}, {"dp", "tp"}, {{}, {"tp"}}, {}};
  r.layouts["wte.weight"] =
      Layout{{2, 2, 2}, {"dp", "sp", "mp"}, {{"mp"}, {"sp", "dp"}}, {7, 6, 5, 4, 3, 2, 1, 0}};
  Group train{"train",
              {0, 1, 2, 3, 4, 5, 6, 7},
              "stage",
              "cuda",
              {{"NCCL_DEBUG", "WARN"}, {"OMP_NUM_THREADS", "1"}},
              {"input_ids"},
              {"logits"}};
  Group sched{"sched", {8}, "scheduler", "cpu", {}, {}, {}};
  r.groups = {train, sched};
  Offload o;
  o.enabled = true;
  o.targets = {"optimizer", "activations"};
  o.h2d_bandwidth = {2.51e10, "measured:cpu-plugin 2026-11-20"};
  o.d2h_bandwidth = {2.4e10, "table"};
  o.host_memory = {512.0 * (1ull << 30), "user"};
  o.margin = 0.15;
  o.prefetch_lookahead = 2;
  r.offload = o;
  r.workload = Workload{
      "train", "bf16", "adamw",
      64,      2048,   "hp plan '../models/my gpt.onnx' --cluster dgx-h100 --global-batch 64"};
  Train t;
  t.loss = "mse";
  t.logits = "logits";
  t.labels = "targets";
  t.optimizer = "sgd";
  t.lr = 0.05;
  t.betas = {0.8, 0.95};
  t.eps = 1e-6;
  t.weight_decay = 0.0;
  t.momentum = 0.9;
  t.clip_norm = 1.0;
  t.lr_schedule = "cosine";
  t.warmup_steps = 10;
  t.min_lr = 1e-4;
  t.steps = 500;
  t.seed = 7;
  t.frozen = {"rope.*", "mask"};
  r.train = t;
  return r;
}

/// True when some diagnostic's where contains `where` and its message contains `message`.
inline bool has(const std::vector<Diagnostic>& ds, const std::string& where,
                const std::string& message) {
  return std::any_of(ds.begin(), ds.end(), [&](const Diagnostic& d) {
    return d.where.find(where) != std::string::npos && d.message.find(message) != std::string::npos;
  });
}

inline std::string dump(const std::vector<Diagnostic>& ds) {
  std::string s;
  for (const auto& d : ds)
    s += d.where + ": " + d.message + (d.hint.empty() ? "" : " [" + d.hint + "]") + "\n";
  return s;
}

}  // namespace hp::recipe::test
