#include "prep/generate.hpp"

#include <Eigen/Cholesky>

#include "core/error.hpp"
#include "core/partition.hpp"
#include "core/rng.hpp"
#include "io/h5.hpp"
#include "models/gmm/sample.hpp"

namespace caviar {

using Eigen::MatrixXd;
using Eigen::VectorXd;

MixtureSpec random_mixture(int dim, int k, std::uint64_t seed) {
  const CounterRng rng(seed, Stream::kGenerateParams);
  MixtureSpec s;
  s.weights.resize(k);
  s.means.resize(k, dim);
  // Draw j of component c: counter (c, j), so parameters do not depend on each other's sizes.
  auto normal = [&](int c, std::uint32_t j) { return rng.normal2(c, 1 + j / 2)[j % 2]; };
  for (int c = 0; c < k; ++c) {
    s.weights[c] = 0.5 + rng.uniform2(c, 0)[0];
    std::uint32_t j = 0;
    for (int i = 0; i < dim; ++i) s.means(c, i) = 4.0 * normal(c, j++);
    MatrixXd a(dim, dim);
    for (int i = 0; i < dim; ++i)
      for (int l = 0; l < dim; ++l) a(i, l) = normal(c, j++);
    s.covs.push_back(0.5 * MatrixXd::Identity(dim, dim) + a * a.transpose() / (2.0 * dim));
  }
  s.weights /= s.weights.sum();
  return s;
}

namespace {
MatrixXd mat2(double a, double b, double c) {
  MatrixXd m(2, 2);
  m << a, b, b, c;
  return m;
}
}  // namespace

MixtureSpec seed_three_clusters() {
  MixtureSpec s;
  s.weights = VectorXd::Constant(3, 1.0 / 3);
  s.means.resize(3, 2);
  s.means << -4.0, -2.0, 3.0, -3.0, 0.0, 4.0;
  s.covs = {mat2(1.0, 0.5, 1.0), mat2(1.5, -0.7, 1.0), mat2(2.0, 0.0, 0.5)};
  return s;
}

MixtureSpec seed_two_clusters() {
  MixtureSpec s;
  s.weights.resize(2);
  s.weights << 0.6, 0.4;
  s.means.resize(2, 2);
  s.means << -2.0, 0.0, 3.0, 2.0;
  s.covs = {mat2(1.0, 0.8, 1.0), mat2(1.0, -0.3, 0.6)};
  return s;
}

void write_samples(const Comm& comm, const std::string& file, const std::vector<Sample>& samples,
                   std::uint64_t seed) {
  io::check_output_path(comm, file, {});
  io::ParallelRowWriter w(comm, file);
  std::uint32_t sample_id = 0;
  for (const Sample& smp : samples) {
    const MixtureSpec& s = smp.spec;
    const int k = static_cast<int>(s.weights.size());
    const int d = static_cast<int>(s.means.cols());
    if (smp.n < 1) throw Error("--n must be >= 1");
    if (k < 1 || d < 1) throw Error("--components and --dim must be >= 1");
    gmm::Mixture mix{s.weights, s.means, {}};
    for (const auto& c : s.covs) mix.chol.push_back(c.llt().matrixL());
    // Each sample of a file gets its own counter range (the step's high bits).
    const CounterRng rng(seed, Stream::kGenerateRows);
    const std::uint32_t step0 = sample_id++ << 20;
    const RowRange range = partition_rows(smp.n, comm.size(), comm.rank());
    io::RowMatrix x(range.size(), d);
    std::vector<std::int64_t> z;
    gmm::draw_rows(mix, rng, step0, range.begin, x, z);
    const auto slash = smp.path.rfind('/');
    const std::string parent = smp.path.substr(0, slash == std::string::npos ? 0 : slash);
    const auto ud = static_cast<std::uint64_t>(d);
    w.write_rows(smp.path, smp.n, range, x.data(), {ud});
    w.write_rows(parent + "/labels", smp.n, range, z.data(), {});
    // Parameters: rank 0 writes all K rows, the others none.
    const RowRange all = comm.is_root() ? RowRange{0, k} : RowRange{0, 0};
    const io::RowMatrix means = s.means;
    std::vector<double> covs;
    for (const auto& cv : s.covs)
      for (int a = 0; a < d; ++a)
        for (int b = 0; b < d; ++b) covs.push_back(cv(a, b));
    w.write_rows(parent + "/true/weights", k, all, s.weights.data(), {});
    w.write_rows(parent + "/true/means", k, all, means.data(), {ud});
    w.write_rows(parent + "/true/covariances", k, all, covs.data(), {ud, ud});
  }
  w.commit();
}

}  // namespace caviar
