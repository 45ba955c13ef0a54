// The Gibbs chains of gmm sample --data (sample_chain): moved out of gmm_driver.cpp, which keeps
// the variational and EM fits.
#include <cmath>
#include <optional>
#include <span>

#include "core/error.hpp"
#include "engine/checkpoint.hpp"
#include "engine/model_file.hpp"
#include "engine/reduce.hpp"
#include "engine/sampler.hpp"
#include "inference/gmm_checkpoint.hpp"
#include "inference/gmm_driver.hpp"
#include "inference/gmm_driver_internal.hpp"
#include "inference/shard.hpp"
#include "io/h5.hpp"
#include "models/gmm_gibbs/blocked.hpp"
#include "models/gmm_gibbs/collapsed.hpp"

namespace caviar::gmm {

using namespace driver;

namespace {

// What a resumed chain must share with the one that wrote the checkpoint: everything that
// changes a draw or what is recorded (--sweeps may grow, to extend a chain).
ckpt::Fingerprint chain_fingerprint(const Comm& comm, const ChainOptions& c, const io::DataRef& ref,
                                    const io::MatrixShape& shape, const Model& model,
                                    const std::string& init) {
  const FitOptions& o = c.fit;
  ckpt::Fingerprint fp("gmm-gibbs");
  fp.add("sampler", c.sampler, "--sampler");
  fp.add("covariance", to_string(o.covariance), "--covariance");
  add_mixture_keys(fp, comm, o, ref, shape, model, init);
  fp.add("burn_in", static_cast<std::int64_t>(c.burn_in), "--burn-in");
  fp.add("thin", static_cast<std::int64_t>(c.thin), "--thin");
  fp.add("heldout", std::string(o.heldout.empty() ? "no" : "yes"), "--heldout");
  if (c.sampler == "collapsed") fp.add("block_rows", c.block_rows.value_or(256), "--block-rows");
  return fp;
}

void check_chain_options(const ChainOptions& c) {
  if (c.sampler != "blocked" && c.sampler != "collapsed")
    throw Error("unknown sampler '" + c.sampler + "' (expected blocked or collapsed)");
  const FitOptions& o = c.fit;
  if (c.sampler == "blocked" && c.block_rows)
    throw Error("--block-rows is an option of --sampler collapsed");
  if (c.block_rows && *c.block_rows < 1)
    throw Error("--block-rows must be >= 1 (got " + std::to_string(*c.block_rows) + ")");
  if (c.sampler == "collapsed" && o.covariance != Covariance::kFull)
    throw Error("--sampler collapsed needs --covariance full");
  if (o.components < 1)
    throw Error("--components must be >= 1 (got " + std::to_string(o.components) + ")");
  if (c.sweeps < 1) throw Error("--sweeps must be >= 1 (got " + std::to_string(c.sweeps) + ")");
  if (c.thin < 1) throw Error("--thin must be >= 1 (got " + std::to_string(c.thin) + ")");
  if (c.burn_in < 0 || c.burn_in >= c.sweeps)
    throw Error("--burn-in must be in [0, --sweeps) (got " + std::to_string(c.burn_in) +
                " with --sweeps " + std::to_string(c.sweeps) + ")");
  if (o.weights != WeightPrior::kDirichlet)
    throw Error("the Gibbs samplers need Dirichlet weights");
  if (!o.out.empty() && o.out == o.labels) throw Error("--out and --labels name the same file");
  if (!o.checkpoint.empty() && (o.checkpoint == o.labels || o.checkpoint == o.out))
    throw Error("--checkpoint names the same file as --out or --labels");
  if (!o.resume.empty() && (o.resume == o.out || o.resume == o.labels))
    throw Error("--resume names the same file as --out or --labels");
}

// Collective: the average log predictive density of the held-out rows under the sampler's
// current parameters (blocked) or statistics (collapsed), summed exactly (the same bits at any rank
// count).
template <class Sampler>
double chain_heldout(const Comm& comm, const Sampler& s, const Shard& ho) {
  std::vector<double> t(static_cast<std::size_t>(ho.x.rows()));
  comm.agree([&] { s.log_density(ho.x, t); });
  const double v = engine::exact_sum(comm, t) / static_cast<double>(ho.shape.rows);
  if (!std::isfinite(v)) throw Error("the held-out density is not finite");
  return v;
}

// The chain's prior, under the names of gmm fit's model file (prior/): what gmm summarize needs to
// turn a collapsed chain's statistics into posterior means.
void save_prior(engine::StateWriter& w, const Prior& pr) {
  const auto d = static_cast<std::uint64_t>(pr.m0.size());
  w.array("prior/alpha0", std::span(&pr.alpha0, 1), {});
  w.array("prior/beta0", std::span(&pr.beta0, 1), {});
  w.array("prior/nu0", std::span(&pr.nu0, 1), {});
  w.array("prior/m0", std::span(pr.m0.data(), d), {d});
  const engine::Dims dims = pr.W0_inv.cols() == 1 ? engine::Dims{d} : engine::Dims{d, d};
  w.array("prior/W0_inv", std::span(pr.W0_inv.data(), pr.W0_inv.size()), dims);
}

}  // namespace

// Collective: a collapsed chain's blocks of --block-rows rows must each lie on one rank. Ranks
// hold whole 256-row blocks (core/partition.hpp), so a divisor of 256 always fits.
void check_block_rows(const Comm& comm, std::int64_t n, std::int64_t block_rows) {
  for (int r = 1; r < comm.size(); ++r) {
    const RowRange range = partition_rows(n, comm.size(), r);
    if (range.size() > 0 && range.begin % block_rows != 0)
      throw Error("--block-rows " + std::to_string(block_rows) + " would split a block between " +
                  "ranks at " + std::to_string(comm.size()) +
                  " ranks (ranks hold whole 256-row blocks); use a divisor of 256 or fewer ranks");
  }
}

// Runs the chain of `sampler` (which holds its start, unless resuming) and writes its outputs.
template <class Sampler>
ChainResult run_chain(const Comm& comm, const ChainOptions& c, Sampler& sampler,
                      engine::SamplerRun run, const std::optional<Shard>& ho,
                      const std::string& init, const RowRange& range, const Prior& prior) {
  const FitOptions& o = c.fit;
  const std::vector<engine::DrawPart> layout = sampler.layout();
  if (ho) run.heldout = [&] { return chain_heldout(comm, sampler, *ho); };
  for (const engine::DrawPart& p : layout) {
    std::size_t m = 1;
    for (auto v : p.dims) m *= v;
    run.draw_width += m;
  }
  const engine::Chain chain = engine::run_sampler(sampler, run);

  if (!o.out.empty()) {
    engine::Provenance pv{"gmm",  "gibbs-" + c.sampler, o.data,   o.command, o.version,
                          o.seed, "log_joint",          "heldout"};
    engine::write_model_file(
        comm, o.out,
        [&](engine::StateWriter& w) {
          engine::save_chain_outputs(w, chain, layout, run.count_width);
          save_prior(w, prior);
          w.attr("covariance_type", to_string(o.covariance));
          w.attr("sampler", c.sampler);
          w.attr("init", init);
          w.attr("sweeps", static_cast<std::int64_t>(chain.run.iterations));
          w.attr("burn_in", static_cast<std::int64_t>(c.burn_in));
          w.attr("thin", static_cast<std::int64_t>(c.thin));
          w.attr("n_draws", chain.n_draws);
          if (c.sampler == "collapsed") {
            w.attr("block_rows", c.block_rows.value_or(256));
            w.attr("log_joint", std::string("collapsed log p(X, z)"));
          }
        },
        chain.run, pv);
  }
  if (!o.labels.empty()) {
    const auto& held = sampler.labels();  // a reference, or a vector kept alive by it
    const std::vector<std::int64_t> labels(held.begin(), held.end());
    io::ParallelRowWriter w(comm, o.labels);
    w.write_rows("labels", run.global_rows, range, labels.data(), {});
    w.commit();
  }
  ChainResult r;
  r.sweeps = chain.run.iterations;
  r.draws = chain.n_draws;
  if (!chain.run.trace.objective.empty()) r.log_joint = chain.run.trace.objective.back();
  if (!chain.run.trace.heldout.empty()) r.heldout = chain.run.trace.heldout.back();
  r.seconds = chain.run.seconds;
  r.n = run.global_rows;
  return r;
}

ChainResult sample_chain(const Comm& comm, const ChainOptions& c,
                         const engine::Progress& progress) {
  check_chain_options(c);
  const FitOptions& o = c.fit;
  const io::DataRef ref = io::DataRef::parse(o.data);
  const std::string init = resolve_init(o);
  const std::vector<std::string> inputs = checked_inputs(comm, o, ref, init);
  engine::Checkpointer ck(comm, {o.checkpoint, o.checkpoint_every, o.resume}, inputs, o.out);

  const Source src(comm, ref, false, 0);
  const std::int64_t n = src.shape().rows;
  const int d = static_cast<int>(src.shape().cols);
  if (o.components > n)
    throw Error("--components " + std::to_string(o.components) + " exceeds the number of rows (" +
                std::to_string(n) + ") in " + ref.str());
  std::optional<Shard> ho;
  if (!o.heldout.empty()) {
    ho = load_shard(comm, io::DataRef::parse(o.heldout));
    if (ho->shape.cols != d)
      throw Error("--heldout " + ho->ref.str() + " has " + std::to_string(ho->shape.cols) +
                  " features but --data has " + std::to_string(d));
  }
  const Moments mom = data_moments(comm, src, o.prior_scale == "data");
  Model model(o.covariance, o.components, make_prior(o, d, mom), mom.mean);
  ck.open(o.checkpoint.empty() && o.resume.empty()
              ? ckpt::Fingerprint("gmm-gibbs")
              : chain_fingerprint(comm, c, ref, src.shape(), model, init));
  // A resumed chain continues to --sweeps. Its labels are the last sweep's local state, which a
  // checkpoint does not hold, so a chain that is already finished cannot give them.
  if (ck.iteration() > c.sweeps)
    throw Error("--resume " + o.resume + " holds " + std::to_string(ck.iteration()) +
                " sweeps, more than --sweeps " + std::to_string(c.sweeps));
  if (ck.iteration() == c.sweeps && ck.resuming() && !o.labels.empty())
    throw Error("--resume " + o.resume + " holds all " + std::to_string(c.sweeps) +
                " sweeps but not the labels of the last one; give a larger --sweeps, or leave "
                "out --labels");
  gmm_gibbs::BlockedSampler blocked(model, src.rows(), src.range().begin, n,
                                    model.exact_exponents(static_cast<double>(n), mom.max_abs),
                                    o.seed);
  // The start, theta_0: the parameters' conditional (sweep 0's draw) given the initial labels or
  // responsibilities (a resumed chain loads its own).
  if (!ck.resuming()) {
    FitOptions exact = o;
    exact.fast_reduce = false;
    const Stats start = initial_stats(comm, exact, init, src, model, mom);
    comm.agree([&] { blocked.draw(0, start); });
  }
  engine::SamplerRun run;
  run.comm = &comm;
  run.rule = {c.sweeps, c.burn_in, c.thin};
  run.checkpoint = &ck;
  run.progress = progress;
  run.count_width = static_cast<std::size_t>(o.components);
  run.rows = src.range();
  run.global_rows = n;
  if (c.sampler == "blocked")
    return run_chain(comm, c, blocked, run, ho, init, src.range(), model.prior());

  // Collapsed: its start z_0 is the blocked sampler's labels given theta_0 (sweep 0's draw).
  const std::int64_t block_rows = c.block_rows.value_or(256);
  check_block_rows(comm, n, block_rows);
  gmm_gibbs::CollapsedSampler collapsed(model, src.rows(), src.range().begin, n,
                                        model.exact_exponents(static_cast<double>(n), mom.max_abs),
                                        o.seed, block_rows);
  if (!ck.resuming()) {
    auto st = blocked.make_stats();
    st.set_zero();
    std::vector<double> terms(static_cast<std::size_t>(src.rows().rows()));
    comm.agree([&] { blocked.local_step(0, st, terms); });
    engine::reduce(st, engine::Reducer(comm));
    comm.agree([&] { collapsed.start(blocked.labels(), st.s); });
  }
  return run_chain(comm, c, collapsed, run, ho, init, src.range(), model.prior());
}

}  // namespace caviar::gmm
