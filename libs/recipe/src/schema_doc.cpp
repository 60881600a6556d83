// The key tables behind hp-recipe(5). Kept as plain data next to the parsers so that adding a key
// means adding a row here too (schema_doc_test.cpp fails otherwise).
#include "hp/recipe/schema_doc.h"

namespace hp::recipe {
namespace {

constexpr KeyDoc kRecipe[] = {
    {"[recipe]", "version", "integer", "yes", "recipe format version; this hp reads 1"},
    {"[recipe]", "name", "string", "yes", "a name for the plan (shown in summaries and logs)"},
    {"[recipe]", "model", "string", "yes", "ONNX model file, relative to the recipe file"},
    {"[recipe]", "cluster", "string", "yes",
     "cluster preset name (e.g. dgx-h100) or cluster file relative to the recipe"},
    {"[recipe]", "nodes", "integer", "no (1)",
     "nodes of the cluster used; the preset is scaled to this count"},
    {"[model]", "dims", "table name -> integer", "no ({})",
     "symbolic input dims bound for planning (batch, seq, ...)"},
    {"[parallel]", "dp", "integer >= 1", "yes", "data-parallel degree"},
    {"[parallel]", "tp", "integer >= 1", "yes", "tensor-parallel degree"},
    {"[parallel]", "pp", "integer >= 1", "yes",
     "pipeline-parallel degree (stages); dp*tp*pp = cluster ranks"},
    {"[parallel]", "optimizer_shard", "0..3 or name", "no (none)",
     "ZeRO-style sharding in the dp group: none, optimizer, gradients, parameters"},
    {"[parallel]", "shard_group", "integer >= 0", "no (0)",
     "HSDP: shard over groups of this many consecutive dp ranks, replicate across groups; 0 = "
     "the whole dp group"},
    {"[parallel]", "bucket_mb", "number > 0", "no (16)",
     "gradient bucket size in MiB: reduced as soon as complete; ZeRO-3's gather unit"},
    {"[parallel]", "micro_batch_size", "integer >= 1", "no (1)", "samples per micro-batch"},
    {"[parallel]", "micro_batches", "integer >= 1", "no (1)",
     "micro-batches per step (a multiple of pp when interleaved)"},
    {"[parallel]", "schedule", "gpipe|1f1b|interleaved|zb-h1|zbv", "no (1f1b)",
     "pipeline schedule; zb-h1 and zbv split the backward (docs/schedules.md)"},
    {"[parallel]", "virtual_stages", "integer >= 1", "no (1; zbv: 2)",
     "model chunks per pipeline rank; > 1 needs interleaved, zbv needs exactly 2"},
    {"[parallel]", "sequence_parallel", "boolean", "no (false)",
     "split activations over the tp group (needs tp > 1)"},
    {"[parallel]", "expert_parallel", "integer >= 1", "no (1)",
     "expert-parallel degree; divides dp*tp (training: divides dp, groups of that many "
     "data-parallel ranks share each layer's experts out)"},
    {"[parallel]", "expert_dispatch", "routed|gather", "no (routed)",
     "training with expert_parallel: send each token only to its top-k experts' ranks where the "
     "graph allows it, or all-gather every token to every rank"},
    {"[parallel]", "zero3_gather", "per-use|per-step", "no (per-use)",
     "training with optimizer_shard 3: gather each parameter bucket for every use (of every "
     "micro-batch), or once per step, kept whole until the backward is done"},
    {"[[stages]]", "index", "integer", "yes", "stage number, 0-based, in order"},
    {"[[stages]]", "layers", "range or integer array", "yes",
     "layer (block) indices of the stage, e.g. \"0-11\""},
    {"[[stages]]", "recompute", "none|selective|full", "no (none)",
     "activation recomputation of the stage"},
    {"[[stages]]", "recompute_layers", "table: mode = layer ranges", "no ({})",
     "per-layer overrides of 'recompute', e.g. { full = \"4-5\" } (the planner chooses "
     "recomputation per block)"},
    {"[[stages]]", "ranks", "range or integer array", "no (\"\")",
     "global ranks running the stage (dp*tp of them)"},
    {"[layouts.<tensor>]", "device_matrix", "integer array", "yes",
     "logical device mesh shape; <tensor> is a name or glob"},
    {"[layouts.<tensor>]", "alias_name", "string array", "yes", "one axis name per mesh axis"},
    {"[layouts.<tensor>]", "tensor_map", "array", "yes",
     "per tensor dim: an axis name, \"None\", or an array of axis names (first is major)"},
    {"[layouts.<tensor>]", "rank_list", "integer array", "no (0..n-1)",
     "global rank at each row-major mesh position"},
    {"[[groups]]", "name", "string", "yes", "MPMD group (mpirun app context) name"},
    {"[[groups]]", "ranks", "range or integer array", "yes",
     "consecutive ranks, following the previous group"},
    {"[[groups]]", "module", "string", "no (\"\")",
     "ONNX file the ranks run (relative to the recipe), or \"scheduler\": one rank, no model, that "
     "sends the "
     "requests (--inputs) to the groups and collects the results as the job's outputs"},
    {"[[groups]]", "backend", "string", "no (\"\")",
     "plugin to run on: cpu, cuda, ascend; empty = default"},
    {"[[groups]]", "inputs", "string array", "no ([])",
     "module inputs the group receives: a name in another group's outputs flows from it over MPI "
     "(rank i of a "
     "group of n serves the i-th of n equal row blocks of the requests); otherwise it is read from "
     "--inputs"},
    {"[[groups]]", "outputs", "string array", "no ([])",
     "module outputs the group produces: sent to every group that lists them in its inputs (one "
     "producer per "
     "tensor, no cycles); otherwise job outputs"},
    {"[[groups]]", "env", "table name -> string", "no ({})",
     "environment exported to the group's ranks"},
    {"[workload]", "mode", "train|infer", "no (train)",
     "what the plan was made for (written by hp plan; offload-profile's default --mode)"},
    {"[workload]", "dtype", "string", "no (bf16)",
     "compute dtype the plan was priced in (offload-profile's default --dtype)"},
    {"[workload]", "optimizer", "adam|adamw|sgd|none", "no (adam)",
     "optimizer whose states the plan holds (offload-profile's default --optimizer)"},
    {"[workload]", "global_batch", "integer >= 0", "no (0)",
     "sequences per step; must equal dp x micro_batch_size x micro_batches (0 = not recorded)"},
    {"[workload]", "seq", "integer >= 0", "no (0)",
     "planned sequence length; 0 = the model has no sequence axis (planned per sample)"},
    {"[workload]", "command", "string", "no (\"\")",
     "the hp plan command line that wrote the recipe"},
    {"[train]", "loss", "cross_entropy|mse", "no (cross_entropy)",
     "loss on the logits output: cross entropy over the last axis with integer labels (-100 "
     "ignored), or mean squared error against a target of the output's shape"},
    {"[train]", "logits", "string", "no (output)",
     "the graph output the loss reads (hp plan writes the model's first output)"},
    {"[train]", "labels", "string", "no (labels)",
     "the data tensor holding labels (targets for mse): a .pb file in --inputs; with --data the "
     "next-token window"},
    {"[train]", "optimizer", "adamw|sgd", "no (adamw)", "optimizer, as torch.optim computes it"},
    {"[train]", "lr", "number > 0", "no (0.001)", "peak learning rate"},
    {"[train]", "betas", "2 numbers in [0, 1)", "no ([0.9, 0.999])", "AdamW's beta1 and beta2"},
    {"[train]", "eps", "number > 0", "no (1e-08)", "AdamW's epsilon"},
    {"[train]", "weight_decay", "number >= 0", "no (0.01)",
     "AdamW: decoupled weight decay; SGD: L2 term added to the gradient"},
    {"[train]", "momentum", "number in [0, 1)", "no (0)", "SGD momentum (0 = plain SGD)"},
    {"[train]", "clip_norm", "number >= 0", "no (0)",
     "clip the global gradient norm to this value; 0 = off"},
    {"[train]", "lr_schedule", "constant|cosine", "no (constant)",
     "cosine: linear warm-up over warmup_steps, then cosine decay to min_lr at the last step"},
    {"[train]", "warmup_steps", "integer >= 0", "no (0)", "warm-up steps of the cosine schedule"},
    {"[train]", "min_lr", "number >= 0", "no (0)", "cosine floor; at most lr"},
    {"[train]", "steps", "integer >= 1", "no (100)",
     "optimizer steps to run (hp launch --steps overrides)"},
    {"[train]", "seed", "integer >= 0", "no (0)",
     "order of the --data windows (hp launch --seed overrides)"},
    {"[train]", "frozen", "string array", "no ([])",
     "initializers not trained: names or globs with * and ? (buffers such as RoPE tables)"},
    {"[offload]", "enabled", "boolean", "yes", "use host memory behind device memory"},
    {"[offload]", "targets", "string array", "no ([])",
     "parameters, gradients, optimizer, activations, kv_cache"},
    {"[offload]", "h2d_bandwidth", "bandwidth", "no (0)",
     "host -> device bytes/s used by the schedule"},
    {"[offload]", "h2d_bandwidth_source", "string", "no (user/unknown)",
     "table, user, unknown or measured:<probe> <date>"},
    {"[offload]", "d2h_bandwidth", "bandwidth", "no (0)", "device -> host bytes/s"},
    {"[offload]", "d2h_bandwidth_source", "string", "no (user/unknown)",
     "provenance of d2h_bandwidth"},
    {"[offload]", "host_memory", "bytes", "no (0)", "host memory hp may pin"},
    {"[offload]", "host_memory_source", "string", "no (user/unknown)", "provenance of host_memory"},
    {"[offload]", "margin", "float 0..0.5", "no (0.1)", "fraction of device memory kept free"},
    {"[offload]", "prefetch_lookahead", "integer >= 1", "no (1)",
     "ops ahead that a prefetch is issued"},
    {"[offload]", "device_budget", "bytes", "no (0)",
     "device bytes the schedule keeps each rank under (0: device memory x (1 - margin)); enforced "
     "on the cpu backend"},
};

constexpr KeyDoc kCluster[] = {
    {"[cluster]", "version", "integer", "yes", "cluster format version; this hp reads 1"},
    {"[cluster]", "name", "string", "yes", "cluster name (presets: the file stem)"},
    {"[cluster]", "description", "string", "no (\"\")", "one line for humans"},
    {"[cluster]", "nodes", "integer >= 1", "no (1)",
     "identical nodes described; hp plan --nodes overrides"},
    {"[cluster]", "rank_device", "string", "if several device types",
     "the device type whose devices are ranks"},
    {"[[device_types]]", "name", "string", "yes", "device type name"},
    {"[[device_types]]", "kind", "cpu|gpu|npu", "yes", "device kind"},
    {"[[device_types]]", "per_node", "integer >= 1", "yes", "devices of this type in one node"},
    {"[[device_types]]", "peak_flops", "table dtype -> FLOP/s", "yes",
     "dense peak per dtype: fp32, tf32, bf16, fp16, fp8, int8 (0 = unsupported/unknown)"},
    {"[[device_types]]", "sustained_flops", "table dtype -> FLOP/s", "no",
     "measured dense GEMM rate per dtype (hp devices --measure); hp plan prices matmuls at it "
     "instead of peak x efficiency"},
    {"[[device_types]]", "memory", "bytes", "yes", "device memory, e.g. \"80 GiB\""},
    {"[[device_types]]", "memory_bandwidth", "bandwidth", "yes",
     "device memory bandwidth, e.g. \"3.35 TB/s\""},
    {"[[device_types]]", "h2d_bandwidth", "bandwidth", "yes", "host -> device, one direction"},
    {"[[device_types]]", "d2h_bandwidth", "bandwidth", "yes", "device -> host, one direction"},
    {"[[tiers]]", "name", "string", "yes",
     "die, node, rack, supernode, scale-out, ...; innermost first"},
    {"[[tiers]]", "size", "integer >= 1", "yes except outermost",
     "ranks in one unit of the tier; omitted = all ranks"},
    {"[[tiers]]", "bandwidth", "bandwidth", "yes",
     "per rank, unidirectional, with the whole unit sending at once"},
    {"[[tiers]]", "latency", "seconds", "yes", "one-message latency, e.g. \"2us\""},
};

}  // namespace

std::span<const KeyDoc> recipe_keys() { return kRecipe; }
std::span<const KeyDoc> cluster_keys() { return kCluster; }

std::string format_key_table(std::span<const KeyDoc> keys) {
  std::string s = "| Section | Key | Type | Required | Meaning |\n|---|---|---|---|---|\n";
  for (const auto& k : keys) {
    s += "| ";
    for (std::string_view cell : {k.section, k.key, k.type, k.required, k.meaning}) {
      for (char c : cell) s += c == '|' ? std::string("\\|") : std::string(1, c);
      s += " | ";
    }
    s.pop_back();
    s += "\n";
  }
  return s;
}

}  // namespace hp::recipe
