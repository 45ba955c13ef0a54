#include "models/gmm/sample.hpp"

namespace caviar::gmm {

void draw_rows(const Mixture& m, const CounterRng& rng, std::uint32_t step0, std::int64_t row_begin,
               RowMatrix& x, std::vector<std::int64_t>& z) {
  const int k = static_cast<int>(m.weights.size());
  const auto d = static_cast<int>(m.means.cols());
  z.resize(static_cast<std::size_t>(x.rows()));
  Eigen::VectorXd eps(d);
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    const auto n = static_cast<std::uint64_t>(row_begin + i);
    double u = rng.uniform2(n, step0)[0], cum = 0;
    int c = k - 1;  // round-off in the cumulative sum falls to the last component
    for (int j = 0; j < k; ++j) {
      cum += m.weights[j];
      if (u < cum) {
        c = j;
        break;
      }
    }
    for (int j = 0; j < d; ++j)
      eps[j] = rng.normal2(n, step0 + 1 + static_cast<std::uint32_t>(j / 2))[j % 2];
    x.row(i) = m.means.row(c) + (m.chol[static_cast<std::size_t>(c)] * eps).transpose();
    z[static_cast<std::size_t>(i)] = c;
  }
}

}  // namespace caviar::gmm
