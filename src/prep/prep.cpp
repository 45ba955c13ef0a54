#include "prep/prep.hpp"

#include <Eigen/Eigenvalues>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <span>
#include <vector>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/partition.hpp"
#include "io/h5.hpp"
#include "io/idx.hpp"

namespace caviar {

using Eigen::MatrixXd;
using Eigen::VectorXd;

namespace {

// One split of the dataset as this rank holds it: its rows of the images and labels.
struct Split {
  std::int64_t n = 0;  // images in the whole split
  std::int64_t height = 0, width = 0;
  RowRange range;                    // this rank's rows
  io::RowMatrix x;                   // range.size() x pixels, pixel / 255
  std::vector<std::int64_t> labels;  // range.size()
};

// The files of one split, found in the source directory.
struct SplitFiles {
  std::string images, labels;
};

// NAME.gz as the Debian package ships it, or NAME if someone unpacked it; otherwise the error
// says the dataset is not installed, since that is by far the likeliest cause.
std::string find_file(const std::string& dir, const std::string& name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string hint = " (install the Debian package dataset-fashion-mnist)";
  if (!fs::is_directory(dir, ec)) throw Error("Fashion-MNIST not found in " + dir + hint);
  for (const std::string& candidate : {name + ".gz", name}) {
    const fs::path p = fs::path(dir) / candidate;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  throw Error("Fashion-MNIST not found in " + dir + ": no " + name + ".gz" + hint);
}

// Reads both files of a split (every rank reads them whole: 47 MB at most, and no broadcast of
// bytes is needed), checks them against each other and keeps this rank's rows.
Split load_split(const Comm& comm, const SplitFiles& files) {
  Split s;
  comm.agree([&] {
    const io::IdxArray images = io::read_idx(files.images, 3);
    const io::IdxArray labels = io::read_idx(files.labels, 1);
    if (images.dims[0] != labels.dims[0])
      throw Error("'" + files.images + "' holds " + std::to_string(images.dims[0]) +
                  " images but '" + files.labels + "' holds " + std::to_string(labels.dims[0]) +
                  " labels");
    for (std::size_t i = 0; i < labels.data.size(); ++i)
      if (labels.data[i] > 9)
        throw Error("'" + files.labels + "' has label " + std::to_string(labels.data[i]) +
                    " at index " + std::to_string(i) + "; Fashion-MNIST labels are 0..9");
    s.n = images.dims[0];
    s.height = images.dims[1];
    s.width = images.dims[2];
    s.range = partition_rows(s.n, comm.size(), comm.rank());
    const std::int64_t pixels = s.height * s.width;
    s.x.resize(s.range.size(), pixels);
    s.labels.resize(static_cast<std::size_t>(s.range.size()));
    for (std::int64_t i = 0; i < s.range.size(); ++i) {
      const auto row = static_cast<std::size_t>(s.range.begin + i);
      const std::uint8_t* src = images.data.data() + row * static_cast<std::size_t>(pixels);
      for (std::int64_t j = 0; j < pixels; ++j) s.x(i, j) = src[j] / 255.0;
      s.labels[static_cast<std::size_t>(i)] = labels.data[row];
    }
  });
  return s;
}

struct Pca {
  VectorXd mean;             // pixels
  io::RowMatrix components;  // D x pixels
  VectorXd variance;         // D, decreasing
  double total_variance = 0;
};

// PCA of the rows spread over the ranks: the mean (one allreduce), then the scatter matrix about
// it (one allreduce of pixels x pixels doubles; two passes are more accurate than E[xx^T] - mm^T
// for pixels that barely vary), then the same eigendecomposition on every rank. An allreduce
// returns the same bits on every rank, so every rank gets the same components.
Pca fit_pca(const Comm& comm, const io::RowMatrix& x, std::int64_t n, int d) {
  const Eigen::Index p = x.cols();
  Pca pca;
  pca.mean = x.colwise().sum().transpose();
  comm.allreduce_sum(std::span<double>(pca.mean.data(), static_cast<std::size_t>(p)));
  pca.mean /= static_cast<double>(n);

  // Per-thread lower triangles, summed in thread order: deterministic for a given thread count.
  const int threads = max_threads();
  std::vector<MatrixXd> partial(static_cast<std::size_t>(threads), MatrixXd::Zero(p, p));
  parallel_blocks(x.rows(), kBlockRows, threads, [&](int t, std::int64_t b, std::int64_t e) {
    const MatrixXd centred_t =
        (x.middleRows(b, e - b).rowwise() - pca.mean.transpose()).transpose();
    partial[static_cast<std::size_t>(t)].selfadjointView<Eigen::Lower>().rankUpdate(centred_t);
  });
  MatrixXd scatter = partial[0];
  for (int t = 1; t < threads; ++t) scatter += partial[static_cast<std::size_t>(t)];
  comm.allreduce_sum(std::span<double>(scatter.data(), static_cast<std::size_t>(p * p)));
  scatter /= static_cast<double>(n);

  // Reads the lower triangle only, which is the one filled above.
  const Eigen::SelfAdjointEigenSolver<MatrixXd> eig(scatter);
  if (eig.info() != Eigen::Success) throw Error("PCA: the eigendecomposition did not converge");
  pca.total_variance = eig.eigenvalues().sum();
  pca.components.resize(d, p);
  pca.variance.resize(d);
  for (int k = 0; k < d; ++k) {
    // Eigen sorts eigenvalues in increasing order.
    const Eigen::Index src = p - 1 - k;
    VectorXd v = eig.eigenvectors().col(src);
    // An eigenvector's sign is arbitrary: make the largest-magnitude entry (the first, among
    // equals) positive, so that files are comparable across runs and rank counts.
    Eigen::Index arg = 0;
    for (Eigen::Index j = 1; j < p; ++j)
      if (std::abs(v[j]) > std::abs(v[arg])) arg = j;
    if (v[arg] < 0) v = -v;
    pca.components.row(k) = v.transpose();
    pca.variance[k] = eig.eigenvalues()[src];
  }
  return pca;
}

io::RowMatrix project(const Pca& pca, const io::RowMatrix& x) {
  return (x.rowwise() - pca.mean.transpose()) * pca.components.transpose();
}

std::string dims_str(const Split& s) {
  return std::to_string(s.height) + "x" + std::to_string(s.width);
}

}  // namespace

PrepResult prep_fashion_mnist(const Comm& comm, const PrepOptions& opt,
                              const PrepProgress& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  if (opt.out.empty()) throw Error("--out is required");
  if (opt.pca < 0) throw Error("--pca must be >= 1");

  SplitFiles train_files, test_files;
  comm.agree([&] {
    train_files = {find_file(opt.source, "train-images-idx3-ubyte"),
                   find_file(opt.source, "train-labels-idx1-ubyte")};
    test_files = {find_file(opt.source, "t10k-images-idx3-ubyte"),
                  find_file(opt.source, "t10k-labels-idx1-ubyte")};
  });
  io::check_output_path(
      comm, opt.out,
      {train_files.images, train_files.labels, test_files.images, test_files.labels});

  progress("caviar prep fashion-mnist: reading " + opt.source);
  const Split train = load_split(comm, train_files);
  const Split test = load_split(comm, test_files);
  if (test.height != train.height || test.width != train.width)
    throw Error("'" + test_files.images + "' has images of " + dims_str(test) + " pixels but '" +
                train_files.images + "' has " + dims_str(train));
  const std::int64_t pixels = train.height * train.width;
  if (opt.pca > pixels)
    throw Error("--pca " + std::to_string(opt.pca) + " exceeds the " + std::to_string(pixels) +
                " pixels per image");
  progress("read " + std::to_string(train.n) + " training and " + std::to_string(test.n) +
           " test images of " + dims_str(train) + " pixels");

  PrepResult result;
  result.train = train.n;
  result.test = test.n;
  result.pixels = pixels;
  result.pca = opt.pca;

  io::ParallelRowWriter w(comm, opt.out);
  const auto up = static_cast<std::uint64_t>(pixels);
  // Images on disk as float32 (half the bytes; a pixel k/255 needs no more), computed in double.
  const auto as_float = [](const io::RowMatrix& x) {
    std::vector<float> f(static_cast<std::size_t>(x.size()));
    for (std::size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(x.data()[i]);
    return f;
  };
  w.write_rows("/train/images", train.n, train.range, as_float(train.x).data(), {up});
  w.write_rows("/train/labels", train.n, train.range, train.labels.data(), {});
  w.write_rows("/test/images", test.n, test.range, as_float(test.x).data(), {up});
  w.write_rows("/test/labels", test.n, test.range, test.labels.data(), {});

  if (opt.pca > 0) {
    const Pca pca = fit_pca(comm, train.x, train.n, opt.pca);
    const double explained = pca.variance.sum();
    result.pca_variance_fraction = pca.total_variance > 0 ? explained / pca.total_variance : 0;
    char line[160];
    std::snprintf(line, sizeof line, "PCA: %d components explain %.2f%% of the variance", opt.pca,
                  100 * result.pca_variance_fraction);
    progress(line);
    const auto ud = static_cast<std::uint64_t>(opt.pca);
    // Small parameter arrays: rank 0 writes all rows, the others none.
    const auto all = [&](std::int64_t rows) {
      return comm.is_root() ? RowRange{0, rows} : RowRange{0, 0};
    };
    w.write_rows("/pca/mean", pixels, all(pixels), pca.mean.data(), {});
    w.write_rows("/pca/components", opt.pca, all(opt.pca), pca.components.data(), {up});
    w.write_rows("/pca/explained_variance", opt.pca, all(opt.pca), pca.variance.data(), {});
    const io::RowMatrix train_pca = project(pca, train.x);
    const io::RowMatrix test_pca = project(pca, test.x);
    w.write_rows("/train/pca", train.n, train.range, train_pca.data(), {ud});
    w.write_rows("/test/pca", test.n, test.range, test_pca.data(), {ud});
  }
  w.commit();
  progress("wrote " + opt.out);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace caviar
