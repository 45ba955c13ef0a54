#include "inference/gmm_summarize.hpp"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/error.hpp"
#include "core/scripts.hpp"
#include "engine/model_file.hpp"
#include "io/h5.hpp"

namespace caviar::gmm {
namespace {

using gmm_gibbs::Mixture;
using gmm_gibbs::MixtureDraws;

// What summarize reads of a chain file besides its draws.
struct ChainFile {
  std::string sampler, algorithm, data;
  std::int64_t seed = 0, burn_in = 0;
  MixtureDraws draws;
  std::vector<double> log_joint, counts;  // per sweep; counts: sweeps x K (the chain's labels)
};

// Refuses a dataset of `file` whose shape is not `want` (0: any extent), or that holds a value
// that is not finite (the matching and the moments would silently turn NaN).
void check_dataset(const std::string& file, const std::string& name, const io::Dims& dims,
                   const io::Dims& want, const std::vector<double>& v) {
  bool ok = dims.size() == want.size();
  for (std::size_t i = 0; ok && i < dims.size(); ++i) ok = want[i] == 0 || dims[i] == want[i];
  if (!ok) {
    std::string got;
    for (auto x : dims) got += (got.empty() ? "" : " x ") + std::to_string(x);
    throw Error("'" + file + "': '" + name + "' has shape (" + got + "), not the expected one");
  }
  for (double x : v)
    if (!std::isfinite(x)) throw Error("'" + file + "': '" + name + "' holds a non-finite value");
}

// The dataset `name` of `file`, which must have the shape `want` (0: any extent).
std::vector<double> read_shaped(const io::FileReader& r, const std::string& file,
                                const std::string& name, const io::Dims& want) {
  if (!r.has(name)) throw Error("'" + file + "' has no dataset '" + name + "'");
  io::Dims dims;
  std::vector<double> v = r.read(name, &dims);
  check_dataset(file, name, dims, want, v);
  return v;
}

// Covariances stored as K x D x D (full) or K x D (diagonal, as gmm fit and gmm sample write
// them), after `lead` leading extents (e.g. the draws): always returned as full matrices.
std::vector<double> read_covariances(const io::FileReader& r, const std::string& file,
                                     const std::string& name, io::Dims lead, std::uint64_t d) {
  if (!r.has(name)) throw Error("'" + file + "' has no dataset '" + name + "'");
  io::Dims dims;
  std::vector<double> v = r.read(name, &dims);
  io::Dims want = lead;
  want.push_back(d);
  if (dims.size() == want.size() + 1) want.push_back(d);
  check_dataset(file, name, dims, want, v);
  if (want.size() == lead.size() + 2) return v;  // full already
  std::vector<double> full(v.size() * d, 0.0);
  for (std::size_t i = 0; i < v.size(); ++i) full[i * d + i % d] = v[i];
  return full;
}

void read_blocked_draws(const io::FileReader& r, const std::string& file, MixtureDraws& m) {
  const auto n = static_cast<std::uint64_t>(m.n);
  m.weights = read_shaped(r, file, "draws/weights", {n, 0});
  m.k = static_cast<int>(m.weights.size() / n);
  if (m.k < 1) throw Error("'" + file + "' holds draws of no component");
  const auto k = static_cast<std::uint64_t>(m.k);
  m.means = read_shaped(r, file, "draws/means", {n, k, 0});
  m.d = static_cast<int>(m.means.size() / (n * k));
  m.covariances =
      read_covariances(r, file, "draws/covariances", {n, k}, static_cast<std::uint64_t>(m.d));
}

// The collapsed chain's statistics as posterior means under the chain's own prior.
void read_collapsed_draws(const io::FileReader& r, const std::string& file, MixtureDraws& m) {
  const auto n = static_cast<std::uint64_t>(m.n);
  const std::vector<double> counts = read_shaped(r, file, "draws/counts", {n, 0});
  const int k = static_cast<int>(counts.size() / n);
  if (k < 1) throw Error("'" + file + "' holds draws of no component");
  const std::vector<double> sums =
      read_shaped(r, file, "draws/sums", {n, static_cast<std::uint64_t>(k), 0});
  const int d = static_cast<int>(sums.size() / (n * static_cast<std::uint64_t>(k)));
  if (!r.has("prior/alpha0"))
    throw Error("'" + file +
                "' records no prior (prior/): written by an older caviar; rerun "
                "gmm sample to summarise a collapsed chain");
  const double alpha0 = read_shaped(r, file, "prior/alpha0", {})[0];
  const double beta0 = read_shaped(r, file, "prior/beta0", {})[0];
  const std::vector<double> m0 = read_shaped(r, file, "prior/m0", {static_cast<std::uint64_t>(d)});
  m = gmm_gibbs::collapsed_posterior_means(m.n, k, d, counts, sums, alpha0, beta0, m0);
}

ChainFile read_chain(const std::string& file) {
  const io::FileReader r(file);  // names a missing file or one that is not HDF5
  const std::string what = "the --out file of caviar gmm sample --data";
  if (r.has_attr("checkpoint"))
    throw Error("'" + file + "' is a checkpoint, not a Gibbs chain (give " + what + ")");
  if (!r.has_attr("model") || r.read_string_attr("model") != "gmm" || !r.has_attr("sampler"))
    throw Error("'" + file + "' is not a gmm Gibbs chain (give " + what + ")");
  ChainFile c;
  c.sampler = r.read_string_attr("sampler");
  if (c.sampler != "blocked" && c.sampler != "collapsed")
    throw Error("'" + file + "' has an unknown sampler '" + c.sampler + "'");
  c.algorithm = r.read_string_attr("algorithm");
  c.data = r.has_attr("data") ? r.read_string_attr("data") : "";
  c.seed = static_cast<std::int64_t>(r.read_double_attr("seed"));
  c.burn_in = static_cast<std::int64_t>(r.read_double_attr("burn_in"));
  c.draws.n = static_cast<std::int64_t>(r.read_double_attr("n_draws"));
  if (c.draws.n < 1)
    throw Error("'" + file + "' holds no draws (n_draws = " + std::to_string(c.draws.n) +
                "): run the chain past --burn-in");
  if (c.sampler == "blocked")
    read_blocked_draws(r, file, c.draws);
  else
    read_collapsed_draws(r, file, c.draws);
  if (c.draws.d < 1) throw Error("'" + file + "' holds draws of no dimension");
  c.log_joint = read_shaped(r, file, "trace/log_joint", {0});
  c.counts = read_shaped(r, file, "trace/counts",
                         {c.log_joint.size(), static_cast<std::uint64_t>(c.draws.k)});
  return c;
}

Mixture read_reference(const std::string& file) {
  const io::FileReader r(file);
  const std::string what = "the --out file of caviar gmm fit";
  if (r.has_attr("checkpoint"))
    throw Error("'" + file + "' is a checkpoint, not a fitted gmm model (give " + what + ")");
  engine::require_model_kind(r, file, "gmm");
  if (r.has_attr("sampler"))
    throw Error("'" + file + "' is a Gibbs chain, not a fitted gmm model (give " + what + ")");
  Mixture m;
  m.weights = read_shaped(r, file, "weights", {0});
  m.k = static_cast<int>(m.weights.size());
  if (m.k < 1) throw Error("'" + file + "' holds a mixture of no component");
  m.means = read_shaped(r, file, "means", {static_cast<std::uint64_t>(m.k), 0});
  m.d = static_cast<int>(m.means.size()) / m.k;
  if (m.d < 1) throw Error("'" + file + "' holds a mixture of no dimension");
  m.covariances = read_covariances(r, file, "covariances", {static_cast<std::uint64_t>(m.k)},
                                   static_cast<std::uint64_t>(m.d));
  return m;
}

io::Dims shape(std::initializer_list<std::int64_t> v) {
  io::Dims d;
  for (std::int64_t x : v) d.push_back(static_cast<std::uint64_t>(x));
  return d;
}

void write_moments(io::FileWriter& w, const std::string& group, const gmm_gibbs::Moments& m,
                   const io::Dims& dims) {
  w.write(group + "/mean", m.mean, dims);
  w.write(group + "/sd", m.sd, dims);
}

// Rank 0: the summary file's datasets and attributes (not yet committed).
void write_summary(io::FileWriter& w, const Comm& comm, const SummarizeOptions& o,
                   const ChainFile& c, const SummarizeResult& r) {
  const gmm_gibbs::ChainSummary& s = r.summary;
  const int k = r.reference.k, d = r.reference.d;
  write_moments(w, "weights", s.weights, shape({k}));
  write_moments(w, "means", s.means, shape({k, d}));
  if (!s.covariances.mean.empty()) write_moments(w, "covariances", s.covariances, shape({k, d, d}));
  w.write("reference/weights", r.reference.weights, shape({k}));
  w.write("reference/means", r.reference.means, shape({k, d}));
  w.write("reference/covariances", r.reference.covariances, shape({k, d, d}));
  w.write("matching", s.matching, shape({c.draws.n, k}));
  w.attr("model", std::string("gmm-summary"));
  w.attr("algorithm", c.algorithm);
  w.attr("sampler", c.sampler);
  w.attr("n_draws", c.draws.n);
  w.attr("chain", o.chain);
  w.attr("reference", o.reference);
  w.attr("max_abs_diff_weight", s.max_diff_weight);
  w.attr("max_abs_diff_mean", s.max_diff_mean);
  if (!s.covariances.mean.empty()) w.attr("max_abs_diff_covariance", s.max_diff_covariance);
  engine::write_run_attrs(
      w, comm, {"", "", c.data, o.command, o.version, static_cast<std::uint64_t>(c.seed)});
}

// The table for scripts/plot_gibbs_summary.py: the traces, and in 2-D the relabelled draws and
// the reference.
std::string plot_table(const ChainFile& c, const SummarizeResult& r) {
  nlohmann::ordered_json j;
  j["sampler"] = c.sampler;
  j["k"] = r.reference.k;
  j["d"] = r.reference.d;
  j["burn_in"] = c.burn_in;
  j["log_joint"] = c.log_joint;
  j["counts"] = c.counts;
  if (r.reference.d == 2) {
    const MixtureDraws& m = r.summary.relabelled;
    j["draws"] = {{"means", m.means}, {"covariances", m.covariances}};
    j["reference"] = {{"weights", r.reference.weights},
                      {"means", r.reference.means},
                      {"covariances", r.reference.covariances}};
  }
  return j.dump();
}

}  // namespace

SummarizeResult summarize(const Comm& comm, const SummarizeOptions& o) {
  const std::vector<std::string> inputs{o.chain, o.reference};
  io::check_output_path(comm, o.out, inputs);
  if (!o.plot.empty()) {
    if (o.plot == o.out) throw Error("--plot and --out name the same file");
    io::check_output_path(comm, o.plot, {o.chain, o.reference, o.out});
  }
  SummarizeResult r;
  comm.on_root([&] {
    const ChainFile c = read_chain(o.chain);
    r.reference = read_reference(o.reference);
    if (c.draws.k != r.reference.k || c.draws.d != r.reference.d)
      throw Error("'" + o.chain + "' has K = " + std::to_string(c.draws.k) +
                  " components in D = " + std::to_string(c.draws.d) + " but the reference '" +
                  o.reference + "' has K = " + std::to_string(r.reference.k) +
                  " in D = " + std::to_string(r.reference.d));
    r.sampler = c.sampler;
    r.summary = gmm_gibbs::summarize_chain(c.draws, r.reference);
    io::FileWriter w(o.out);  // removed unless committed: no summary without its PNG
    write_summary(w, comm, o, c, r);
    if (!o.plot.empty()) render_png("plot_gibbs_summary.py", plot_table(c, r), o.plot);
    w.commit();
  });
  return r;
}

std::string format_summary_table(const SummarizeResult& r) {
  const int k_n = r.reference.k, d = r.reference.d;
  const gmm_gibbs::ChainSummary& s = r.summary;
  const auto vec = [](const std::vector<double>& v, std::size_t at, std::size_t n) {
    std::string t = "(";
    char b[32];
    for (std::size_t i = 0; i < n; ++i) {
      std::snprintf(b, sizeof b, "%s%.4f", i ? ", " : "", v[at + i]);
      t += b;
    }
    return t + ")";
  };
  std::string out = "component  weight (chain +- sd / reference)  mean (chain / reference)";
  if (!s.covariances.mean.empty()) out += "  covariance (chain / reference)";
  out += '\n';
  const auto du = static_cast<std::size_t>(d);
  for (int k = 0; k < k_n; ++k) {
    const auto ku = static_cast<std::size_t>(k);
    char line[96];
    std::snprintf(line, sizeof line, "%9d  %.4f +- %.4f / %.4f  ", k + 1, s.weights.mean[ku],
                  s.weights.sd[ku], r.reference.weights[ku]);
    out += line + vec(s.means.mean, ku * du, du) + " / " + vec(r.reference.means, ku * du, du);
    if (!s.covariances.mean.empty())
      out += "  " + vec(s.covariances.mean, ku * du * du, du * du) + " / " +
             vec(r.reference.covariances, ku * du * du, du * du);
    out += '\n';
  }
  return out;
}

}  // namespace caviar::gmm
