// --fix KEY=VALUE: pins part of the configuration. The search still runs over everything left free,
// so with every degree pinned it evaluates exactly that configuration (how published configurations
// are checked against their reported iteration times).
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
               "keys: dp, tp, pp, optimizer_shard, micro_batch_size, micro_batches, schedule, virtual_stages, "
               "sequence_parallel, recompute");
}

template <class T>
Status set(std::optional<T>& slot, T value, const std::string& arg) {
  if (slot && *slot != value) return bad(arg, "contradicts an earlier --fix of the same key");
  slot = value;
  return {};
}

}  // namespace

bool Fixed::admits(const Config& c) const {
  return (!dp || *dp == c.dp) && (!tp || *tp == c.tp) && (!pp || *pp == c.pp) &&
         (!micro_batch_size || *micro_batch_size == c.micro_batch_size) &&
         (!micro_batches || *micro_batches == c.micro_batches) &&
         (!virtual_stages || *virtual_stages == c.virtual_stages) &&
         (!optimizer_shard || *optimizer_shard == c.optimizer_shard) && (!schedule || *schedule == c.schedule) &&
         (!sequence_parallel || *sequence_parallel == c.sequence_parallel);
}

Expected<Fixed> parse_fixes(const std::vector<std::string>& args) {
  Fixed f;
  for (const auto& arg : args) {
    const auto eq = arg.find('=');
    if (eq == std::string::npos) return bad(arg, "expected KEY=VALUE");
    const std::string key = arg.substr(0, eq), val = arg.substr(eq + 1);
    const auto n = parse_int(val);
    auto need_int = [&](std::optional<std::int64_t>& slot, std::int64_t min) -> Status {
      if (!n || *n < min) return bad(arg, fmt::format("'{}' is not an integer >= {}", val, min));
      return set(slot, *n, arg);
    };
    Status st;
    if (key == "dp") st = need_int(f.dp, 1);
    else if (key == "tp") st = need_int(f.tp, 1);
    else if (key == "pp") st = need_int(f.pp, 1);
    else if (key == "micro_batch_size") st = need_int(f.micro_batch_size, 1);
    else if (key == "micro_batches") st = need_int(f.micro_batches, 1);
    else if (key == "virtual_stages") st = need_int(f.virtual_stages, 1);
    else if (key == "optimizer_shard") {
      int level = -1;
      for (int l = 0; l <= 3; ++l)
        if (val == recipe::optimizer_shard_name(l) || (n && *n == l)) level = l;
      if (level < 0) return bad(arg, "expected 0..3, none, optimizer, gradients or parameters");
      st = set(f.optimizer_shard, level, arg);
    } else if (key == "schedule") {
      std::optional<recipe::Schedule> s;
      for (auto x : {recipe::Schedule::gpipe, recipe::Schedule::one_f_one_b, recipe::Schedule::interleaved})
        if (val == recipe::schedule_name(x)) s = x;
      if (!s) return bad(arg, "expected gpipe, 1f1b or interleaved");
      st = set(f.schedule, *s, arg);
    } else if (key == "sequence_parallel") {
      if (val != "true" && val != "false") return bad(arg, "expected true or false");
      st = set(f.sequence_parallel, val == "true", arg);
    } else if (key == "recompute") {
      std::optional<recipe::Recompute> r;
      for (auto x : {recipe::Recompute::none, recipe::Recompute::selective, recipe::Recompute::full})
        if (val == recipe::recompute_name(x)) r = x;
      if (!r) return bad(arg, "expected none, selective or full");
      st = set(f.recompute, *r, arg);
    } else {
      return bad(arg, fmt::format("unknown key '{}'", key));
    }
    if (!st) return std::move(st).error();
  }
  if (f.schedule && *f.schedule != recipe::Schedule::interleaved && f.virtual_stages && *f.virtual_stages > 1)
    return Error(Errc::usage, "--fix virtual_stages > 1 needs schedule=interleaved", "", "drop one of the two");
  if (f.schedule && *f.schedule == recipe::Schedule::interleaved && f.virtual_stages && *f.virtual_stages < 2)
    return Error(Errc::usage, "--fix schedule=interleaved needs virtual_stages >= 2", "", "drop one of the two");
  return f;
}

}  // namespace hp::planner
