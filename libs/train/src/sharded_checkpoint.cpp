// Sharded checkpoints (hp/train/sharded_checkpoint.h): the rank files, the state, and reading a
// layout's pieces back through run intersections.
#include "hp/train/sharded_checkpoint.h"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "checkpoint_dir.h"
#include "hp/core/fs.h"
#include "hp/plugin/hp_plugin.h"

namespace hp::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kState = "state.json";
constexpr int kVersion = 1;

/// FNV-1a over a piece's bytes: a torn or flipped file is caught, at memory speed.
std::uint64_t checksum(const char* p, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 1099511628211ull;
  return h;
}

std::string rank_name(int rank, const char* ext) { return fmt::format("rank-{:05}.{}", rank, ext); }

void merge_into(std::vector<Extent>& out, Extent r) {
  if (r.count <= 0) return;
  if (!out.empty() && out.back().begin + out.back().count == r.begin)
    out.back().count += r.count;
  else
    out.push_back(r);
}

std::int64_t total(const std::vector<Extent>& runs) {
  std::int64_t n = 0;
  for (const Extent& r : runs) n += r.count;
  return n;
}

Error bad(const fs::path& file, const std::string& msg) {
  return Error(Errc::bad_input, msg, file.string());
}

}  // namespace

std::vector<Extent> sub_runs(const std::vector<Extent>& runs, std::int64_t first,
                             std::int64_t count) {
  std::vector<Extent> out;
  std::int64_t at = 0;  // position of the current run's first element in the sequence
  for (const Extent& r : runs) {
    const std::int64_t lo = std::max(first, at), hi = std::min(first + count, at + r.count);
    if (lo < hi) merge_into(out, {r.begin + (lo - at), hi - lo});
    at += r.count;
    if (at >= first + count) break;
  }
  return out;
}

fs::path sharded_temp_dir(const fs::path& dir) { return detail::checkpoint_aside(dir, "hp-new"); }

Status begin_sharded(const fs::path& dir, bool force) {
  HP_TRY(detail::check_checkpoint_guard(dir, force));
  const fs::path tmp = sharded_temp_dir(dir);
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp, ec))
    return Error(Errc::runtime,
                 fmt::format("cannot create the checkpoint directory: {}", ec.message()),
                 tmp.string());
  return {};
}

Status write_shards(const fs::path& dir, int rank, const std::vector<Shard>& shards) {
  const fs::path tmp = sharded_temp_dir(dir);
  const fs::path bin = tmp / rank_name(rank, "bin");
  std::ofstream out(bin, std::ios::binary | std::ios::trunc);
  if (!out) return Error(Errc::runtime, "cannot write the checkpoint's rank file", bin.string());
  json pieces = json::array();
  std::int64_t offset = 0;
  for (const Shard& s : shards) {
    const std::int64_t n = total(s.runs);
    if (!s.data || s.data->dtype != HP_F32 || s.data->numel() != n)
      return Error(Errc::internal,
                   fmt::format("'{}' ({}): the piece holds {} elements, its runs {}", s.tensor,
                               s.kind, s.data ? s.data->numel() : 0, n));
    const auto bytes = static_cast<std::size_t>(n) * sizeof(float);
    const char* p = reinterpret_cast<const char*>(s.data->data.data());
    out.write(p, static_cast<std::streamsize>(bytes));
    json runs = json::array();
    for (const Extent& r : s.runs) runs.push_back(r.begin), runs.push_back(r.count);
    pieces.push_back({{"tensor", s.tensor},
                      {"kind", s.kind},
                      {"shape", s.shape},
                      {"runs", std::move(runs)},
                      {"offset", offset},
                      {"bytes", bytes},
                      {"checksum", checksum(p, bytes)}});
    offset += static_cast<std::int64_t>(bytes);
  }
  out.close();
  if (!out) return Error(Errc::runtime, "cannot write the checkpoint's rank file", bin.string());
  json doc = {{"rank", rank}, {"file", bin.filename().string()}, {"pieces", std::move(pieces)}};
  return write_file_atomic(tmp / rank_name(rank, "json"), doc.dump() + "\n");
}

Status commit_sharded(const fs::path& dir, const ShardedState& s) {
  const fs::path tmp = sharded_temp_dir(dir);
  json st = {{"format", kShardedFormat},
             {"version", kVersion},
             {"step", s.step},
             {"optimizer_step", s.optimizer_step},
             {"data_position", s.data_position},
             {"seed", s.seed},
             {"optimizer", s.optimizer},
             {"ranks", s.ranks}};
  Status written = write_file_atomic(tmp / kState, st.dump(2) + "\n");
  if (written) written = write_output_marker(tmp, "hp launch --checkpoint");
  if (!written) {
    abandon_sharded(dir);
    return written;
  }
  return detail::swap_checkpoint_into_place(tmp, dir);
}

void abandon_sharded(const fs::path& dir) {
  std::error_code ec;
  fs::remove_all(sharded_temp_dir(dir), ec);
}

namespace {

/// `dir`, or when it is missing the aside copy a crash between the swap's two renames leaves.
fs::path readable(const fs::path& dir) {
  std::error_code ec;
  const fs::path old = detail::checkpoint_aside(dir, "old");
  return !fs::exists(dir, ec) && fs::is_directory(old, ec) ? old : dir;
}

}  // namespace

bool is_sharded_checkpoint(const fs::path& requested) {
  auto text = read_file(readable(requested) / kState);
  if (!text) return false;
  const json j = json::parse(*text, nullptr, false);
  return j.is_object() && j.value("format", std::string()) == kShardedFormat;
}

Expected<ShardedCheckpoint> ShardedCheckpoint::open(const fs::path& requested) {
  const fs::path dir = readable(requested);
  ShardedCheckpoint c;
  c.dir_ = dir;
  const fs::path file = dir / kState;
  HP_ASSIGN_OR_RETURN(std::string text, read_file(file));
  try {
    const json j = json::parse(text);
    if (j.at("format").get<std::string>() != kShardedFormat ||
        j.at("version").get<int>() != kVersion)
      return bad(file, "not a sharded checkpoint of this hp's version");
    ShardedState& s = c.state_;
    s.step = j.at("step").get<std::int64_t>();
    s.optimizer_step = j.at("optimizer_step").get<std::int64_t>();
    s.data_position = j.at("data_position").get<std::int64_t>();
    s.seed = j.at("seed").get<std::uint64_t>();
    s.optimizer = j.at("optimizer").get<std::string>();
    s.ranks = j.at("ranks").get<int>();
    if (s.ranks < 1 || s.step < 0 || s.data_position < 0)
      return bad(file, "the step, data position or rank count is out of range");
  } catch (const json::exception& e) {
    return bad(file, fmt::format("malformed state: {}", e.what()));
  }
  for (int r = 0; r < c.state_.ranks; ++r) {
    const fs::path list = dir / rank_name(r, "json");
    auto t = read_file(list);
    if (!t) return bad(list, fmt::format("rank {}'s list of pieces is missing", r));
    try {
      const json j = json::parse(*t);
      for (const json& p : j.at("pieces")) {
        Piece piece;
        piece.rank = r;
        piece.offset = p.at("offset").get<std::int64_t>();
        piece.bytes = p.at("bytes").get<std::int64_t>();
        piece.checksum = p.at("checksum").get<std::uint64_t>();
        piece.shape = p.at("shape").get<std::vector<std::int64_t>>();
        const auto flat = p.at("runs").get<std::vector<std::int64_t>>();
        if (flat.size() % 2 || piece.offset < 0 || piece.bytes < 0)
          return bad(list, "a piece's runs, offset or size is malformed");
        for (std::size_t i = 0; i < flat.size(); i += 2)
          piece.runs.push_back({flat[i], flat[i + 1]});
        if (total(piece.runs) * static_cast<std::int64_t>(sizeof(float)) != piece.bytes)
          return bad(list, "a piece's size disagrees with its runs");
        const std::pair<std::string, std::string> key = {p.at("tensor").get<std::string>(),
                                                         p.at("kind").get<std::string>()};
        auto& list = c.pieces_[key];
        if (list.empty()) c.order_.push_back(key);
        list.push_back(std::move(piece));
      }
    } catch (const json::exception& e) {
      return bad(list, fmt::format("malformed list of pieces: {}", e.what()));
    }
  }
  return c;
}

bool ShardedCheckpoint::has(const std::string& tensor, const std::string& kind) const {
  return pieces_.count({tensor, kind}) > 0;
}

Expected<exec::HostTensor> ShardedCheckpoint::read(const std::string& tensor,
                                                   const std::string& kind,
                                                   const std::vector<std::int64_t>& shape,
                                                   const std::vector<Extent>& runs,
                                                   std::vector<std::int64_t> dims) const {
  const std::string what = fmt::format("tensor '{}' ({})", tensor, kind);
  auto it = pieces_.find({tensor, kind});
  if (it == pieces_.end()) return bad(dir_, fmt::format("the checkpoint has no {}", what));
  exec::HostTensor out;
  out.name = tensor;
  out.dtype = HP_F32;
  out.dims = std::move(dims);
  const std::int64_t want = total(runs);
  out.data.assign(static_cast<std::size_t>(want) * sizeof(float), 0);
  float* dst = out.as<float>();
  std::vector<char> covered(static_cast<std::size_t>(want), 0);
  for (const Piece& p : it->second) {
    if (p.shape != shape)
      return bad(dir_, fmt::format("{} is shaped {} in the checkpoint, {} here", what,
                                   exec::dims_label(p.shape), exec::dims_label(shape)));
    // Where each of the piece's runs starts among its elements, for the binary search below.
    std::vector<std::int64_t> at(p.runs.size() + 1, 0);
    for (std::size_t k = 0; k < p.runs.size(); ++k) at[k + 1] = at[k] + p.runs[k].count;
    std::vector<float> data;  // read on the first intersection
    std::int64_t out_at = 0;
    for (const Extent& r : runs) {
      // The first piece run that ends after r begins.
      auto k = static_cast<std::size_t>(
          std::upper_bound(p.runs.begin(), p.runs.end(), r.begin,
                           [](std::int64_t b, const Extent& x) { return b < x.begin + x.count; }) -
          p.runs.begin());
      for (; k < p.runs.size() && p.runs[k].begin < r.begin + r.count; ++k) {
        const Extent& q = p.runs[k];
        const std::int64_t lo = std::max(r.begin, q.begin),
                           hi = std::min(r.begin + r.count, q.begin + q.count);
        if (lo >= hi) continue;
        if (data.empty()) {
          const fs::path bin = dir_ / rank_name(p.rank, "bin");
          std::ifstream in(bin, std::ios::binary);
          data.resize(static_cast<std::size_t>(p.bytes / static_cast<std::int64_t>(sizeof(float))));
          in.seekg(p.offset);
          in.read(reinterpret_cast<char*>(data.data()), p.bytes);
          if (!in || in.gcount() != p.bytes)
            return bad(bin,
                       fmt::format("{}: rank {}'s piece is truncated or missing", what, p.rank));
          if (checksum(reinterpret_cast<const char*>(data.data()),
                       static_cast<std::size_t>(p.bytes)) != p.checksum)
            return bad(bin, fmt::format("{}: rank {}'s piece is corrupt (checksum mismatch)", what,
                                        p.rank));
        }
        const std::int64_t src = at[k] + (lo - q.begin), pos = out_at + (lo - r.begin);
        std::memcpy(dst + pos, data.data() + src,
                    static_cast<std::size_t>(hi - lo) * sizeof(float));
        std::fill(covered.begin() + pos, covered.begin() + pos + (hi - lo), 1);
      }
      out_at += r.count;
    }
  }
  const auto missing = std::count(covered.begin(), covered.end(), 0);
  if (missing > 0)
    return bad(dir_, fmt::format("{}: {} of the {} elements this rank needs are in no rank's piece "
                                 "(the checkpoint's slices are incomplete)",
                                 what, missing, want));
  return out;
}

Expected<Checkpoint> ShardedCheckpoint::whole() const {
  Checkpoint c;
  c.step = state_.step;
  c.data_position = state_.data_position;
  c.seed = state_.seed;
  c.optimizer = state_.optimizer;
  c.state.step = state_.optimizer_step;
  auto all = [&](const std::string& tensor, const std::string& kind) {
    const auto& shape = pieces_.at({tensor, kind}).front().shape;
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return read(tensor, kind, shape, {{0, n}}, shape);
  };
  for (const auto& [tensor, kind] : order_) {
    if (kind == "param") {
      HP_ASSIGN_OR_RETURN(auto p, all(tensor, kind));
      for (const char* m : {"exp_avg", "exp_avg_sq"})
        if (has(tensor, m)) {
          HP_ASSIGN_OR_RETURN(auto t, all(tensor, m));
          (std::string(m) == "exp_avg" ? c.state.exp_avg : c.state.exp_avg_sq)
              .push_back(std::move(t));
        }
      c.params.push_back(std::move(p));
    } else if (kind == "buffer") {
      HP_ASSIGN_OR_RETURN(auto b, all(tensor, kind));
      c.buffers.push_back(std::move(b));
    }
  }
  for (const auto* list : {&c.state.exp_avg, &c.state.exp_avg_sq})
    if (!list->empty() && list->size() != c.params.size())
      return bad(dir_, "the optimizer state covers some parameters only");
  return c;
}

}  // namespace hp::train
