// What the two halves of the planner's search share (search.cpp enumerates and bounds the level-1
// configurations, search_rank.cpp runs level 2 on them in bound order and keeps the best plans).
#pragma once

#include <vector>

#include "hp/planner/planner.h"

namespace hp::planner::detail {

// A level-1 configuration with its time lower bound (the order level 2 visits them in).
struct Bounded {
  Config config;
  double bound = 0;
};

// Keeps the smallest need any candidate had: what the error says when nothing fits.
inline void note_shortfall(Shortfall& sf, double need, double states, double acts,
                           const Config& c) {
  if (sf.need == 0 || need < sf.need) sf = {need, states, acts, c};
}

// Level 2 on the candidates in bound order, stopping as soon as no candidate can enter the top k or
// the structure list (branch and bound).
void rank_by_level2(const SearchInput& in, const std::vector<Bounded>& cands, SearchResult& res);

}  // namespace hp::planner::detail
