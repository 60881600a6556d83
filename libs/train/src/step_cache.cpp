// StepCache (step_cache.h): ZeRO-3 buckets kept from their first use to the step's end.
#include "step_cache.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>

namespace hp::train::detail {

StepCache::StepCache(exec::WeightSource& inner, std::vector<std::vector<std::int64_t>> sizes)
    : inner_(inner), sizes_(std::move(sizes)) {
  kept_.resize(sizes_.size());
  held_.assign(sizes_.size(), 0);
  asked_.assign(sizes_.size(), 0);
}

void StepCache::prefetch(std::size_t g) {
  if (g >= held_.size() || held_[g] || asked_[g]) return;
  asked_[g] = 1;
  inner_.prefetch(g);
}

Status StepCache::fetch(std::size_t g, std::span<float* const> dst) {
  if (g >= held_.size() || dst.size() != sizes_[g].size())
    return Error(Errc::internal,
                 fmt::format("bucket {} fetched with {} destinations", g, dst.size()));
  if (!held_[g]) {
    auto& kept = kept_[g];
    kept.resize(sizes_[g].size());
    std::vector<float*> into;
    for (std::size_t i = 0; i < kept.size(); ++i) {
      kept[i].resize(static_cast<std::size_t>(sizes_[g][i]));
      into.push_back(kept[i].data());
      bytes_ += sizes_[g][i] * static_cast<std::int64_t>(sizeof(float));
    }
    peak_ = std::max(peak_, bytes_);
    HP_TRY(inner_.fetch(g, into));
    held_[g] = 1;
    asked_[g] = 0;
    ++gathered_;
  }
  for (std::size_t i = 0; i < dst.size(); ++i)
    if (dst[i]) std::memcpy(dst[i], kept_[g][i].data(), kept_[g][i].size() * sizeof(float));
  return {};
}

Expected<std::unique_ptr<StepCache>> make_step_cache(
    exec::WeightSource& inner, const std::vector<std::vector<std::string>>& groups,
    const std::vector<exec::HostTensor>& params) {
  std::vector<std::vector<std::int64_t>> sizes;
  for (const auto& g : groups) {
    auto& s = sizes.emplace_back();
    for (const auto& name : g) {
      auto it = std::find_if(params.begin(), params.end(),
                             [&](const exec::HostTensor& p) { return p.name == name; });
      if (it == params.end())
        return Error(Errc::internal, "a ZeRO-3 bucket names an unknown parameter", name);
      s.push_back(it->numel());
    }
  }
  return std::make_unique<StepCache>(inner, std::move(sizes));
}

Expected<exec::WeightSource*> lend_through(std::unique_ptr<StepCache>& cache,
                                           exec::WeightSource& source,
                                           const std::vector<std::vector<std::string>>& groups,
                                           const std::vector<exec::HostTensor>& params,
                                           bool per_step) {
  if (!per_step) return &source;
  HP_ASSIGN_OR_RETURN(cache, make_step_cache(source, groups, params));
  return cache.get();
}

void StepCache::end_step() {
  for (std::size_t g = 0; g < kept_.size(); ++g) {
    kept_[g].clear();
    kept_[g].shrink_to_fit();
    held_[g] = 0;
  }
  bytes_ = 0;
}

}  // namespace hp::train::detail
