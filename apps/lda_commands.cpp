// caviar lda fit | topics | score | export | import, and caviar generate lda.
#include <cmath>
#include <cstdio>
#include <memory>

#include "app.hpp"
#include "core/parallel.hpp"
#include "engine/compare.hpp"
#include "inference/lda_driver.hpp"
#include "prep/generate_lda.hpp"
#include "prep/text_prep.hpp"

namespace caviar::app {

namespace {

void add_local_options(CLI::App* c, lda::LocalOptions& l) {
  c->add_option("--doc-tol", l.tol, "Document fixed point: stop at this mean change of gamma")
      ->capture_default_str();
  c->add_option("--doc-max-iter", l.max_iter, "Document fixed point: at most this many sweeps")
      ->capture_default_str();
}

}  // namespace

void add_generate_lda_command(CLI::App* gen, Context& ctx);
void add_prep_text_command(CLI::App* prep, Context& ctx);

namespace {

void add_fit_command(CLI::App* lda, Context& ctx) {
  auto o = std::make_shared<lda::FitOptions>();
  auto* fit = lda->add_subcommand("fit", "Fit topics to a CSR bag-of-words corpus");
  fit->add_option("--data", o->data, "Corpus FILE.h5[:/group] (indptr, indices, data, vocab)")
      ->required();
  fit->add_option("-k,--topics", o->topics, "Number of topics K")->required();
  fit->add_option("--algorithm", o->algorithm, "cavi (batch) | svi (online)")
      ->check(CLI::IsMember({"cavi", "svi"}))
      ->capture_default_str();
  fit->add_option("--alpha", o->alpha, "Document-topic Dirichlet prior (default 1/K)");
  fit->add_option("--eta", o->eta, "Topic-word Dirichlet prior (default 1/K)");
  fit->add_option("--max-iter", o->max_iter,
                  "At most this many iterations (cavi) or passes over the corpus (svi) [default: "
                  "100 for cavi, 10 for svi]");
  fit->add_option("--tol", o->tol,
                  "Stop at this relative change of the ELBO between iterations (cavi) or of "
                  "the pass estimate between passes (svi) (0: never)")
      ->capture_default_str();
  engine::add_renamed_option(fit, "--passes", "--max-iter", o->max_iter, ctx);
  fit->add_option("--batch-size", o->batch_size, "SVI: documents per global minibatch")
      ->capture_default_str();
  fit->add_option("--tau0", o->tau0, "SVI: step size offset, rho_t = (tau0 + t)^-kappa")
      ->capture_default_str();
  fit->add_option("--kappa", o->kappa, "SVI: step size decay in (0.5, 1]")->capture_default_str();
  add_local_options(fit, o->local);
  fit->add_option("--seed", o->seed, "Random seed")->capture_default_str();
  fit->add_option("--heldout", o->heldout,
                  "Corpus FILE.h5[:/group]: report held-out perplexity after every iteration/pass");
  fit->add_flag("--stream", o->stream,
                "Keep no documents in memory. SVI: minibatches are runs of randomly ordered "
                "256-document blocks read from the file; CAVI: each iteration reads the rank's "
                "documents in pieces of 4096 (the fit equals the in-memory one)");
  fit->add_option("--out", o->out, "Model file to write (HDF5)");
  engine::add_checkpoint_options(fit, o->checkpoint, o->checkpoint_every, o->resume,
                                 "CAVI iterations, SVI passes");
  fit->callback([&ctx, o] {
    ctx.stop_signals = true;
    ctx.action = [&ctx, o] {
      o->command = ctx.command_line;
      o->version = CAVIAR_VERSION;
      print_progress(ctx, "caviar lda fit: " + o->data + ", K=" + std::to_string(o->topics) + ", " +
                              o->algorithm + ", " + std::to_string(ctx.comm->size()) + " ranks x " +
                              std::to_string(max_threads()) + " threads");
      const auto r = lda::fit(*ctx.comm, *o, [&ctx, o](const engine::Report& it) {
        char line[200];
        std::snprintf(line, sizeof line, "%s %4d  elbo % .10e  perplexity %10.3f  %8.3fs",
                      o->algorithm == "cavi" ? "iter" : "pass", it.iteration, it.objective,
                      it.heldout, it.seconds);
        print_progress(ctx, line);
      });
      if (!o->out.empty()) print_progress(ctx, "wrote model " + o->out);
      const engine::RunResult& run = r.run;
      nlohmann::ordered_json j;
      j["elbo"] = r.elbo();
      j["iterations"] = run.iterations;
      j["converged"] = run.converged;
      j["seconds"] = run.seconds;
      j["read_seconds"] = r.read_seconds;
      j["documents"] = r.documents;
      j["words"] = r.words;
      j["tokens"] = r.tokens;
      j["doc_sweeps"] = r.sweeps;
      j["local_seconds_max"] = run.local_seconds_max;
      j["local_seconds_min"] = run.local_seconds_min;
      j["reduce_seconds_max"] = run.reduce_seconds_max;
      j["reduced_rows"] = r.reduced_rows;
      if (!run.trace.heldout.empty()) j["perplexity"] = run.trace.heldout.back();
      j["ranks"] = ctx.comm->size();
      j["threads"] = max_threads();
      print_summary(ctx, j);
    };
  });
}

// lda topics: the most probable words of each topic.
void add_topics_command(CLI::App* lda, Context& ctx) {
  auto model = std::make_shared<std::string>();
  auto top = std::make_shared<int>(10);
  auto* tp = lda->add_subcommand("topics", "Print the most probable words of each topic");
  tp->add_option("--model", *model, "Model file written by lda fit or lda import")->required();
  tp->add_option("--top", *top, "Words per topic")->capture_default_str();
  tp->callback([&ctx, model, top] {
    ctx.action = [&ctx, model, top] {
      std::vector<lda::Topic> ts;
      ctx.comm->agree([&] {
        if (ctx.comm->is_root()) ts = lda::topics(*model, *top);
      });
      nlohmann::ordered_json j;
      j["topics"] = nlohmann::ordered_json::array();
      for (std::size_t k = 0; k < ts.size(); ++k) {
        std::string line = "topic " + std::to_string(k) + ":";
        for (const auto& w : ts[k].words) line += " " + w;
        print_progress(ctx, line);
        j["topics"].push_back(ts[k].words);
      }
      print_summary(ctx, j);
    };
  });
}

void add_score_command(CLI::App* lda, Context& ctx) {
  auto model = std::make_shared<std::string>();
  auto data = std::make_shared<std::string>();
  auto local = std::make_shared<lda::LocalOptions>();
  auto* sc =
      lda->add_subcommand("score",
                          "Held-out perplexity by document completion (fit theta on half of each "
                          "document's tokens, score the other half)");
  sc->add_option("--model", *model, "Model file")->required();
  sc->add_option("--data", *data, "Held-out corpus FILE.h5[:/group]")->required();
  add_local_options(sc, *local);
  sc->callback([&ctx, model, data, local] {
    ctx.action = [&ctx, model, data, local] {
      const auto r = lda::score(*ctx.comm, *model, *data, *local);
      nlohmann::ordered_json j;
      j["perplexity"] = r.perplexity;
      j["log_likelihood"] = r.log_likelihood;
      j["heldout_tokens"] = r.heldout_tokens;
      j["documents"] = r.documents;
      j["seconds"] = r.seconds;
      print_summary(ctx, j);
    };
  });
}

void add_export_command(CLI::App* lda, Context& ctx) {
  auto model = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto* ex = lda->add_subcommand(
      "export", "Write /components (lambda), /topic_word, /vocab and alpha, eta attributes");
  ex->add_option("--model", *model, "Model file")->required();
  ex->add_option("--out", *out, "Exchange file to write (HDF5)")->required();
  ex->callback([&ctx, model, out] {
    ctx.action = [&ctx, model, out] {
      lda::export_topics(*ctx.comm, *model, *out);
      nlohmann::ordered_json j;
      j["out"] = *out;
      print_summary(ctx, j);
    };
  });
}

void add_import_command(CLI::App* lda, Context& ctx) {
  struct ImportArgs {
    std::string components, vocab, out;
    std::optional<double> alpha, eta;
  };
  auto ia = std::make_shared<ImportArgs>();
  auto* im = lda->add_subcommand(
      "import", "Make a model file from another implementation's topic-word Dirichlet parameters");
  im->add_option("--topics", ia->components,
                 "FILE.h5[:/path] of a K x V matrix lambda (default path /components)")
      ->required();
  im->add_option("--alpha", ia->alpha, "Document-topic prior (default: the file's attribute)");
  im->add_option("--eta", ia->eta, "Topic-word prior (default: the file's attribute)");
  im->add_option("--vocab", ia->vocab, "Copy the vocabulary of this corpus FILE.h5[:/group]");
  im->add_option("--out", ia->out, "Model file to write")->required();
  im->callback([&ctx, ia] {
    ctx.action = [&ctx, ia] {
      lda::import_topics(*ctx.comm, ia->components, ia->alpha, ia->eta, ia->vocab, ia->out,
                         ctx.command_line);
      nlohmann::ordered_json j;
      j["out"] = ia->out;
      print_summary(ctx, j);
    };
  });
}

}  // namespace

void add_lda_commands(CLI::App& cli, Context& ctx) {
  auto* lda = cli.add_subcommand("lda", "Latent Dirichlet allocation (variational, CAVI or SVI)");
  lda->require_subcommand(1);
  engine::add_compare_command(lda, ctx, "lda");

  add_fit_command(lda, ctx);
  add_topics_command(lda, ctx);
  add_score_command(lda, ctx);
  add_export_command(lda, ctx);
  add_import_command(lda, ctx);
  add_generate_lda_command(cli.get_subcommand("generate"), ctx);
  add_prep_text_command(cli.get_subcommand("prep"), ctx);
}

void add_prep_text_command(CLI::App* prep, Context& ctx) {
  auto o = std::make_shared<TextPrepOptions>();
  auto* c = prep->add_subcommand(
      "text",
      "Text files or JSON lines into a CSR bag-of-words corpus (/indptr, /indices, "
      "/data as int32 counts, /vocab)");
  c->add_option("--input", o->inputs,
                "Folders (each file one document; .json files give their \"text\" field, "
                ".jsonl files one document per line) and/or JSON-lines files; repeatable")
      ->required();
  c->add_option("--out", o->out, "Corpus file to write")->required();
  c->add_option("--heldout", o->heldout, "Also write a held-out corpus (same vocabulary)");
  c->add_option("--heldout-fraction", o->heldout_fraction, "Share of documents held out")
      ->capture_default_str();
  c->add_option("--seed", o->seed, "Seed of the held-out draw")->capture_default_str();
  c->add_option("--min-df", o->min_df, "Keep words in at least this many training documents")
      ->capture_default_str();
  c->add_option("--max-df", o->max_df, "Keep words in at most this share of training documents")
      ->capture_default_str();
  c->add_option("--stopwords", o->stopwords, "english | none")
      ->check(CLI::IsMember({"english", "none"}))
      ->capture_default_str();
  c->add_option("--min-length", o->min_length, "Shortest token kept")->capture_default_str();
  c->add_option("--extension", o->extension, "Folders: read only files ending with this");
  c->add_flag("--strip-headers", o->strip_headers,
              "Mail: keep only the text after the first blank line");
  c->callback([&ctx, o] {
    ctx.action = [&ctx, o] {
      const auto r =
          prep_text(*ctx.comm, *o, [&ctx](const std::string& s) { print_progress(ctx, s); });
      print_progress(ctx, "wrote " + o->out + (o->heldout.empty() ? "" : " and " + o->heldout));
      nlohmann::ordered_json j;
      j["out"] = o->out;
      j["documents"] = r.documents;
      if (!o->heldout.empty()) {
        j["heldout"] = o->heldout;
        j["heldout_documents"] = r.heldout_documents;
      }
      j["words"] = r.words;
      j["tokens"] = r.tokens;
      j["empty_documents"] = r.empty_documents;
      j["seconds"] = r.seconds;
      print_summary(ctx, j);
    };
  });
}

void add_generate_lda_command(CLI::App* gen, Context& ctx) {
  auto g = std::make_shared<lda::GenerateOptions>();
  auto* c = gen->add_subcommand("lda", "Sample a corpus from the LDA generative model");
  c->add_option("--docs", g->docs, "Documents")->required();
  c->add_option("--words", g->words, "Vocabulary size")->required();
  c->add_option("--topics", g->topics, "Topics")->required();
  c->add_option("--doc-length", g->doc_length, "Mean tokens per document (uniform on [L/2, 3L/2])")
      ->capture_default_str();
  c->add_option("--alpha", g->alpha, "Document-topic Dirichlet parameter")->capture_default_str();
  c->add_option("--eta", g->eta, "Topic-word Dirichlet parameter")->capture_default_str();
  c->add_option("--seed", g->seed, "Random seed")->capture_default_str();
  c->add_option("--out", g->out, "Corpus file to write (CSR)")->required();
  c->add_option("--truth", g->truth, "Also write the true topics (/topic_word) here");
  c->add_option("--heldout", g->heldout, "Also write a held-out corpus from the same topics");
  c->add_option("--heldout-docs", g->heldout_docs, "Documents in the held-out corpus");
  c->callback([&ctx, g] {
    ctx.action = [&ctx, g] {
      lda::generate(*ctx.comm, *g);
      print_progress(ctx, "wrote " + g->out);
      nlohmann::ordered_json j;
      j["out"] = g->out;
      j["docs"] = g->docs;
      j["words"] = g->words;
      j["topics"] = g->topics;
      print_summary(ctx, j);
    };
  });
}

}  // namespace caviar::app
