// caviar plsa fit | score: the pLSA model (plsa.hpp) on the engine's batch driver, reading the
// same CSR corpus files as `caviar lda`.
#include "models/plsa/commands.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "engine/batch.hpp"
#include "engine/checkpoint.hpp"
#include "engine/compare.hpp"
#include "engine/model_file.hpp"
#include "engine/reduce.hpp"
#include "engine/state_io.hpp"
#include "io/csr.hpp"
#include "io/h5.hpp"
#include "models/plsa/plsa.hpp"

namespace caviar::plsa {

namespace {

struct FitOptions {
  std::string data, heldout, out, doc_topics;
  int topics = 0;
  double smooth = 0;
  std::uint64_t seed = 0;
  engine::StopRule stop{100, 1e-6};
  engine::CheckpointFiles files;
  FoldIn fold_in;
};

struct Perplexity {
  double perplexity = 0, log_likelihood = 0, heldout_tokens = 0;
};

// Held-out perplexity by document completion (collective).
Perplexity completion_score(const Comm& comm, const Model& m, const Corpus& c, const FoldIn& f) {
  std::vector<double> lp(static_cast<std::size_t>(c.n_docs())), nh(lp.size());
  m.completion(c, lp, nh, f);
  Perplexity p;
  p.log_likelihood = engine::exact_sum(comm, lp);
  p.heldout_tokens = engine::exact_sum(comm, nh);
  if (!(p.heldout_tokens > 0))
    throw Error("no held-out tokens: every document has fewer than two tokens");
  p.perplexity = std::exp(-p.log_likelihood / p.heldout_tokens);
  return p;
}

Corpus read(const Comm& comm, const std::string& spec, std::int64_t n_words, io::CorpusInfo* info) {
  const io::DataRef ref = io::DataRef::parse(spec, "/");
  Corpus c = io::read_corpus(comm, ref, info);
  if (n_words >= 0 && info->n_words != n_words)
    throw Error(ref.str() + " has a vocabulary of " + std::to_string(info->n_words) +
                " words but the model has " + std::to_string(n_words));
  return c;
}

void add_fold_in(CLI::App* c, FoldIn& f) {
  c->add_option("--doc-tol", f.tol, "Folding in: stop at this mean change of p(k|d)")
      ->capture_default_str();
  c->add_option("--doc-max-iter", f.max_iter, "Folding in: at most this many EM sweeps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

void fit(const engine::Context& ctx, const FitOptions& o) {
  const Comm& comm = *ctx.comm;
  const io::DataRef ref = io::DataRef::parse(o.data, "/");
  std::vector<std::string> inputs{ref.file};
  if (!o.heldout.empty()) inputs.push_back(io::DataRef::parse(o.heldout, "/").file);
  if (!o.out.empty()) io::check_output_path(comm, o.out, inputs);
  if (!o.doc_topics.empty()) io::check_output_path(comm, o.doc_topics, inputs);
  if (!o.out.empty() && o.out == o.doc_topics)
    throw Error("--doc-topics and --out name the same file");
  engine::Checkpointer ck(comm, o.files, inputs, o.out);
  io::CorpusInfo info, held_info;
  const Corpus corpus = read(comm, o.data, -1, &info);
  if (!(info.tokens > 0)) throw Error(ref.str() + " has no tokens (every document is empty)");
  std::optional<Corpus> held;
  if (!o.heldout.empty()) held = read(comm, o.heldout, info.n_words, &held_info);
  Model model(o.topics, info.n_words, &corpus, info.tokens, o.smooth);
  model.init_random(o.seed);
  if (!o.files.checkpoint.empty() || !o.files.resume.empty()) {
    ckpt::Fingerprint fp("plsa");
    fp.add("algorithm", std::string("em"), "--algorithm");
    fp.add("topics", static_cast<std::int64_t>(o.topics), "--topics");
    ckpt::add_corpus(fp, comm, "--data", ref, info, nullptr);
    fp.add("seed", static_cast<std::int64_t>(o.seed), "--seed");
    fp.add("smooth", o.smooth, "--smooth");
    if (held) {
      ckpt::add_corpus(fp, comm, "--heldout", io::DataRef::parse(o.heldout, "/"), held_info,
                       nullptr);
      fp.add("doc_tol", o.fold_in.tol, "--doc-tol");
      fp.add("doc_max_iter", static_cast<std::int64_t>(o.fold_in.max_iter), "--doc-max-iter");
    }
    ck.open(std::move(fp));
  }
  print_progress(ctx, "caviar plsa fit: " + o.data + ", K=" + std::to_string(o.topics) + ", em, " +
                          std::to_string(comm.size()) + " ranks x " +
                          std::to_string(max_threads()) + " threads");
  engine::BatchRun run;
  run.comm = &comm;
  run.stop = o.stop;
  run.checkpoint = &ck;
  run.rows = {corpus.doc_begin, corpus.doc_begin + corpus.n_docs()};
  run.global_rows = info.n_docs;
  run.progress = [&](const engine::Report& r) {
    char line[160];
    std::snprintf(line, sizeof line, "iter %4d  loglik % .10e  perplexity %10.3f  %8.3fs",
                  r.iteration, r.objective, r.heldout, r.seconds);
    print_progress(ctx, line);
  };
  if (held)
    run.heldout = [&] { return completion_score(comm, model, *held, o.fold_in).perplexity; };
  const engine::RunResult res = engine::fit_batch(model, run);
  if (!o.out.empty()) {
    engine::write_model_file(comm, o.out, [&](engine::StateWriter& w) { model.save(w); }, res,
                             {"plsa", "em", o.data, ctx.command_line, CAVIAR_VERSION, o.seed});
    print_progress(ctx, "wrote model " + o.out);
  }
  if (!o.doc_topics.empty()) {
    auto mine = model.local_states().front();
    engine::write_rows_file(comm, o.doc_topics, {mine, info.n_docs, run.rows});
    print_progress(ctx, "wrote " + o.doc_topics + ":/" + mine.name);
  }
  auto j = engine::summary(ctx, res);
  j["documents"] = info.n_docs;
  j["words"] = info.n_words;
  j["tokens"] = info.tokens;
  print_summary(ctx, j);
}

void score(const engine::Context& ctx, const std::string& model_file, const std::string& data,
           const FoldIn& f) {
  const Comm& comm = *ctx.comm;
  std::optional<Model> model;
  comm.agree([&] {
    const io::FileReader r(model_file);
    engine::require_model_kind(r, model_file, "plsa");
    const double k = r.read_double_attr("n_topics"), v = r.read_double_attr("n_words");
    if (!(k >= 1 && k <= 1e6 && v >= 1 && v <= 1e12 && k == std::floor(k) && v == std::floor(v)))
      throw Error("'" + model_file + "': its n_topics or n_words is not a valid size");
    model.emplace(static_cast<int>(k), static_cast<std::int64_t>(v), nullptr, 0.0);
    try {
      model->load(engine::FileStateReader(r, model_file));
    } catch (const Error& e) {
      throw Error("'" + model_file + "': " + e.what());
    }
  });
  io::CorpusInfo info;
  const Corpus c = read(comm, data, model->n_words(), &info);
  const Perplexity p = completion_score(comm, *model, c, f);
  nlohmann::ordered_json j;
  j["perplexity"] = p.perplexity;
  j["log_likelihood"] = p.log_likelihood;
  j["heldout_tokens"] = p.heldout_tokens;
  j["documents"] = info.n_docs;
  if (!std::isfinite(p.perplexity))
    print_progress(ctx,
                   "caviar: warning: held-out tokens of words the model gives probability 0 "
                   "(unseen in training): the perplexity is infinite; fit with --smooth > 0");
  print_progress(ctx, "perplexity " + std::to_string(p.perplexity));
  print_summary(ctx, j);
}

}  // namespace

void add_commands(CLI::App& cli, engine::Context& ctx) {
  auto* plsa = cli.add_subcommand(
      "plsa", "Probabilistic latent semantic analysis (Hofmann 1999), fitted by EM");
  plsa->require_subcommand(1);
  engine::add_compare_command(plsa, ctx, "plsa");

  auto o = std::make_shared<FitOptions>();
  auto* f = plsa->add_subcommand("fit", "Fit topics to a CSR bag-of-words corpus by EM");
  f->add_option("--data", o->data, "Corpus FILE.h5[:/group] (indptr, indices, data, vocab)")
      ->required();
  f->add_option("-k,--topics", o->topics, "Number of topics K")->required();
  f->add_option("--seed", o->seed, "Random seed of the initial topics")->capture_default_str();
  f->add_option("--smooth", o->smooth,
                "Pseudo-count added to every topic-word count in the M-step (MAP under a "
                "Dirichlet(1 + s) prior; keeps unseen words' probability positive). 0: maximum "
                "likelihood (Hofmann 1999)")
      ->capture_default_str();
  engine::add_stop_options(f, o->stop);
  f->add_option("--heldout", o->heldout,
                "Corpus FILE.h5[:/group]: held-out perplexity after every iteration");
  add_fold_in(f, o->fold_in);
  f->add_option("--out", o->out, "Model file to write (HDF5: topic_word, traces, provenance)");
  f->add_option("--doc-topics", o->doc_topics,
                "File to write every document's p(k|d) to (dataset doc_topics, documents x K)");
  engine::add_checkpoint_options(f, o->files);
  f->callback([&ctx, o] {
    ctx.stop_signals = true;
    ctx.action = [&ctx, o] { fit(ctx, *o); };
  });

  auto model = std::make_shared<std::string>(), data = std::make_shared<std::string>();
  auto fold = std::make_shared<FoldIn>();
  auto* s = plsa->add_subcommand(
      "score",
      "Held-out perplexity by document completion (fold p(k|d) in on half of each document's "
      "tokens, score the other half)");
  s->add_option("--model", *model, "Model file written by plsa fit")->required();
  s->add_option("--data", *data, "Held-out corpus FILE.h5[:/group]")->required();
  add_fold_in(s, *fold);
  s->callback([&ctx, model, data, fold] {
    ctx.action = [&ctx, model, data, fold] { score(ctx, *model, *data, *fold); };
  });
}

}  // namespace caviar::plsa
