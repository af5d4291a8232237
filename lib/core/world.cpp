// SPDX-License-Identifier: Apache-2.0
#include "core/world.h"

#include <algorithm>
#include <sstream>
#include <tuple>

#include "base/error.h"

namespace hora {

// Rank 0 of `parent` gathers every rank's color and key, orders each color's ranks by (key,
// rank) and sends back every rank's place; all ranks of a color then agree on their group.
SplitPlace splitPlace(ControlPlane &parent, int color, int key) {
  std::vector<std::string> all = parent.gatherToRoot(std::to_string(color) + " " + std::to_string(key));
  std::string answer;
  if (parent.rank() == 0) {
    struct Entry {
      int color, key, rank;
    };
    std::vector<Entry> entries;
    for (size_t r = 0; r < all.size(); ++r) {
      std::istringstream in(all[r]);
      Entry e{-1, 0, static_cast<int>(r)};
      in >> e.color >> e.key;
      entries.push_back(e);
    }
    std::vector<Entry> order = entries;
    std::sort(order.begin(), order.end(), [](const Entry &a, const Entry &b) {
      return std::tie(a.color, a.key, a.rank) < std::tie(b.color, b.key, b.rank);
    });
    std::vector<SplitPlace> places(entries.size());
    for (size_t i = 0; i < order.size();) {
      size_t j = i;
      while (j < order.size() && order[j].color == order[i].color) ++j;
      if (order[i].color >= 0) {
        for (size_t k = i; k < j; ++k) {
          places[static_cast<size_t>(order[k].rank)] = {static_cast<int>(k - i), static_cast<int>(j - i)};
        }
      }
      i = j;
    }
    std::ostringstream out;
    for (const SplitPlace &p : places) out << p.rank << " " << p.size << " ";
    answer = out.str();
  }
  parent.broadcastFromRoot(answer);
  std::istringstream in(answer);
  SplitPlace mine;
  for (int r = 0; r <= parent.rank(); ++r) {
    if (!(in >> mine.rank >> mine.size)) HORA_THROW(HORA_ERR_INTERNAL, "splitting a group: a short answer");
  }
  return mine;
}

}  // namespace hora
