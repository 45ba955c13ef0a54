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

ckpt::Fingerprint fingerprint(const Comm& comm, const FitOptions& o, const io::DataRef& ref,
                              const io::CorpusInfo& info, const std::vector<std::int64_t>* indptr,
                              const io::DataRef* heldout, double alpha, double eta) {
  ckpt::Fingerprint fp("lda");
  fp.add("algorithm", o.algorithm, "--algorithm");
  fp.add("topics", static_cast<std::int64_t>(o.topics), "--topics");
  fp.add("words", info.n_words, "vocabulary size V =");
  ckpt::add_corpus(fp, comm, "--data", ref, info, indptr);
  if (heldout) {
    io::CorpusInfo hi = io::inspect_corpus(comm, *heldout);
    ckpt::add_corpus(fp, comm, "--heldout", *heldout, hi, nullptr);
  } else {
    fp.add("heldout", std::string("none"), "--heldout");
  }
  fp.add("alpha", alpha, "--alpha");
  fp.add("eta", eta, "--eta");
  fp.add("seed", static_cast<std::int64_t>(o.seed), "--seed");
  fp.add("doc_tol", o.local.tol, "--doc-tol");
  fp.add("doc_max_iter", static_cast<std::int64_t>(o.local.max_iter), "--doc-max-iter");
  // --stream SVI draws other minibatches (runs of 256-document blocks); --stream CAVI equals the
  // in-memory fit, but is kept apart too (never tested across).
  fp.add("stream", static_cast<std::int64_t>(o.stream), "--stream");
  if (o.algorithm == "svi") {
    fp.add("batch_size", static_cast<std::int64_t>(o.batch_size), "--batch-size");
    fp.add("tau0", o.tau0, "--tau0");
    fp.add("kappa", o.kappa, "--kappa");
  }
  return fp;
}

void Checkpointer::open(const io::DataRef& ref, const io::CorpusInfo& info,
                        const std::vector<std::int64_t>* indptr, const io::DataRef* heldout,
                        double alpha, double eta) {
  if (o_.checkpoint.empty() && o_.resume.empty()) return;
  fp_ = fingerprint(comm_, o_, ref, info, indptr, heldout, alpha, eta);
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
    engine::RunResult& run = s.res.run;
    run.iterations = static_cast<int>(count("iterations", INT_MAX));
    s.res.sweeps = count("sweeps", ckpt::kMaxCount);
    s.res.tokens = num("tokens");
    run.trace.objective = ckpt::read_vec(r, "/trace/elbo");
    run.trace.seconds = ckpt::read_vec(r, "/trace/seconds");
    run.trace.heldout = ckpt::read_vec(r, "/trace/perplexity");
    if (p.iteration < 0 || p.step < 0 || p.t < 0 ||
        run.trace.objective.size() != static_cast<std::size_t>(p.iteration) ||
        run.trace.seconds.size() != run.trace.objective.size())
      throw Error(bad + "its position and traces disagree (corrupt checkpoint?)");
    if (p.iteration >= o_.iterations())
      throw Error(bad + "it stopped in pass " + std::to_string(p.iteration + 1) +
                  ", beyond this run's --max-iter " + std::to_string(o_.iterations()));
    s.pass_terms = ckpt::read_vec(r, "/pass_terms");
    if (s.pass_terms.size() > static_cast<std::size_t>(info.n_docs))
      throw Error(bad + "it holds more document terms than the corpus has documents");
  });
  // The boundary we resume at was the one saved: no need to save it again by count.
  poller_.skip_count_at(s.pos.t);
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
  res.run.iterations = c.run.iterations;
  res.run.trace = c.run.trace;
  res.tokens = c.tokens;
  res.sweeps = comm_.is_root() ? c.sweeps : 0;
}

std::vector<double> Checkpointer::pass_terms() const {
  return resuming() && comm_.is_root() ? state_->pass_terms : std::vector<double>{};
}

void Checkpointer::boundary(const Position& pos, const Model& model, const FitResult& res,
                            double elapsed, std::span<const double> pass_terms) {
  const ckpt::StopPoller::Decision d = poller_.poll(pos.t);
  if (d.save && !o_.checkpoint.empty()) {
    write(pos, model, res, elapsed, pass_terms);
    poller_.saved();
  }
  if (d.signal == 0) return;
  ckpt::stop(d.signal,
             "after step " + std::to_string(pos.t) + " (pass " + std::to_string(pos.iteration) +
                 ", " + std::to_string(pos.step) + " minibatches of the pass done)",
             o_.checkpoint);
}

void Checkpointer::write(const Position& pos, const Model& model, const FitResult& res,
                         double elapsed, std::span<const double> pass_terms) const {
  // Collective part: the document sweeps over all ranks, and the pass's document terms on rank 0.
  std::int64_t sweeps = res.sweeps;
  comm_.allreduce_sum(std::span<std::int64_t>(&sweeps, 1));
  const std::vector<double> all_terms = comm_.gatherv(pass_terms, 0);
  comm_.on_root([&] {
    io::FileWriter w(o_.checkpoint);
    fp_->write(w);
    const RowMatrix lambda = model.lambda();
    w.write("lambda", std::span<const double>(lambda.data(), lambda.size()),
            {static_cast<std::uint64_t>(lambda.rows()), static_cast<std::uint64_t>(lambda.cols())});
    ckpt::write_vec(w, "pass_terms", all_terms);
    const engine::Trace& t = res.run.trace;
    ckpt::write_vec(w, "trace/elbo", t.objective);
    ckpt::write_vec(w, "trace/seconds", t.seconds);
    ckpt::write_vec(w, "trace/perplexity", t.heldout);
    w.attr("iteration", static_cast<std::int64_t>(pos.iteration));
    w.attr("step", pos.step);
    w.attr("t", pos.t);
    w.attr("pass_tokens", pos.pass_tokens);
    w.attr("reduced_rows", pos.reduced_rows);
    w.attr("reductions", pos.reductions);
    w.attr("iterations", static_cast<std::int64_t>(res.run.iterations));
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
