// Distributed LDA: results must not depend on the number of ranks (bit for bit), the corpus is
// balanced by tokens, and bad corpora fail with one clear error on every rank. Each test compares
// the run on all ranks of COMM_WORLD with the same run on rank 0 alone (COMM_SELF); the binary
// is registered at P = 1, 2 and 4.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "comm/comm.hpp"
#include "core/error.hpp"
#include "inference/lda_driver.hpp"
#include "io/csr.hpp"
#include "io/h5.hpp"
#include "prep/generate_lda.hpp"

namespace caviar {
namespace {

const Comm& world() {
  static const Comm c = Comm::world();
  return c;
}

std::string tmp(const std::string& name) {
  return std::string(CAVIAR_TEST_TMPDIR) + "/lda_np" + std::to_string(world().size()) + "_" + name;
}

lda::GenerateOptions corpus_options() {
  lda::GenerateOptions g;
  g.docs = 1500;  // 6 blocks of 256 documents, so 4 ranks all get some
  g.words = 300;
  g.topics = 6;
  g.doc_length = 60;
  g.seed = 5;
  return g;
}

const std::string& corpus() {
  static const std::string path = [] {
    auto g = corpus_options();
    g.out = tmp("corpus.h5");
    g.heldout = tmp("heldout.h5");
    g.heldout_docs = 300;
    lda::generate(world(), g);
    return g.out;
  }();
  return path;
}

TEST(LdaMpi, GeneratedCorpusIsIdenticalForAnyRankCount) {
  const std::string a = corpus();
  if (world().is_root()) {
    auto g = corpus_options();
    g.out = tmp("corpus_self.h5");
    lda::generate(Comm::self(), g);
    io::FileReader ra(a), rb(g.out);
    for (const char* name : {"/indptr", "/indices", "/data"})
      EXPECT_EQ(ra.read(name), rb.read(name)) << name;
    EXPECT_EQ(ra.read_strings("/vocab"), rb.read_strings("/vocab"));
  }
  world().barrier();
}

TEST(LdaMpi, ShardsAreBalancedByEntries) {
  io::CorpusInfo info;
  const Corpus c = io::read_corpus(world(), io::DataRef::parse(corpus(), "/"), &info);
  EXPECT_EQ(info.n_docs, 1500);
  EXPECT_EQ(info.n_words, 300);
  // Contiguous ranges that tile the corpus.
  const auto begins = world().allgather(c.doc_begin);
  const auto counts = world().allgather(c.n_docs());
  std::int64_t next = 0;
  for (int r = 0; r < world().size(); ++r) {
    if (counts[r] == 0) continue;
    EXPECT_EQ(begins[r], next);
    next = begins[r] + counts[r];
  }
  EXPECT_EQ(next, 1500);
  // Every rank holds about E / P entries (the E-step's cost): within one document's entries.
  const auto entries = world().allgather(c.nnz());
  std::int64_t total_entries = 0, max_doc = 0;
  for (auto e : entries) total_entries += e;
  for (std::int64_t d = 0; d < c.n_docs(); ++d)
    max_doc = std::max(max_doc, c.indptr[d + 1] - c.indptr[d]);
  max_doc = world().allreduce_max(max_doc);
  EXPECT_LE(
      std::abs(static_cast<double>(c.nnz()) - static_cast<double>(total_entries) / world().size()),
      static_cast<double>(max_doc));
  // And so about T / P tokens on this corpus: within one 256-document block (256 x 60 tokens).
  const double mine = c.tokens();
  const auto all = world().allgather(mine);
  double total = 0;
  for (double t : all) total += t;
  EXPECT_EQ(total, info.tokens);
  EXPECT_LT(std::abs(mine - total / world().size()), 256 * 60 * 1.6);
}

std::vector<double> components(const std::string& file) {
  io::FileReader r(file);
  return r.read("/components");
}

lda::FitOptions fit_options(const std::string& algorithm, bool stream) {
  lda::FitOptions o;
  o.data = corpus();
  o.topics = 6;
  o.algorithm = algorithm;
  o.max_iter = algorithm == "svi" ? 3 : 15;  // passes or iterations
  o.tol = 0;
  o.batch_size = 200;
  o.seed = 9;
  o.heldout = tmp("heldout.h5");
  o.stream = stream;
  o.stream_piece_docs = 100;  // several pieces per rank, and unequal counts over ranks
  return o;
}

void expect_same_fit(const std::string& algorithm, bool stream = false) {
  lda::FitOptions o = fit_options(algorithm, stream);
  const std::string name = algorithm + (stream ? "_stream" : "");
  o.out = tmp("fit_" + name + "_world.h5");
  const auto rw = lda::fit(world(), o, nullptr);
  if (world().is_root()) {
    o.out = tmp("fit_" + name + "_self.h5");
    const auto rs = lda::fit(Comm::self(), o, nullptr);
    // Bit for bit: the statistics are summed as integers.
    EXPECT_EQ(components(tmp("fit_" + name + "_world.h5")), components(o.out));
    EXPECT_EQ(rw.tokens, rs.tokens);
    EXPECT_EQ(rw.run.trace.objective, rs.run.trace.objective);
    EXPECT_EQ(rw.run.trace.heldout, rs.run.trace.heldout);
    EXPECT_EQ(rw.sweeps, rs.sweeps);
  }
  world().barrier();
  const auto sw = lda::score(world(), tmp("fit_" + name + "_world.h5"), tmp("heldout.h5"), {});
  EXPECT_EQ(sw.perplexity, rw.run.trace.heldout.back());
  EXPECT_LT(sw.perplexity, 300.0);  // far better than the uniform model
}

TEST(LdaMpi, CaviIsRankInvariant) {
  expect_same_fit("cavi");
}
TEST(LdaMpi, SviIsRankInvariant) {
  expect_same_fit("svi");
}
TEST(LdaMpi, StreamedSviIsRankInvariant) {
  expect_same_fit("svi", true);
}

TEST(LdaMpi, StreamedCaviIsRankInvariant) {
  expect_same_fit("cavi", true);
}

// --stream CAVI reads the documents anew every iteration and keeps only the gammas: the fit is
// the in-memory one, bit for bit.
TEST(LdaMpi, StreamedCaviEqualsInMemory) {
  lda::FitOptions o = fit_options("cavi", false);
  o.out = tmp("cavi_memory.h5");
  const auto a = lda::fit(world(), o, nullptr);
  o.stream = true;
  o.out = tmp("cavi_stream.h5");
  const auto b = lda::fit(world(), o, nullptr);
  EXPECT_EQ(a.run.trace.objective, b.run.trace.objective);
  EXPECT_EQ(a.run.trace.heldout, b.run.trace.heldout);
  EXPECT_EQ(a.sweeps, b.sweeps);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_GT(a.run.trace.objective.size(), 5u);
  if (world().is_root()) {
    EXPECT_EQ(components(tmp("cavi_memory.h5")), components(o.out));
  }
  world().barrier();
}

TEST(LdaMpi, AllreduceOrIsTheUnion) {
  std::vector<std::uint64_t> bits(3, 0);
  bits[static_cast<std::size_t>(world().rank() % 3)] |= std::uint64_t{1} << world().rank();
  world().allreduce_or(bits);
  std::vector<std::uint64_t> want(3, 0);
  for (int r = 0; r < world().size(); ++r)
    want[static_cast<std::size_t>(r % 3)] |= std::uint64_t{1} << r;
  EXPECT_EQ(bits, want);
}

TEST(LdaMpi, ExportImportRoundTrip) {
  const std::string model = tmp("fit_svi_world.h5"), ex = tmp("export.h5"), im = tmp("import.h5");
  lda::export_topics(world(), model, ex);
  lda::import_topics(world(), ex, std::nullopt, std::nullopt, "", im, "test");
  if (world().is_root()) {
    EXPECT_EQ(components(model), components(im));
    io::FileReader r(im);
    EXPECT_EQ(r.read_strings("/vocab").size(), 300u);
  }
  const auto a = lda::score(world(), model, tmp("heldout.h5"), {});
  const auto b = lda::score(world(), im, tmp("heldout.h5"), {});
  EXPECT_EQ(a.perplexity, b.perplexity);
}

// Writes a small CSR corpus (rank 0) for the bad-input cases.
void write_csr(const std::string& path, const std::vector<std::int64_t>& indptr,
               const std::vector<std::int64_t>& indices, const std::vector<double>& data,
               int n_words) {
  if (world().is_root()) {
    io::FileWriter w(path);
    w.write("indptr", indptr, {indptr.size()});
    w.write("indices", indices, {indices.size()});
    w.write("data", data, {data.size()});
    std::vector<std::string> vocab;
    for (int i = 0; i < n_words; ++i) vocab.push_back("v" + std::to_string(i));
    w.write_strings("vocab", vocab);
    w.commit();
  }
  world().barrier();
}

void expect_error(const std::string& file, const std::string& fragment) {
  lda::FitOptions o;
  o.data = file;
  o.topics = 2;
  o.algorithm = "cavi";
  o.max_iter = 2;
  o.out = file + ".model.h5";
  std::string what;
  try {
    lda::fit(world(), o, nullptr);
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find(fragment), std::string::npos) << "got: '" << what << "'";
  // Nothing written.
  EXPECT_FALSE(std::filesystem::exists(o.out));
  EXPECT_FALSE(std::filesystem::exists(o.out + ".tmp-caviar"));
  // The same message on every rank.
  std::string root = what;
  world().broadcast(root, 0);
  EXPECT_EQ(what, root);
}

TEST(LdaMpi, BadCorporaFailOnEveryRank) {
  const std::vector<std::int64_t> ptr{0, 2, 3, 5};
  const std::vector<std::int64_t> idx{0, 1, 2, 0, 3};
  write_csr(tmp("neg.h5"), ptr, idx, {1, 2, -1, 1, 1}, 4);
  expect_error(tmp("neg.h5"), "/data[2] = -1 (document 1) is negative");
  write_csr(tmp("frac.h5"), ptr, idx, {1, 2, 1, 0.5, 1}, 4);
  expect_error(tmp("frac.h5"), "/data[3] = 0.5 (document 2) is not an integer");
  write_csr(tmp("range.h5"), ptr, {0, 1, 2, 0, 4}, {1, 1, 1, 1, 1}, 4);
  expect_error(tmp("range.h5"), "/indices[4] = 4 (document 2) is outside the vocabulary [0, 4)");
  write_csr(tmp("mono.h5"), {0, 3, 2, 5}, idx, {1, 1, 1, 1, 1}, 4);
  expect_error(tmp("mono.h5"), "/indptr is not monotone: indptr[2] = 2 < indptr[1] = 3");
  write_csr(tmp("len.h5"), ptr, idx, {1, 1, 1, 1}, 4);
  expect_error(tmp("len.h5"), "/indices has 5 entries but");
  write_csr(tmp("end.h5"), {0, 2, 3, 4}, idx, {1, 1, 1, 1, 1}, 4);
  expect_error(tmp("end.h5"), "/indptr ends at 4");
  expect_error(tmp("missing.h5"), "cannot open");
}

TEST(LdaMpi, EmptyDocumentsAreAllowed) {
  // Documents 1 and 3 are empty.
  write_csr(tmp("empty.h5"), {0, 2, 2, 4, 4, 5}, {0, 1, 2, 3, 1}, {3, 1, 2, 2, 1}, 4);
  lda::FitOptions o;
  o.data = tmp("empty.h5");
  o.topics = 2;
  o.algorithm = "cavi";
  o.max_iter = 5;
  const auto r = lda::fit(world(), o, nullptr);
  EXPECT_EQ(r.documents, 5);
  EXPECT_EQ(r.tokens, 9);
  EXPECT_TRUE(std::isfinite(r.elbo()));
}

}  // namespace
}  // namespace caviar
