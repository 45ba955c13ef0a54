#pragma once
// Pairwise summation over a fixed binary tree of `count` leaves (Higham 1993): node (l, i) is the
// sum of leaves [i 2^l, min((i + 1) 2^l, count)), which is node (l - 1, 2i) + node (l - 1, 2i + 1),
// left operand first, or node (l - 1, 2i) alone where the right half is empty. The root's bits
// depend on the leaves' values alone. It is the tree of the draws driver's sums over groups
// (engine/draws.hpp), for a model that adds a whole subtree of groups at once.
#include <bit>
#include <cstdint>

namespace caviar {

// The root over leaf(0), ..., leaf(count - 1), computed as they come with a stack of one waiting
// node per level (a binary counter); add(left, right) returns left + right. T{} when count < 1.
template <class T, class Leaf, class Add>
T tree_sum(std::int64_t count, Leaf&& leaf, Add&& add) {
  if (count < 1) return T{};
  T stack[64];
  for (std::int64_t t = 0; t < count; ++t) {
    T v = leaf(t);
    int l = 0;
    for (; (t >> l) & 1; ++l) v = add(stack[l], v);
    stack[l] = v;
  }
  // What waits: one node per set bit of count, each the left part of the next higher one's
  // right half, so they join from the lowest up.
  const auto bits = static_cast<std::uint64_t>(count);
  int l = std::countr_zero(bits);
  T root = stack[l];
  for (++l; l < 64; ++l)
    if ((bits >> l) & 1) root = add(stack[l], root);
  return root;
}

}  // namespace caviar
