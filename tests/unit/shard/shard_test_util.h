// Shared by the shard tests: recipes under tests/data/recipes/shard, and an in-process "world" that
// runs every rank's partition in its own thread with a CommOps doing the collectives and the
// pipeline's Send/Recv in memory, so partitions are checked numerically against the unsharded
// model.
#pragma once

#include <onnx/onnx_pb.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/shard/shard.h"

namespace shard_test {

using hp::exec::CommNode;
using hp::exec::HostTensor;

inline std::string recipe_file(const std::string& name) {
  return std::string(HP_SOURCE_DIR) + "/tests/data/recipes/shard/" + name + ".toml";
}

inline std::string attr(const CommNode& n, const std::string& key) {
  for (const auto& [k, v] : n.attrs)
    if (k == key) return v;
  return "";
}

inline std::vector<std::int64_t> int_list(const std::string& s) {
  std::vector<std::int64_t> v;
  std::size_t p = 0;
  while (p < s.size()) {
    auto q = s.find(',', p);
    if (q == std::string::npos) q = s.size();
    v.push_back(std::stoll(s.substr(p, q - p)));
    p = q + 1;
  }
  return v;
}

// Row-major helpers on f32/i64 host tensors (any element size).
inline HostTensor concat(const std::vector<HostTensor>& parts, std::int64_t axis) {
  HostTensor out = parts[0];
  int es = hp::exec::dtype_size(out.dtype);
  std::int64_t outer = 1;
  for (std::int64_t d = 0; d < axis; ++d) outer *= out.dims[static_cast<std::size_t>(d)];
  out.dims[static_cast<std::size_t>(axis)] = 0;
  for (const auto& p : parts)
    out.dims[static_cast<std::size_t>(axis)] += p.dims[static_cast<std::size_t>(axis)];
  out.data.clear();
  for (std::int64_t o = 0; o < outer; ++o)
    for (const auto& p : parts) {
      std::size_t chunk = p.data.size() / static_cast<std::size_t>(outer);
      out.data.insert(
          out.data.end(),
          p.data.begin() + static_cast<std::ptrdiff_t>(o * static_cast<std::int64_t>(chunk)),
          p.data.begin() + static_cast<std::ptrdiff_t>((o + 1) * static_cast<std::int64_t>(chunk)));
    }
  (void)es;
  return out;
}

inline std::vector<HostTensor> split(const HostTensor& t, std::int64_t axis, std::int64_t n) {
  std::vector<HostTensor> parts;
  std::int64_t outer = 1;
  for (std::int64_t d = 0; d < axis; ++d) outer *= t.dims[static_cast<std::size_t>(d)];
  std::size_t row = t.data.size() / static_cast<std::size_t>(outer);
  std::size_t chunk = row / static_cast<std::size_t>(n);
  for (std::int64_t k = 0; k < n; ++k) {
    HostTensor p = t;
    p.dims[static_cast<std::size_t>(axis)] /= n;
    p.data.clear();
    for (std::int64_t o = 0; o < outer; ++o) {
      auto b = t.data.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(o) * row +
                                                            static_cast<std::size_t>(k) * chunk);
      p.data.insert(p.data.end(), b, b + static_cast<std::ptrdiff_t>(chunk));
    }
    parts.push_back(std::move(p));
  }
  return parts;
}

// Every rank of the world shares one of these; each rank's CommOps is a view with its own rank.
class World {
 public:
  struct Slot {
    std::map<std::int64_t, HostTensor> in;
    int taken = 0;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, Slot> slots;  // collective key -> deposits
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, HostTensor>
      mail;  // (src, dst, tag)
  int collectives = 0, messages = 0;
  std::map<std::string, int> by_op;  // collective calls by op type (summed over ranks)
};

class Comm : public hp::exec::CommOps {
 public:
  Comm(World& w, std::int64_t rank) : w_(w), rank_(rank) {}
  bool handles(const std::string& op) const override {
    return op == "AllReduce" || op == "AllGather" || op == "ReduceScatter" || op == "AllToAll" ||
           op == "Send" || op == "Recv";
  }
  hp::Status run(const CommNode& node, const std::vector<const HostTensor*>& in,
                 std::vector<HostTensor>& out) override {
    std::unique_lock<std::mutex> lock(w_.mu);
    if (node.op_type == "Send") {
      w_.mail[{rank_, std::stoll(attr(node, "peer")), std::stoll(attr(node, "tag"))}] = *in[0];
      ++w_.messages;
      w_.cv.notify_all();
      return {};
    }
    if (node.op_type == "Recv") {
      std::tuple<std::int64_t, std::int64_t, std::int64_t> key{
          std::stoll(attr(node, "peer")), rank_, std::stoll(attr(node, "tag"))};
      w_.cv.wait(lock, [&] { return w_.mail.count(key) > 0; });
      out[0] = w_.mail[key];
      w_.mail.erase(key);
      return {};
    }
    auto group = int_list(attr(node, "group"));
    std::string key = node.name + "|" + attr(node, "group");
    auto& slot = w_.slots[key];
    slot.in[rank_] = *in[0];
    ++w_.collectives;
    ++w_.by_op[node.op_type];
    w_.cv.notify_all();
    w_.cv.wait(lock, [&] { return w_.slots[key].in.size() == group.size(); });
    std::vector<HostTensor> parts;
    for (auto r : group) parts.push_back(w_.slots[key].in[r]);
    std::int64_t me = 0;
    for (std::size_t i = 0; i < group.size(); ++i)
      if (group[i] == rank_) me = static_cast<std::int64_t>(i);
    if (++w_.slots[key].taken == static_cast<int>(group.size())) w_.slots.erase(key);
    lock.unlock();
    auto sum = [&] {
      HostTensor s = parts[0];
      for (std::size_t k = 1; k < parts.size(); ++k)
        for (std::int64_t i = 0; i < s.numel(); ++i) s.as<float>()[i] += parts[k].as<float>()[i];
      return s;
    };
    if (node.op_type == "AllReduce")
      out[0] = sum();
    else if (node.op_type == "AllGather")
      out[0] = concat(parts, std::stoll(attr(node, "axis")));
    else if (node.op_type == "ReduceScatter")
      out[0] = split(sum(), std::stoll(attr(node, "axis")),
                     static_cast<std::int64_t>(group.size()))[static_cast<std::size_t>(me)];
    else if (node.op_type == "AllToAll") {
      // Member j's chunk `me` (split along split_axis), concatenated along concat_axis in member
      // order.
      std::vector<HostTensor> mine;
      for (const auto& part : parts)
        mine.push_back(
            split(part, std::stoll(attr(node, "split_axis")),
                  static_cast<std::int64_t>(group.size()))[static_cast<std::size_t>(me)]);
      out[0] = concat(mine, std::stoll(attr(node, "concat_axis")));
    }
    return {};
  }

 private:
  World& w_;
  std::int64_t rank_;
};

}  // namespace shard_test
