#include "inference/lda_checkpoint.hpp"

#include <climits>

#include "core/error.hpp"
#include "core/parallel.hpp"

namespace caviar::lda {

namespace {
ckpt::Every checked_every(const Comm& comm, const FitOptions& o,
                          const std::vector<std::string>& inputs) {
  ckpt::check_paths(comm, o.checkpoint, o.checkpoint_every, inputs);
  if (!o.checkpoint.empty() && !o.out.empty() && o.checkpoint == o.out)
    throw Error("--checkpoint and --out name the same file");
  if (!o.resume.empty() && o.resume == o.out) throw Error("--resume names the same file as --out");
  ckpt::check_resume(comm, o.resume);
  return ckpt::parse_every(o.checkpoint_every);
}

}  // namespace

Checkpointer::Checkpointer(const Comm& comm, const FitOptions& o,
                           const std::vector<std::string>& inputs)
    : comm_(comm), o_(o), poller_(comm, checked_every(comm, o, inputs)) {}

void Checkpointer::open(const io::DataRef& ref, const io::CorpusInfo& info,
                        const std::vector<std::int64_t>* indptr, const io::DataRef* heldout,
                        double alpha, double eta) {
  if (o_.checkpoint.empty() && o_.resume.empty()) return;
  n_docs_ = info.n_docs;
  n_words_ = info.n_words;
  const bool svi = o_.algorithm == "svi";
  ckpt::Fingerprint fp("lda");
  fp.add("algorithm", o_.algorithm, "--algorithm");
  fp.add("topics", static_cast<std::int64_t>(o_.topics), "--topics");
  fp.add("words", info.n_words, "vocabulary size V =");
  ckpt::add_corpus(fp, comm_, "--data", ref, info, indptr);
  if (heldout) {
    io::CorpusInfo hi = io::inspect_corpus(comm_, *heldout);
    ckpt::add_corpus(fp, comm_, "--heldout", *heldout, hi, nullptr);
  } else {
    fp.add("heldout", std::string("none"), "--heldout");
  }
  fp.add("alpha", alpha, "--alpha");
  fp.add("eta", eta, "--eta");
  fp.add("seed", static_cast<std::int64_t>(o_.seed), "--seed");
  fp.add("doc_tol", o_.local.tol, "--doc-tol");
  fp.add("doc_max_iter", static_cast<std::int64_t>(o_.local.max_iter), "--doc-max-iter");
  // --stream SVI draws other minibatches (runs of 256-document blocks); --stream CAVI equals the
  // in-memory fit, but is kept apart too (never tested across).
  fp.add("stream", static_cast<std::int64_t>(o_.stream), "--stream");
  if (svi) {
    fp.add("batch_size", static_cast<std::int64_t>(o_.batch_size), "--batch-size");
    fp.add("tau0", o_.tau0, "--tau0");
    fp.add("kappa", o_.kappa, "--kappa");
  }
  fp_ = std::move(fp);
  if (o_.resume.empty()) return;

  State s;
  comm_.agree([&] {
    const io::FileReader r(o_.resume);
    fp_->check(r, o_.resume);
    const std::string bad = "--resume " + o_.resume + ": ";
    auto num = [&](const char* name) { return r.read_double_attr(name); };
    auto count = [&](const char* name, std::int64_t hi) {
      return ckpt::read_int(r, name, 0, hi, bad);
    };
    s.lambda = r.read("/lambda");
    if (s.lambda.size() != static_cast<std::size_t>(o_.topics * info.n_words))
      throw Error(bad + "its topic-word matrix has the wrong size");
    Position& p = s.pos;
    p.iteration = static_cast<int>(count("iteration", INT_MAX));
    p.step = count("step", info.n_docs);  // minibatches done in the pass
    p.t = count("t", ckpt::kMaxCount);
    p.pass_tokens = num("pass_tokens");
    p.reduced_rows = num("reduced_rows");
    p.reductions = count("reductions", ckpt::kMaxCount);
    s.elapsed = num("elapsed");
    s.res.iterations = static_cast<int>(count("iterations", INT_MAX));
    s.res.sweeps = count("sweeps", ckpt::kMaxCount);
    s.res.tokens = num("tokens");
    s.res.trace = ckpt::read_vec(r, "/trace/elbo");
    s.res.trace_seconds = ckpt::read_vec(r, "/trace/seconds");
    s.res.trace_perplexity = ckpt::read_vec(r, "/trace/perplexity");
    if (p.iteration < 0 || p.step < 0 || p.t < 0 ||
        s.res.trace.size() != static_cast<std::size_t>(p.iteration) ||
        s.res.trace_seconds.size() != s.res.trace.size())
      throw Error(bad + "its position and traces disagree (corrupt checkpoint?)");
    if (svi && p.iteration >= o_.passes)
      throw Error(bad + "it stopped in pass " + std::to_string(p.iteration + 1) +
                  ", beyond this run's --passes " + std::to_string(o_.passes));
    if (svi) {
      s.pass_terms = ckpt::read_vec(r, "/pass_terms");
      if (s.pass_terms.size() > static_cast<std::size_t>(info.n_docs))
        throw Error(bad + "it holds more document terms than the corpus has documents");
    } else if (p.iteration > 0) {
      if (!r.has("/gamma")) throw Error(bad + "it lacks the documents' gammas");
      s.has_gammas = true;
    }
  });
  if (s.has_gammas) {
    // Collective, and the same verdict on every rank (the same file).
    const io::MatrixShape g = io::inspect_matrix(comm_, io::DataRef{o_.resume, "/gamma"});
    if (g.rows != info.n_docs || g.cols != o_.topics)
      throw Error("--resume " + o_.resume + ": its gammas are not documents x topics");
  }
  // The boundary we resume at was the one saved: no need to save it again by count.
  poller_.skip_count_at(svi ? s.pos.t : s.pos.iteration);
  state_ = std::move(s);
}

const Position& Checkpointer::position() const {
  static const Position start;
  return resuming() ? state_->pos : start;
}

void Checkpointer::restore(Model& model, FitResult& res) const {
  if (!resuming()) return;
  model.set_lambda(
      Eigen::Map<const RowMatrix>(state_->lambda.data(), model.n_topics(), model.n_words()));
  const FitResult& c = state_->res;
  res.iterations = c.iterations;
  res.tokens = c.tokens;
  res.trace = c.trace;
  res.trace_seconds = c.trace_seconds;
  res.trace_perplexity = c.trace_perplexity;
  res.sweeps = comm_.is_root() ? c.sweeps : 0;
}

RowMatrix Checkpointer::gammas(std::int64_t begin, std::int64_t end) const {
  if (!resuming() || !state_->has_gammas) return RowMatrix();
  RowMatrix g =
      io::read_rows(comm_, io::DataRef{o_.resume, "/gamma"}, {n_docs_, o_.topics}, {begin, end});
  // The warm start takes digammas and logs of them: gamma = alpha + expected counts > 0. Each rank
  // checks its own documents; the lowest failing rank names the first bad one.
  std::string err;
  for (Eigen::Index d = 0; d < g.rows() && err.empty(); ++d)
    if (!g.row(d).allFinite() || !(g.row(d).array() > 0).all())
      err = "--resume " + o_.resume + ": the gammas of document " + std::to_string(begin + d) +
            " are not all positive and finite (corrupt checkpoint?)";
  comm_.raise_if_any(err);
  return g;
}

std::vector<double> Checkpointer::pass_terms() const {
  return resuming() && comm_.is_root() ? state_->pass_terms : std::vector<double>{};
}

void Checkpointer::boundary(const Position& pos, const Model& model, const FitResult& res,
                            double elapsed, std::span<const RowMatrix> gammas,
                            std::span<const double> pass_terms) {
  const bool svi = o_.algorithm == "svi";
  const ckpt::StopPoller::Decision d = poller_.poll(svi ? pos.t : pos.iteration);
  if (d.save && !o_.checkpoint.empty()) {
    write(pos, model, res, elapsed, gammas, pass_terms);
    poller_.saved();
  }
  if (d.signal == 0) return;
  ckpt::stop(d.signal,
             svi ? "after step " + std::to_string(pos.t) + " (pass " +
                       std::to_string(pos.iteration) + ", " + std::to_string(pos.step) +
                       " minibatches of the pass done)"
                 : "before iteration " + std::to_string(pos.iteration),
             o_.checkpoint);
}

void Checkpointer::write(const Position& pos, const Model& model, const FitResult& res,
                         double elapsed, std::span<const RowMatrix> gammas,
                         std::span<const double> pass_terms) const {
  // Collective part: the document sweeps over all ranks, and the per-document state on rank 0.
  std::int64_t sweeps = res.sweeps;
  comm_.allreduce_sum(std::span<std::int64_t>(&sweeps, 1));
  std::vector<double> mine;
  for (const RowMatrix& g : gammas) mine.insert(mine.end(), g.data(), g.data() + g.size());
  // Before the first CAVI iteration no rank has gammas yet (that iteration starts cold).
  const bool with_gammas =
      o_.algorithm == "cavi" && comm_.allreduce_max(static_cast<std::int64_t>(mine.size())) > 0;
  const std::vector<double> all_gammas =
      with_gammas ? comm_.gatherv(mine, 0) : std::vector<double>{};
  const std::vector<double> all_terms = comm_.gatherv(pass_terms, 0);
  comm_.on_root([&] {
    if (with_gammas && all_gammas.size() != static_cast<std::size_t>(n_docs_ * o_.topics))
      throw Error("checkpoint: gathered " + std::to_string(all_gammas.size()) +
                  " gamma values, expected documents x topics");
    io::FileWriter w(o_.checkpoint);
    fp_->write(w);
    const RowMatrix lambda = model.lambda();
    w.write("lambda", std::span<const double>(lambda.data(), lambda.size()),
            {static_cast<std::uint64_t>(lambda.rows()), static_cast<std::uint64_t>(lambda.cols())});
    if (with_gammas)
      w.write("gamma", all_gammas,
              {static_cast<std::uint64_t>(n_docs_), static_cast<std::uint64_t>(o_.topics)});
    ckpt::write_vec(w, "pass_terms", all_terms);
    ckpt::write_vec(w, "trace/elbo", res.trace);
    ckpt::write_vec(w, "trace/seconds", res.trace_seconds);
    ckpt::write_vec(w, "trace/perplexity", res.trace_perplexity);
    w.attr("iteration", static_cast<std::int64_t>(pos.iteration));
    w.attr("step", pos.step);
    w.attr("t", pos.t);
    w.attr("pass_tokens", pos.pass_tokens);
    w.attr("reduced_rows", pos.reduced_rows);
    w.attr("reductions", pos.reductions);
    w.attr("iterations", static_cast<std::int64_t>(res.iterations));
    w.attr("sweeps", sweeps);
    w.attr("tokens", res.tokens);
    w.attr("elapsed", elapsed);
    // Provenance only (not compared on resume).
    w.attr("data", o_.data);
    w.attr("ranks", static_cast<std::int64_t>(comm_.size()));
    w.attr("threads", static_cast<std::int64_t>(max_threads()));
    w.attr("version", o_.version);
    w.attr("command", o_.command);
    w.commit();
  });
}

}  // namespace caviar::lda
