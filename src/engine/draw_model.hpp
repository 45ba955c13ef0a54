#pragma once
// What a black-box VI model gives the draws driver (engine/draws.hpp). No MPI and no files, so
// a model includes this header only.
#include <concepts>
#include <cstdint>
#include <span>

#include "engine/optimizer.hpp"
#include "engine/state.hpp"

namespace caviar::engine {

enum class DrawKind { kGradient, kElbo, kDiagnostic };

// What a black-box VI model provides: double parameters lambda, a set of draws per (kind, t),
// and per-draw sums over blocks of its own local rows (indices from 0 at the rank's first row).
// Optional: prepare(rows), called on a thread with the rows of a run of consecutive groups before
// that thread's block() of each of them, so that a model can compute per-row terms for many rows
// at once (groups_pass in engine/draws.hpp uses it if present). A block must not depend on how
// the groups were run together, which depends on the thread count. Optional too:
// block_node(rows, bounds, out), the sum tree's node over 2^l consecutive groups (their values
// added pairwise, as engine/draws.hpp's reduce_draws says), bitwise as block() of each group and
// the tree's additions would give it.
template <class M>
concept DrawModel = requires(M& m, const M& cm, DrawKind k, std::int64_t t,
                             std::span<const std::int64_t> rows, std::span<double> out,
                             std::span<const double> sums, std::span<const std::uint8_t> kept,
                             StateWriter& w, const StateReader& r) {
  { m.params() } -> std::same_as<BasicParams<double>&>;
  m.set_draws(k, t);                                    // before block() of that pass
  { cm.n_draws() } -> std::convertible_to<int>;         // S of the current draws
  { cm.width() } -> std::convertible_to<std::int64_t>;  // W: values per draw per block
  cm.block(rows, out);                                  // out: S x W, written in full
  { cm.gradient(sums, kept, 1.0, out) } -> std::convertible_to<double>;  // -> ELBO estimate
  // After set_draws(kElbo, .), with sums over rows whose log-likelihood counts `scale` times
  // (N / M for M rows drawn from N).
  { cm.elbo(sums, kept, 1.0) } -> std::convertible_to<double>;
  cm.save(w);  // lambda, for checkpoints
  m.load(r);
};

}  // namespace caviar::engine
