#include "engine/compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>

#include "core/error.hpp"
#include "core/scripts.hpp"
#include "io/h5.hpp"

namespace caviar::engine {

namespace {

// Where each fit records its final objective. The engine writes its Provenance::objective_name
// ("objective" by default, "elbo" for LDA); the GMM writes "elbo" (variational) or
// "log_likelihood" (EM).
constexpr const char* kObjectiveAttrs[] = {"elbo", "log_likelihood", "objective"};
// Held-out scores: the GMM's final value as an attribute; the engine's models a trace per
// evaluation (Provenance::heldout_name), of which the last entry is the final model's.
constexpr const char* kHeldoutAttrs[] = {"heldout_score"};
constexpr const char* kHeldoutTraces[] = {"heldout", "perplexity"};
// K: the models that record it as an attribute; otherwise the length of /weights (the GMM).
constexpr const char* kCountAttrs[] = {"n_components", "n_topics", "n_states"};

// "a gmm", "an lda", "an hmm": the article as the model name is read aloud.
std::string a_model(const std::string& model) {
  const bool vowel_sound =
      !model.empty() && std::string("aefhilmnorsx").find(model[0]) != std::string::npos;
  return (vowel_sound ? "an " : "a ") + model + " model";
}

std::string format_double(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.10g", v);
  return b;
}

nlohmann::ordered_json to_json(const FitSummary& s) {
  nlohmann::ordered_json j;
  j["file"] = s.file;
  j["model"] = s.model;
  j["k"] = s.k;
  j["algorithm"] = s.algorithm;
  j["seed"] = s.seed ? nlohmann::ordered_json(*s.seed) : nlohmann::ordered_json();
  j["objective_name"] = s.objective_name;
  j["objective"] = s.objective;
  j["heldout_name"] = s.heldout_name;
  j["heldout"] = s.heldout ? nlohmann::ordered_json(*s.heldout) : nlohmann::ordered_json();
  j["effective"] = s.effective ? nlohmann::ordered_json(*s.effective) : nlohmann::ordered_json();
  j["iterations"] = s.iterations ? nlohmann::ordered_json(*s.iterations) : nlohmann::ordered_json();
  j["converged"] = s.converged ? nlohmann::ordered_json(*s.converged) : nlohmann::ordered_json();
  return j;
}

// Rank 0: the table as JSON for scripts/plot_compare.py, which draws the PNG (atomically).
void render_plot(const std::vector<FitSummary>& rows, const std::string& png) {
  nlohmann::ordered_json j;
  j["fits"] = nlohmann::ordered_json::array();
  for (const auto& s : rows) j["fits"].push_back(to_json(s));
  render_png("plot_compare.py", j.dump(), png);
}

}  // namespace

FitSummary read_fit_summary(const std::string& file, const std::string& model) {
  io::FileReader r(file);  // names a missing file or one that is not HDF5
  FitSummary s;
  s.file = file;
  if (r.has_attr("checkpoint"))
    throw Error("'" + file +
                "' is a checkpoint, not a fitted model (give the --out file of a fit)");
  if (!r.has_attr("model"))
    throw Error("'" + file + "' is not a caviar model file (no 'model' attribute)");
  s.model = r.read_string_attr("model");
  if (s.model != model)
    throw Error("'" + file + "' is " + a_model(s.model) + ", not " + a_model(model) +
                " (compare fits of one kind: caviar " + s.model + " compare)");
  for (const char* a : kObjectiveAttrs)
    if (r.has_attr(a)) {
      s.objective_name = a;
      s.objective = r.read_double_attr(a);
      break;
    }
  if (s.objective_name.empty())
    throw Error("'" + file +
                "' records no final objective (attribute elbo, log_likelihood or objective): "
                "not the --out file of a fit");
  for (const char* a : kHeldoutAttrs)
    if (!s.heldout && r.has_attr(a)) {
      s.heldout_name = a;
      s.heldout = r.read_double_attr(a);
    }
  for (const char* t : kHeldoutTraces) {
    const std::string path = std::string("/trace/") + t;
    if (s.heldout || !r.has(path)) continue;
    const auto v = r.read(path);
    // The last evaluation is that of the final model; NaN marks iterations without one.
    for (auto it = v.rbegin(); it != v.rend(); ++it)
      if (std::isfinite(*it)) {
        s.heldout_name = t;
        s.heldout = *it;
        break;
      }
  }
  for (const char* a : kCountAttrs)
    if (r.has_attr(a)) {
      s.k = static_cast<std::int64_t>(r.read_double_attr(a));
      break;
    }
  std::vector<double> weights;
  if (r.has("/weights")) weights = r.read("/weights");
  if (s.k == 0) s.k = static_cast<std::int64_t>(weights.size());
  if (s.k <= 0) throw Error("'" + file + "' records no number of components");
  if (!weights.empty()) {
    if (static_cast<std::int64_t>(weights.size()) != s.k)
      throw Error("'" + file + "': /weights has " + std::to_string(weights.size()) +
                  " entries for K = " + std::to_string(s.k));
    const double threshold = kEffectiveShare / static_cast<double>(s.k);
    s.effective = std::count_if(weights.begin(), weights.end(),
                                [threshold](double w) { return w >= threshold; });
  }
  if (r.has_attr("algorithm")) s.algorithm = r.read_string_attr("algorithm");
  // SVI fits differ by their step-size schedule as much as by their seed.
  if (s.algorithm == "svi" && r.has_attr("schedule"))
    s.algorithm += "/" + r.read_string_attr("schedule");
  if (r.has_attr("seed")) s.seed = static_cast<std::int64_t>(r.read_double_attr("seed"));
  if (r.has_attr("n_iter")) s.iterations = static_cast<std::int64_t>(r.read_double_attr("n_iter"));
  if (r.has_attr("converged")) s.converged = r.read_double_attr("converged") != 0;
  return s;
}

std::vector<FitSummary> read_fit_summaries(const std::vector<std::string>& files,
                                           const std::string& model) {
  std::vector<FitSummary> rows;
  for (const auto& f : files) rows.push_back(read_fit_summary(f, model));
  for (const auto& s : rows) {
    // One column, one quantity: a table (or plot) that mixed them would rank fits wrongly.
    if (s.objective_name != rows.front().objective_name)
      throw Error("'" + rows.front().file + "' records " + rows.front().objective_name + " but '" +
                  s.file + "' records " + s.objective_name +
                  ": compare fits of one kind (EM or variational)");
    if (s.heldout && rows.front().heldout && s.heldout_name != rows.front().heldout_name)
      throw Error("'" + rows.front().file + "' records held-out " + rows.front().heldout_name +
                  " but '" + s.file + "' records " + s.heldout_name);
  }
  std::stable_sort(rows.begin(), rows.end(), [](const FitSummary& a, const FitSummary& b) {
    const auto sa = a.seed.value_or(-1), sb = b.seed.value_or(-1);
    if (a.k != b.k) return a.k < b.k;
    if (sa != sb) return sa < sb;
    return a.file < b.file;
  });
  return rows;
}

std::string format_table(const std::vector<FitSummary>& rows) {
  std::string heldout_name;
  for (const auto& s : rows)
    if (s.heldout) heldout_name = s.heldout_name;
  const std::vector<std::string> head{"file",
                                      "K",
                                      "algorithm",
                                      "seed",
                                      rows.empty() ? "objective" : rows.front().objective_name,
                                      heldout_name.empty() ? "heldout" : heldout_name,
                                      "effective_K",
                                      "iterations",
                                      "converged"};
  std::vector<std::vector<std::string>> cells{head};
  auto opt = [](const auto& v) { return v ? std::to_string(*v) : std::string("-"); };
  for (const auto& s : rows)
    cells.push_back({s.file, std::to_string(s.k), s.algorithm.empty() ? "-" : s.algorithm,
                     opt(s.seed), format_double(s.objective),
                     s.heldout ? format_double(*s.heldout) : "-", opt(s.effective),
                     opt(s.iterations), s.converged ? (*s.converged ? "yes" : "no") : "-"});
  std::vector<std::size_t> width(head.size(), 0);
  for (const auto& row : cells)
    for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  std::string out;
  for (const auto& row : cells) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      // The file name left-aligned, numbers right-aligned, two spaces between columns.
      const std::string pad(width[c] - row[c].size(), ' ');
      line += (c ? "  " : "") + (c == 0 ? row[c] + pad : pad + row[c]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + '\n';
  }
  return out;
}

void add_compare_command(CLI::App* group, Context& ctx, const std::string& model) {
  auto files = std::make_shared<std::vector<std::string>>();
  auto plot = std::make_shared<std::string>();
  auto* c = group->add_subcommand(
      "compare",
      "Compare fits (e.g. of a sweep over K): a table of K, final objective, held-out score and "
      "effective components per model file, and optionally a PNG against K");
  c->add_option("models", *files, "Model files written by `caviar " + model + " fit --out`")
      ->required();
  c->add_option("--plot", *plot,
                "PNG to write: the objective and the held-out score against K (two panels)");
  c->footer(
      "Rows are sorted by K, then seed. effective_K counts the components whose mixing weight is "
      "at least 0.01/K (1% of an equal share); '-' for models without mixing weights. The last "
      "line of stdout is the table as JSON.");
  c->callback([&ctx, files, plot, model] {
    ctx.action = [&ctx, files, plot, model] {
      if (!plot->empty()) io::check_output_path(*ctx.comm, *plot, *files);
      // The files are small: rank 0 reads them all, and its errors are every rank's.
      std::vector<FitSummary> rows;
      ctx.comm->on_root([&] {
        rows = read_fit_summaries(*files, model);
        if (!plot->empty()) render_plot(rows, *plot);
      });
      if (!ctx.comm->is_root()) return;
      std::cout << format_table(rows) << std::flush;
      if (!plot->empty()) print_progress(ctx, "wrote " + *plot);
      nlohmann::ordered_json j;
      j["fits"] = nlohmann::ordered_json::array();
      for (const auto& s : rows) j["fits"].push_back(to_json(s));
      j["effective_threshold"] = "weight >= " + format_double(kEffectiveShare) + "/K";
      if (!plot->empty()) j["plot"] = *plot;
      print_summary(ctx, j);
    };
  });
}

}  // namespace caviar::engine
