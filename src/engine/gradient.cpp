#include "engine/gradient.hpp"

#include <bit>
#include <limits>

namespace caviar::engine::detail {

namespace {
constexpr std::int64_t kParamChunk = 1 << 15;  // parameters per task in the element-wise loops
}

GradientBuffers::GradientBuffers(const Comm& comm, std::int64_t n_params, const GradientSchedule& s)
    : np(n_params),
      // Micro-blocks of m rows: their number and layout depend on the batch size only.
      m_rows((s.batch_size + s.micro_blocks - 1) / s.micro_blocks),
      max_blocks((s.batch_size + m_rows - 1) / m_rows),
      max_local((max_blocks + comm.size() - 1) / comm.size()) {
  // np is a multiple of the model's alignment, so every slot is aligned like the parameters.
  grads.resize(static_cast<std::size_t>(max_local * np));
  g.resize(static_cast<std::size_t>(np));
  gg.resize(static_cast<std::size_t>(np));
  block_f.resize(static_cast<std::size_t>(max_local));
  block_max.resize(static_cast<std::size_t>(max_local));
  iacc.resize(static_cast<std::size_t>(np + max_blocks));
  if (!s.exact) dacc.resize(static_cast<std::size_t>(np + max_blocks));
}

StepBlocks step_blocks(const Comm& comm, std::int64_t n, std::int64_t batch, std::int64_t m_rows,
                       std::int64_t st) {
  StepBlocks s;
  s.b0 = st * batch;
  s.bn = std::min(batch, n - s.b0);
  s.n_blocks = (s.bn + m_rows - 1) / m_rows;
  s.lb0 = s.n_blocks * comm.rank() / comm.size();
  s.lb1 = s.n_blocks * (comm.rank() + 1) / comm.size();
  return s;
}

namespace {
// The exact sum: fixed point for the gradients, the bits of each block's objective.
void reduce_exact(const Comm& comm, GradientBuffers& b, const StepBlocks& s, int e) {
  const std::int64_t np = b.np, n_local = s.lb1 - s.lb0;
  std::fill(b.iacc.begin() + np, b.iacc.end(), 0);
  parallel_blocks(np, kParamChunk, max_threads(), [&](int, std::int64_t pb, std::int64_t pe) {
    std::fill(b.iacc.begin() + pb, b.iacc.begin() + pe, 0);
    for (std::int64_t lb = 0; lb < n_local; ++lb)
      add_fixed_point(b.grads.data() + lb * np + pb, pe - pb, e, b.iacc.data() + pb);
  });
  // Each block's objective travels as the bits of its double: only its owner adds non-zero
  // bits, so the integer sum reproduces them exactly.
  for (std::int64_t lb = 0; lb < n_local; ++lb)
    b.iacc[np + s.lb0 + lb] = std::bit_cast<std::int64_t>(b.block_f[lb]);
  comm.allreduce_sum(std::span<std::int64_t>(b.iacc.data(), np + s.n_blocks));
}

// For measuring the cost of the exact reduction only: a plain double sum, whose rounding
// depends on how blocks are grouped by rank.
void reduce_fast(const Comm& comm, GradientBuffers& b, const StepBlocks& s) {
  const std::int64_t np = b.np, n_local = s.lb1 - s.lb0;
  std::fill(b.dacc.begin(), b.dacc.end(), 0.0);
  parallel_blocks(np, kParamChunk, max_threads(), [&](int, std::int64_t pb, std::int64_t pe) {
    for (std::int64_t lb = 0; lb < n_local; ++lb) {
      const float* gb = b.grads.data() + lb * np;
      for (std::int64_t i = pb; i < pe; ++i) b.dacc[i] += gb[i];
    }
  });
  for (std::int64_t lb = 0; lb < n_local; ++lb) b.dacc[np + s.lb0 + lb] = b.block_f[lb];
  comm.allreduce_sum(std::span<double>(b.dacc.data(), np + s.n_blocks));
}
}  // namespace

double reduce_blocks(const Comm& comm, GradientBuffers& b, const StepBlocks& s, bool exact,
                     int epoch, std::int64_t st) {
  double f = 0;
  if (!exact) {
    reduce_fast(comm, b, s);
    for (std::int64_t k = 0; k < s.n_blocks; ++k) f += b.dacc[b.np + k];
    return f;
  }
  double local_max = 0;
  for (std::int64_t lb = 0; lb < s.lb1 - s.lb0; ++lb)  // NaN as +inf: MPI's max may drop a NaN
    local_max =
        std::max(local_max, std::isnan(b.block_max[lb]) ? std::numeric_limits<double>::infinity()
                                                        : b.block_max[lb]);
  // A non-finite gradient anywhere has no fixed-point grid (and its clamped values would overflow
  // the integer sum); every rank sees the same maximum and stops here.
  const double global_max = comm.allreduce_max(local_max);
  if (!std::isfinite(global_max))
    throw Error("training diverged at epoch " + std::to_string(epoch) + ", step " +
                std::to_string(st + 1) + " (non-finite gradient); try a smaller --lr");
  b.exponent = fixed_point_exponent(global_max, s.n_blocks);
  reduce_exact(comm, b, s, b.exponent);
  for (std::int64_t k = 0; k < s.n_blocks; ++k) f += std::bit_cast<double>(b.iacc[b.np + k]);
  return f;
}

void apply_step(Optimizer& opt, GradientBuffers& b, const StepBlocks& s, bool exact, float* params,
                double global_scale) {
  // The loss is the mean of -f over the minibatch; the conversion back from the reduced sums and
  // the optimiser's step share one pass over memory.
  const auto bn = static_cast<double>(s.bn);
  opt.begin_step();
  parallel_blocks(b.np, kParamChunk, max_threads(), [&](int, std::int64_t pb, std::int64_t pe) {
    if (exact) {
      from_fixed_point(b.iacc.data() + pb, pe - pb, b.exponent, bn, b.g.data() + pb);
    } else {
      for (std::int64_t i = pb; i < pe; ++i) b.g[i] = static_cast<float>(b.dacc[i] / bn);
    }
    if (global_scale != 0)
      for (std::int64_t i = pb; i < pe; ++i) b.g[i] += static_cast<float>(b.gg[i] * global_scale);
    opt.update(params, b.g.data(), pb, pe);
  });
}

void EpochPosition::save(StateWriter& w) const {
  w.attr("step_in_epoch", step);
  w.attr("epoch_sum", sum);
}

void EpochPosition::load(const StateReader& r, std::int64_t steps) {
  step = r.attr_int("step_in_epoch", 0, steps - 1, "the checkpoint's step inside its epoch");
  sum = r.attr_double("epoch_sum");
}

}  // namespace caviar::engine::detail
