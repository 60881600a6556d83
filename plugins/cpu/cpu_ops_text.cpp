// TfIdfVectorizer on the cpu backend for integer token ids (int32, int64): the n-gram counting of
// text-classification exports. String tokens are not carried by the executor.
//
// The attribute pool_int64s lists the n-grams to count, grouped by length: ngram_counts[i] is where
// the (i+1)-grams start in it. Each row of the input is scanned for every n in [min_gram_length,
// max_gram_length] and every skip s in [0, max_skip_count] (an n-gram's tokens s + 1 apart; a
// unigram has no gaps, so it is counted once, at s = 0). ngram_indexes maps each pooled n-gram to
// its output column; mode TF writes counts, IDF the weight of each n-gram seen, TFIDF count times
// weight (weights default to 1).
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "cpu_ops.h"

namespace hp_cpu {
namespace {

void tfidf(OpCall& c) {
  const View& x = c.need(0);
  if (x.dims.empty() || x.dims.size() > 2) c.fail("input must be [C] or [N, C]");
  const std::vector<int64_t> tokens = x.ints();
  const std::vector<int64_t> pool = c.ints("pool_int64s"), counts = c.ints("ngram_counts"),
                             indexes = c.ints("ngram_indexes");
  const std::vector<double> weights = c.floats("weights");
  const int64_t min_n = c.i("min_gram_length", 1), max_n = c.i("max_gram_length", 1),
                max_skip = c.i("max_skip_count", 0);
  const std::string mode = c.s("mode", "TF");
  if (mode != "TF" && mode != "IDF" && mode != "TFIDF") c.fail("unknown mode '" + mode + "'");
  if (min_n < 1 || max_n < min_n || max_skip < 0) c.fail("bad n-gram lengths or skip count");
  // Pooled n-gram (its tokens) -> position in the pool's n-gram order.
  std::map<std::vector<int64_t>, int64_t> ngrams;
  int64_t next = 0;
  for (size_t lvl = 0; lvl < counts.size(); ++lvl) {
    const int64_t n = static_cast<int64_t>(lvl) + 1;
    const int64_t lo = counts[lvl], hi = lvl + 1 < counts.size()
                                             ? counts[lvl + 1]
                                             : static_cast<int64_t>(pool.size());
    if (lo < 0 || hi < lo || hi > static_cast<int64_t>(pool.size()) || (hi - lo) % n)
      c.fail("ngram_counts does not split pool_int64s into whole n-grams");
    for (int64_t p = lo; p < hi; p += n)
      ngrams[std::vector<int64_t>(pool.begin() + p, pool.begin() + p + n)] = next++;
  }
  if (static_cast<int64_t>(indexes.size()) != next) c.fail("ngram_indexes must map every n-gram");
  if (!weights.empty() && weights.size() != indexes.size()) c.fail("one weight per n-gram");
  const int64_t width = indexes.empty() ? 0 : *std::max_element(indexes.begin(), indexes.end()) + 1;
  const int64_t rows = x.dims.size() == 2 ? x.dims[0] : 1, len = x.dims.back();
  View y = c.out(0, HP_F32, x.dims.size() == 2 ? Dims{rows, width} : Dims{width});
  std::fill(y.as<float>(), y.as<float>() + rows * width, 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> count(static_cast<size_t>(next), 0);
    for (int64_t n = min_n; n <= max_n; ++n)
      for (int64_t s = 0; s <= (n == 1 ? 0 : max_skip); ++s)
        for (int64_t i = 0; i + (n - 1) * (s + 1) < len; ++i) {
          std::vector<int64_t> g(static_cast<size_t>(n));
          for (int64_t k = 0; k < n; ++k) g[k] = tokens[r * len + i + k * (s + 1)];
          auto it = ngrams.find(g);
          if (it != ngrams.end()) count[it->second] += 1;
        }
    for (int64_t g = 0; g < next; ++g) {
      if (count[g] == 0) continue;
      const double w = weights.empty() ? 1.0 : weights[g];
      const double v = mode == "TF" ? count[g] : mode == "IDF" ? w : count[g] * w;
      y.as<float>()[r * width + indexes[g]] = static_cast<float>(v);
    }
  }
}

}  // namespace

void register_text_ops(OpTable& t) {
  t["TfIdfVectorizer"] = {tfidf, [](const std::vector<int32_t>& d) {
                            return d.size() == 1 && (d[0] == HP_I32 || d[0] == HP_I64);
                          }};
}

}  // namespace hp_cpu
