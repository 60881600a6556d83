// --fix KEY=VALUE: pins part of the configuration. The search still runs over everything left free,
// so with every degree pinned it evaluates exactly that configuration (how published configurations
// are checked against their reported iteration times).
#include <algorithm>
#include <charconv>
#include <string_view>

#include <fmt/core.h>

#include "hp/planner/planner.h"

namespace hp::planner {
namespace {

std::optional<std::int64_t> parse_int(std::string_view v) {
  std::int64_t out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size() || out < 0) return std::nullopt;
  return out;
}

Error bad(const std::string& arg, const std::string& why) {
  return Error(Errc::usage, fmt::format("--fix {}: {}", arg, why), "",
               "keys: dp, tp, pp, ep, shard_group, optimizer_shard (zero), micro_batch_size, "
               "micro_batches, schedule, virtual_stages, sequence_parallel, recompute");
}

// The names people already use for the keys: Megatron's and DeepSpeed's (tensor, pipeline, zero
// stage), the long forms, and the short ones of the plan table. Dashes read as underscores, so
// --fix micro-batch-size=2 works as it does in the other options.
struct Alias {
  const char* alias;
  const char* key;
};
constexpr Alias kAliases[] = {
    {"data", "dp"},
    {"data_parallel", "dp"},
    {"tensor", "tp"},
    {"tensor_parallel", "tp"},
    {"pipeline", "pp"},
    {"pipeline_parallel", "pp"},
    {"expert", "ep"},
    {"expert_parallel", "ep"},
    {"zero", "optimizer_shard"},
    {"zero_stage", "optimizer_shard"},
    {"mbs", "micro_batch_size"},
    {"sp", "sequence_parallel"},
    {"hsdp", "shard_group"},
};

std::string canonical_key(std::string key) {
  std::replace(key.begin(), key.end(), '-', '_');
  for (const auto& a : kAliases)
    if (key == a.alias) return a.key;
  return key;
}

template <class T>
Status set(std::optional<T>& slot, T value, const std::string& arg) {
  if (slot && *slot != value) return bad(arg, "contradicts an earlier --fix of the same key");
  slot = value;
  return {};
}

}  // namespace

bool Fixed::admits(const Config& c) const {
  return (!dp || *dp == c.dp) && (!tp || *tp == c.tp) && (!ep || *ep == c.ep) &&
         (!pp || *pp == c.pp) && (!micro_batch_size || *micro_batch_size == c.micro_batch_size) &&
         (!micro_batches || *micro_batches == c.micro_batches) &&
         (!virtual_stages || *virtual_stages == c.virtual_stages) &&
         (!optimizer_shard || *optimizer_shard == c.optimizer_shard) &&
         (!schedule || *schedule == c.schedule) &&
         (!sequence_parallel || *sequence_parallel == c.sequence_parallel);
}

Expected<Fixed> parse_fixes(const std::vector<std::string>& args) {
  Fixed f;
  for (const auto& arg : args) {
    const auto eq = arg.find('=');
    if (eq == std::string::npos) return bad(arg, "expected KEY=VALUE");
    const std::string key = canonical_key(arg.substr(0, eq)), val = arg.substr(eq + 1);
    const auto n = parse_int(val);
    auto need_int = [&](std::optional<std::int64_t>& slot, std::int64_t min) -> Status {
      if (!n || *n < min) return bad(arg, fmt::format("'{}' is not an integer >= {}", val, min));
      return set(slot, *n, arg);
    };
    Status st;
    if (key == "dp")
      st = need_int(f.dp, 1);
    else if (key == "tp")
      st = need_int(f.tp, 1);
    else if (key == "pp")
      st = need_int(f.pp, 1);
    else if (key == "ep")
      st = need_int(f.ep, 1);
    else if (key == "shard_group")
      st = need_int(f.shard_group, 1);
    else if (key == "micro_batch_size")
      st = need_int(f.micro_batch_size, 1);
    else if (key == "micro_batches")
      st = need_int(f.micro_batches, 1);
    else if (key == "virtual_stages")
      st = need_int(f.virtual_stages, 1);
    else if (key == "optimizer_shard") {
      int level = -1;
      for (int l = 0; l <= 3; ++l)
        if (val == recipe::optimizer_shard_name(l) || (n && *n == l)) level = l;
      if (level < 0) return bad(arg, "expected 0..3, none, optimizer, gradients or parameters");
      st = set(f.optimizer_shard, level, arg);
    } else if (key == "schedule") {
      std::optional<recipe::Schedule> s;
      for (auto x : {recipe::Schedule::gpipe, recipe::Schedule::one_f_one_b,
                     recipe::Schedule::interleaved, recipe::Schedule::zb_h1})
        if (val == recipe::schedule_name(x)) s = x;
      if (val == "zbv")
        return bad(arg, "the planner does not model zbv (its V-shaped chunk placement); use zb-h1");
      if (!s) return bad(arg, "expected gpipe, 1f1b, interleaved or zb-h1");
      st = set(f.schedule, *s, arg);
    } else if (key == "sequence_parallel") {
      if (val != "true" && val != "false") return bad(arg, "expected true or false");
      st = set(f.sequence_parallel, val == "true", arg);
    } else if (key == "recompute") {
      std::optional<recipe::Recompute> r;
      for (auto x :
           {recipe::Recompute::none, recipe::Recompute::selective, recipe::Recompute::full})
        if (val == recipe::recompute_name(x)) r = x;
      if (!r) return bad(arg, "expected none, selective or full");
      st = set(f.recompute, *r, arg);
    } else {
      return bad(arg, fmt::format("unknown key '{}'", arg.substr(0, eq)));
    }
    HP_TRY(st);
  }
  if (f.schedule && *f.schedule != recipe::Schedule::interleaved && f.virtual_stages &&
      *f.virtual_stages > 1)
    return Error(Errc::usage, "--fix virtual_stages > 1 needs schedule=interleaved", "",
                 "drop one of the two");
  if (f.schedule && *f.schedule == recipe::Schedule::interleaved && f.virtual_stages &&
      *f.virtual_stages < 2)
    return Error(Errc::usage, "--fix schedule=interleaved needs virtual_stages >= 2", "",
                 "drop one of the two");
  return f;
}

Status check_fixes(const Fixed& f, std::int64_t ranks, const ModelProfile& m,
                   std::int64_t global_batch) {
  auto bad_input = [](std::string msg, std::string hint) {
    return Error(Errc::bad_input, std::move(msg), "", std::move(hint));
  };
  std::int64_t product = 1;
  std::string named;
  for (auto [key, val] : {std::pair{"dp", f.dp}, std::pair{"tp", f.tp}, std::pair{"pp", f.pp}})
    if (val) {
      product *= *val;
      named += fmt::format("{}{}={}", named.empty() ? "" : " x ", key, *val);
    }
  if (f.dp && f.tp && f.pp ? product != ranks : ranks % product != 0)
    return bad_input(
        fmt::format("--fix {}{} does not {} the cluster's {} ranks", named,
                    named.find(" x ") != std::string::npos ? fmt::format(" = {}", product) : "",
                    f.dp && f.tp && f.pp ? "match" : "divide", ranks),
        "dp * tp * pp must equal the rank count: change --fix or --nodes");
  if (m.static_batch > 0 && f.micro_batches && *f.micro_batches > 1 && f.pp && *f.pp > 1)
    return bad_input(
        fmt::format("--fix micro_batches={}: the model's batch is static ({}), and pipeline "
                    "stages run one micro-batch at a time with static shapes",
                    *f.micro_batches, m.static_batch),
        "export the model with a dynamic batch axis, or fix pp=1");
  const auto blocks = static_cast<std::int64_t>(m.blocks.size());
  if (f.pp && *f.pp > blocks)
    return bad_input(fmt::format("--fix pp={} exceeds the model's {} blocks", *f.pp, blocks),
                     "use pp <= the block count");
  if (f.pp && f.virtual_stages && *f.pp * *f.virtual_stages > blocks)
    return bad_input(fmt::format("--fix pp={} x virtual_stages={} exceeds the model's {} blocks",
                                 *f.pp, *f.virtual_stages, blocks),
                     "every virtual stage needs at least one block");
  if (f.tp && m.heads > 0 && m.heads % *f.tp != 0)
    return bad_input(
        fmt::format("--fix tp={} does not divide the model's {} attention heads", *f.tp, m.heads),
        "Megatron TP splits whole heads: use a divisor of the head count");
  std::int64_t experts = 0;
  for (const auto& b : m.blocks) experts = std::max(experts, b.experts);
  if (f.ep && *f.ep > 1 && experts == 0)
    return bad_input(fmt::format("--fix ep={}: the model has no routed experts", *f.ep),
                     "drop ep (it needs a MoE model)");
  if (f.ep && *f.ep > 1 && experts % *f.ep != 0)
    return bad_input(
        fmt::format("--fix ep={} does not divide the model's {} experts", *f.ep, experts),
        "use a divisor of the expert count");
  if (f.ep && f.dp && *f.dp % *f.ep != 0)
    return bad_input(fmt::format("--fix ep={} does not divide dp={}", *f.ep, *f.dp),
                     "expert parallelism is carved out of dp");
  if (f.shard_group && f.dp && *f.dp % *f.shard_group != 0)
    return bad_input(
        fmt::format("--fix shard_group={} does not divide dp={}", *f.shard_group, *f.dp),
        "the HSDP group is a divisor of the DP group");
  if (f.dp && global_batch % *f.dp != 0)
    return bad_input(
        fmt::format("the global batch {} is not divisible by --fix dp={}", global_batch, *f.dp),
        "use a global batch that is a multiple of dp");
  const std::int64_t per_replica = f.dp ? global_batch / *f.dp : global_batch;
  if (f.micro_batch_size && per_replica % *f.micro_batch_size != 0)
    return bad_input(
        fmt::format("--fix micro_batch_size={} does not divide the {} sequences per {}",
                    *f.micro_batch_size, per_replica, f.dp ? "data-parallel replica" : "step"),
        "use a divisor of global batch / dp");
  if (f.micro_batch_size && f.micro_batches && f.dp &&
      *f.micro_batch_size * *f.micro_batches != per_replica)
    return bad_input(
        fmt::format(
            "--fix micro_batch_size={} x micro_batches={} is not the {} sequences per replica",
            *f.micro_batch_size, *f.micro_batches, per_replica),
        "micro_batch_size * micro_batches must equal global batch / dp");
  return {};
}

}  // namespace hp::planner
