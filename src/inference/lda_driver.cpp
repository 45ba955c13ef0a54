#include "inference/lda_driver.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "core/error.hpp"
#include "core/exact_sum.hpp"
#include "core/parallel.hpp"
#include "core/partition.hpp"
#include "core/rng.hpp"
#include "engine/batch.hpp"
#include "engine/checkpoint.hpp"
#include "engine/model_file.hpp"
#include "engine/state_io.hpp"
#include "engine/stochastic.hpp"
#include "inference/lda_checkpoint.hpp"
#include "io/csr.hpp"
#include "io/h5.hpp"
#include "models/lda/batch.hpp"
#include "models/lda/svi.hpp"

namespace caviar::lda {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<std::int64_t> iota(std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), std::int64_t{0});
  return v;
}

// Held-out perplexity of `model` on a corpus already read (document completion).
ScoreResult completion_score(const Comm& comm, const Model& model, const Corpus& c,
                             std::int64_t n_docs, const LocalOptions& local) {
  std::vector<double> lp(static_cast<std::size_t>(c.n_docs())), nh(lp.size());
  model.completion(c, lp, nh, local);
  ScoreResult r;
  r.log_likelihood = exact_sum(comm, lp);
  r.heldout_tokens = exact_sum(comm, nh);
  r.documents = n_docs;
  if (!(r.heldout_tokens > 0))
    throw Error("no held-out tokens: every document has fewer than two tokens");
  r.perplexity = std::exp(-r.log_likelihood / r.heldout_tokens);
  return r;
}

struct LoadedModel {
  Model model;
  std::vector<std::string> vocab;
};

LoadedModel load_model(const std::string& file) {
  io::FileReader r(file);
  if (!r.has("/components"))
    throw Error("'" + file + "' is not a caviar lda model (no /components)");
  io::Dims dims;
  const auto lam = r.read("/components", &dims);
  if (dims.size() != 2 || dims[0] < 1 || dims[1] < 1)
    throw Error("'" + file + "': /components must be a K x V matrix");
  const int k = static_cast<int>(dims[0]);
  const auto v = static_cast<std::int64_t>(dims[1]);
  LoadedModel m{Model(k, v, r.read_double_attr("alpha"), r.read_double_attr("eta")), {}};
  m.model.set_lambda(Eigen::Map<const RowMatrix>(lam.data(), k, v));
  if (r.has("/vocab")) m.vocab = r.read_strings("/vocab");
  if (!m.vocab.empty() && static_cast<std::int64_t>(m.vocab.size()) != v)
    throw Error("'" + file + "': /vocab has " + std::to_string(m.vocab.size()) +
                " words but /components has " + std::to_string(v) + " columns");
  return m;
}

LoadedModel load_model(const Comm& comm, const std::string& file) {
  std::optional<LoadedModel> m;
  comm.agree([&] { m.emplace(load_model(file)); });
  return std::move(*m);
}

// The model and the corpus must share the vocabulary: same size, and the same words when both
// carry them (checked on rank 0).
void check_vocab(const Comm& comm, const LoadedModel& m, const io::DataRef& ref,
                 std::int64_t n_words) {
  if (n_words != m.model.n_words())
    throw Error(ref.str() + " has a vocabulary of " + std::to_string(n_words) +
                " words but the model has " + std::to_string(m.model.n_words()));
  comm.on_root([&] {
    const auto vocab = io::read_vocab(ref);
    if (vocab.empty() || m.vocab.empty()) return;
    for (std::size_t i = 0; i < vocab.size(); ++i)
      if (vocab[i] != m.vocab[i])
        throw Error(ref.str() + " and the model have different vocabularies (word " +
                    std::to_string(i) + ": '" + vocab[i] + "' vs '" + m.vocab[i] + "')");
  });
}

// An exchange file (lda export / import): the model's state, its vocabulary, and `extra`.
void write_topics_file(const std::string& out, const Model& m,
                       const std::vector<std::string>& vocab,
                       const std::function<void(io::FileWriter&)>& extra) {
  io::FileWriter w(out);
  engine::FileStateWriter sw(w);
  m.save(sw);
  if (!vocab.empty()) w.write_strings("vocab", vocab);
  w.attr("model", std::string("lda"));
  if (extra) extra(w);
  w.commit();
}

}  // namespace

namespace {

void check_options(const FitOptions& o) {
  if (o.topics < 1) throw Error("--topics must be >= 1 (got " + std::to_string(o.topics) + ")");
  if (o.algorithm != "cavi" && o.algorithm != "svi")
    throw Error("--algorithm must be cavi or svi (got '" + o.algorithm + "')");
  if (o.iterations() < 0) throw Error("--max-iter must be >= 0");
  if (!(o.tol >= 0) || !std::isfinite(o.tol)) throw Error("--tol must be a finite number >= 0");
  if (o.algorithm == "svi" && o.iterations() < 1)
    throw Error("--max-iter (passes over the corpus) must be >= 1 for svi");
  if (o.batch_size < 1) throw Error("--batch-size must be >= 1");
  if (!(o.tau0 >= 0)) throw Error("--tau0 must be >= 0");
  if (!(o.kappa > 0.5 && o.kappa <= 1)) throw Error("--kappa must be in (0.5, 1]");
  if (!(o.local.tol > 0)) throw Error("--doc-tol must be > 0");
  if (o.local.max_iter < 1) throw Error("--doc-max-iter must be >= 1");
}

// The files a fit reads, checked against --out before anything is read (collective).
struct Inputs {
  io::DataRef data;
  std::optional<io::DataRef> heldout;
  std::vector<std::string> files;
};

Inputs check_inputs(const Comm& comm, const FitOptions& o) {
  Inputs in{io::DataRef::parse(o.data, "/"), std::nullopt, {}};
  in.files.push_back(in.data.file);
  if (!o.heldout.empty()) {
    in.heldout = io::DataRef::parse(o.heldout, "/");
    in.files.push_back(in.heldout->file);
  }
  if (!o.out.empty()) io::check_output_path(comm, o.out, in.files);
  return in;
}

// The held-out corpus, whose vocabulary must be the training corpus's.
Corpus read_heldout(const Comm& comm, const Inputs& in, const io::CorpusInfo& info,
                    std::int64_t* n_docs) {
  io::CorpusInfo hi;
  Corpus c = io::read_corpus(comm, *in.heldout, &hi);
  *n_docs = hi.n_docs;
  if (hi.n_words != info.n_words)
    throw Error("--heldout " + in.heldout->str() + " has " + std::to_string(hi.n_words) +
                " words but " + in.data.str() + " has " + std::to_string(info.n_words));
  return c;
}

// The summary's account of the corpus, and the seconds since t0 spent reading it.
FitResult corpus_result(const io::CorpusInfo& info, std::chrono::steady_clock::time_point t0) {
  FitResult res;
  res.read_seconds = seconds_since(t0);
  res.documents = info.n_docs;
  res.words = info.n_words;
  res.tokens = info.tokens;
  return res;
}

// The starting model (Model::init_random), with alpha and eta 1/K unless given.
Model initial_model(const FitOptions& o, std::int64_t n_words) {
  Model m(o.topics, n_words, o.alpha.value_or(1.0 / o.topics), o.eta.value_or(1.0 / o.topics));
  m.init_random(o.seed);
  return m;
}

// The model file of --out (collective): the engine's, with the names LDA's files have always
// used (trace/elbo, trace/perplexity, attribute elbo), the vocabulary and the SVI settings.
void write_model(const Comm& comm, const FitOptions& o, const Model& model, const io::DataRef& ref,
                 std::int64_t n_docs, const engine::RunResult& run) {
  engine::Provenance p{"lda", o.algorithm, o.data, o.command, o.version, o.seed};
  p.objective_name = "elbo";
  p.heldout_name = "perplexity";
  engine::write_model_file(
      comm, o.out, [&](engine::StateWriter& w) { model.save(w); }, run, p,
      [&](io::FileWriter& w) {
        const auto vocab = io::read_vocab(ref);
        if (!vocab.empty()) w.write_strings("vocab", vocab);
        w.attr("n_documents", n_docs);
        w.attr("batch_size", static_cast<std::int64_t>(o.batch_size));
        w.attr("tau0", o.tau0);
        w.attr("kappa", o.kappa);
        w.attr("stream", static_cast<std::int64_t>(o.stream));
      });
}

// The engine fields both fits set alike; heldout (--heldout) may be empty.
void set_run(engine::Run& run, const Comm& comm, const FitOptions& o, engine::Checkpointer& ck,
             RowRange rows, std::int64_t n_docs, const Progress& progress,
             std::function<double()> heldout) {
  run.comm = &comm;
  run.stop = {o.iterations(), o.tol};
  run.checkpoint = &ck;
  run.rows = rows;
  run.global_rows = n_docs;
  run.progress = progress;
  run.heldout = std::move(heldout);
}

// Batch CAVI on the engine's driver (models/lda/batch.hpp), in memory or --stream.
FitResult fit_cavi(const Comm& comm, const FitOptions& o, const Progress& progress,
                   const Inputs& in) {
  const auto t0 = std::chrono::steady_clock::now();
  // The stop-signal handlers are installed before the corpus is read, so that a signal while
  // reading stops at the first boundary.
  engine::Checkpointer ck(comm, {o.checkpoint, o.checkpoint_every, o.resume}, in.files, o.out);
  io::CorpusInfo info;
  Corpus corpus, piece;
  std::vector<std::int64_t> indptr;  // --stream: the whole /indptr, and no documents
  Pieces pieces;
  RowRange rows;
  if (!o.stream) {
    corpus = io::read_corpus(comm, in.data, &info);
    rows = {corpus.doc_begin, corpus.doc_begin + corpus.n_docs()};
    pieces = {{{0, corpus.n_docs()}}, 1, [&](std::int64_t) -> const Corpus& { return corpus; }};
  } else {
    // The rank's documents (the split of read_corpus) in pieces of stream_piece_docs, read again
    // every iteration; reads are collective, so every rank makes as many calls as the rank with
    // the most pieces.
    indptr = io::read_indptr(comm, in.data, &info);
    if (o.stream_piece_docs < 1) throw Error("the stream piece size must be >= 1");
    const auto [r0, r1] = io::document_range(indptr, comm.size(), comm.rank());
    rows = {r0, r1};
    for (std::int64_t a = r0; a < r1; a += o.stream_piece_docs)
      pieces.ranges.push_back({a - r0, std::min(r1, a + o.stream_piece_docs) - r0});
    pieces.calls = comm.allreduce_max(static_cast<std::int64_t>(pieces.ranges.size()));
    // The reader keeps its own copy of the ranges (pieces moves into the model below).
    pieces.read = [&, r0 = r0, ranges = pieces.ranges](std::int64_t i) -> const Corpus& {
      const RowRange r = i < static_cast<std::int64_t>(ranges.size())
                             ? ranges[static_cast<std::size_t>(i)]
                             : RowRange{-r0, -r0};
      piece = io::read_corpus_range(comm, in.data, indptr, info.n_words, r0 + r.begin, r0 + r.end);
      return piece;
    };
  }
  Corpus held;
  std::int64_t held_docs = 0;
  if (in.heldout) held = read_heldout(comm, in, info, &held_docs);
  if (o.stream) {
    // A first reading pass validates the pieces and counts the tokens, which set the fixed-point
    // scale exactly as in memory, so the fit is the in-memory one bit for bit.
    std::int64_t tokens = 0;
    for (std::int64_t i = 0; i < pieces.calls; ++i)
      tokens += static_cast<std::int64_t>(pieces.read(i).tokens());
    comm.allreduce_sum(std::span<std::int64_t>(&tokens, 1));
    info.tokens = static_cast<double>(tokens);
  }
  if (!(info.tokens > 0)) throw Error(in.data.str() + " has no tokens (every document is empty)");
  FitResult res = corpus_result(info, t0);

  Model model = initial_model(o, info.n_words);
  const double alpha = model.alpha(), eta = model.eta();
  if (!o.checkpoint.empty() || !o.resume.empty()) {
    ckpt::Fingerprint fp = fingerprint(comm, o, in.data, info, o.stream ? &indptr : nullptr,
                                       in.heldout ? &*in.heldout : nullptr, alpha, eta);
    // Older CAVI checkpoints kept the gammas in another layout: they lack this entry, and a
    // resume from one stops with "its fingerprint lacks 'layout' (written by another version?)".
    fp.add("layout", std::string("engine"), "the checkpoint layout");
    ck.open(std::move(fp));
  }
  BatchFit fit(model, std::move(pieces), info.tokens, o.local, ck.iteration() > 0);
  engine::BatchRun run;
  set_run(run, comm, o, ck, rows, info.n_docs, progress,
          in.heldout
              ? [&] { return completion_score(comm, model, held, held_docs, o.local).perplexity; }
              : std::function<double()>());
  run.counters = {{"doc_sweeps", &fit.sweeps()}};
  res.run = engine::fit_batch(fit, run);
  res.sweeps = fit.sweeps();
  comm.allreduce_sum(std::span<std::int64_t>(&res.sweeps, 1));
  if (!o.out.empty()) write_model(comm, o, model, in.data, info.n_docs, res.run);
  return res;
}

// The --stream reader of SVI's minibatches (models/lda/svi.hpp): the documents `rows` (global
// indices) read as runs of consecutive documents, in collective reads (every rank makes as many
// calls as the rank with the most runs), and the minibatch's tokens over every rank.
BatchReader stream_reader(const Comm& comm, const io::DataRef& ref,
                          const std::vector<std::int64_t>& indptr, std::int64_t n_words) {
  return [&comm, &ref, &indptr, n_words](std::span<const std::int64_t> rows,
                                         std::vector<Corpus>& parts) {
    std::vector<std::pair<std::int64_t, std::int64_t>> runs;
    for (const std::int64_t r : rows)
      if (!runs.empty() && runs.back().second == r)
        ++runs.back().second;
      else
        runs.emplace_back(r, r + 1);
    const std::int64_t calls = comm.allreduce_max(static_cast<std::int64_t>(runs.size()));
    parts.clear();
    std::int64_t tokens = 0;
    for (std::int64_t c = 0; c < calls; ++c) {
      const auto [d0, d1] = c < static_cast<std::int64_t>(runs.size())
                                ? runs[static_cast<std::size_t>(c)]
                                : std::pair<std::int64_t, std::int64_t>{0, 0};
      parts.push_back(io::read_corpus_range(comm, ref, indptr, n_words, d0, d1));
      tokens += static_cast<std::int64_t>(parts.back().tokens());
    }
    comm.allreduce_sum(std::span<std::int64_t>(&tokens, 1));
    return static_cast<double>(tokens);
  };
}

// Stochastic variational inference on the engine's stochastic driver (models/lda/svi.hpp), in
// memory or --stream.
FitResult fit_svi(const Comm& comm, const FitOptions& o, const Progress& progress,
                  const Inputs& in) {
  const auto t0 = std::chrono::steady_clock::now();
  // The stop-signal handlers are installed before the corpus is read, so that a signal while
  // reading stops at the first boundary.
  engine::Checkpointer ck(comm, {o.checkpoint, o.checkpoint_every, o.resume}, in.files, o.out);
  io::CorpusInfo info;
  Corpus corpus;
  std::vector<std::int64_t> indptr;  // --stream: the whole /indptr, and no documents
  RowRange rows;
  if (o.stream) {
    indptr = io::read_indptr(comm, in.data, &info);
    const auto [r0, r1] = io::document_range(indptr, comm.size(), comm.rank());
    rows = {r0, r1};
  } else {
    corpus = io::read_corpus(comm, in.data, &info);
    rows = {corpus.doc_begin, corpus.doc_begin + corpus.n_docs()};
  }
  Corpus held;
  std::int64_t held_docs = 0;
  if (in.heldout) held = read_heldout(comm, in, info, &held_docs);
  FitResult res = corpus_result(info, t0);
  if (!o.stream && !(info.tokens > 0))
    throw Error(in.data.str() + " has no tokens (every document is empty)");

  Model model = initial_model(o, info.n_words);
  if (!o.checkpoint.empty() || !o.resume.empty()) {
    ckpt::Fingerprint fp =
        fingerprint(comm, o, in.data, info, o.stream ? &indptr : nullptr,
                    in.heldout ? &*in.heldout : nullptr, model.alpha(), model.eta());
    // Older SVI checkpoints had their own layout: they lack this entry, and a resume from one
    // stops with "its fingerprint lacks 'layout' (written by another version?)".
    fp.add("layout", std::string("engine"), "the checkpoint layout");
    ck.open(std::move(fp));
  }
  SviFit fit(model, o.stream ? nullptr : &corpus,
             o.stream ? stream_reader(comm, in.data, indptr, info.n_words) : nullptr, info.n_docs,
             info.tokens, o.seed, o.local);
  engine::StochasticRun run;
  // --tol compares the passes' objective estimates, as for every stochastic fit.
  set_run(run, comm, o, ck, rows, info.n_docs, progress,
          in.heldout
              ? [&] { return completion_score(comm, model, held, held_docs, o.local).perplexity; }
              : std::function<double()>());
  run.counters = {{"doc_sweeps", &fit.sweeps()},
                  {"tokens_visited", &fit.tokens_visited()},
                  {"reduced_words", &fit.reduced_words()},
                  {"reductions", &fit.reductions()}};
  // --stream: any rank reads any document, so each minibatch is split evenly over the ranks.
  run.schedule = {o.batch_size, o.tau0, o.kappa, o.seed, 0, o.stream};
  res.run = engine::fit_stochastic(fit, run);
  std::int64_t counts[4] = {fit.sweeps(), fit.tokens_visited(), fit.reduced_words(),
                            fit.reductions()};
  comm.allreduce_sum(std::span<std::int64_t>(counts, 4));
  res.sweeps = counts[0];
  // --stream: the tokens are those of the passes' documents (each pass visits every document).
  if (o.stream && res.run.iterations > 0)
    res.tokens = static_cast<double>(counts[1] / res.run.iterations);
  // The mean share of the V rows a reduction moved.
  if (counts[3] > 0)
    res.reduced_rows = static_cast<double>(counts[2]) /
                       (static_cast<double>(counts[3]) * static_cast<double>(info.n_words));
  if (!o.out.empty()) write_model(comm, o, model, in.data, info.n_docs, res.run);
  return res;
}

}  // namespace

FitResult fit(const Comm& comm, const FitOptions& o, const Progress& progress) {
  check_options(o);
  const Inputs in = check_inputs(comm, o);
  if (o.algorithm == "cavi") return fit_cavi(comm, o, progress, in);
  return fit_svi(comm, o, progress, in);
}

ScoreResult score(const Comm& comm, const std::string& model_file, const std::string& data,
                  const LocalOptions& local) {
  const auto t0 = std::chrono::steady_clock::now();
  const LoadedModel m = load_model(comm, model_file);
  const io::DataRef ref = io::DataRef::parse(data, "/");
  io::CorpusInfo info;
  const Corpus c = io::read_corpus(comm, ref, &info);
  check_vocab(comm, m, ref, info.n_words);
  ScoreResult r = completion_score(comm, m.model, c, info.n_docs, local);
  r.seconds = seconds_since(t0);
  return r;
}

std::vector<Topic> topics(const std::string& model_file, int top) {
  if (top < 1) throw Error("--top must be >= 1");
  const LoadedModel m = load_model(model_file);
  const RowMatrix beta = m.model.topic_word();
  std::vector<Topic> out;
  for (int k = 0; k < beta.rows(); ++k) {
    std::vector<std::int64_t> idx = iota(beta.cols());
    const auto n = std::min<std::int64_t>(top, beta.cols());
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](auto a, auto b) {
      return beta(k, a) > beta(k, b) || (beta(k, a) == beta(k, b) && a < b);
    });
    Topic t;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto w = idx[i];
      t.words.push_back(m.vocab.empty() ? std::to_string(w) : m.vocab[w]);
      t.weights.push_back(beta(k, w));
    }
    out.push_back(std::move(t));
  }
  return out;
}

void export_topics(const Comm& comm, const std::string& model_file, const std::string& out) {
  io::check_output_path(comm, out, {model_file});
  comm.on_root([&] {
    const LoadedModel m = load_model(model_file);
    write_topics_file(out, m.model, m.vocab, nullptr);
  });
}

void import_topics(const Comm& comm, const std::string& components, std::optional<double> alpha,
                   std::optional<double> eta, const std::string& vocab_from, const std::string& out,
                   const std::string& command) {
  const io::DataRef ref = io::DataRef::parse(components, "/components");
  std::vector<std::string> inputs{ref.file};
  if (!vocab_from.empty()) inputs.push_back(io::DataRef::parse(vocab_from, "/").file);
  io::check_output_path(comm, out, inputs);
  comm.on_root([&] {
    io::FileReader r(ref.file);
    io::Dims dims;
    if (!r.has(ref.path)) throw Error("no dataset '" + ref.path + "' in '" + ref.file + "'");
    const auto lam = r.read(ref.path, &dims);
    if (dims.size() != 2 || dims[0] < 1 || dims[1] < 1)
      throw Error(ref.str() + " must be a K x V matrix of topic-word Dirichlet parameters");
    auto attr = [&](const char* name, std::optional<double> v) {
      if (v) return *v;
      try {
        return r.read_double_attr(name);
      } catch (const Error&) {
        throw Error(std::string("--") + name + " is required: '" + ref.file +
                    "' has no attribute '" + name + "'");
      }
    };
    Model m(static_cast<int>(dims[0]), static_cast<std::int64_t>(dims[1]), attr("alpha", alpha),
            attr("eta", eta));
    m.set_lambda(Eigen::Map<const RowMatrix>(lam.data(), m.n_topics(), m.n_words()));
    std::vector<std::string> vocab;
    if (!vocab_from.empty())
      vocab = io::read_vocab(io::DataRef::parse(vocab_from, "/"));
    else if (r.has("/vocab"))
      vocab = r.read_strings("/vocab");
    if (!vocab.empty() && static_cast<std::int64_t>(vocab.size()) != m.n_words())
      throw Error("the vocabulary has " + std::to_string(vocab.size()) + " words but " + ref.str() +
                  " has " + std::to_string(m.n_words()) + " columns");
    write_topics_file(out, m, vocab, [&](io::FileWriter& w) {
      w.attr("algorithm", std::string("imported"));
      w.attr("source", ref.str());
      w.attr("command", command);
    });
  });
}

}  // namespace caviar::lda
