#include "engine/model_file.hpp"

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "engine/state_io.hpp"
#include "io/h5.hpp"

namespace caviar::engine {

void write_model_file(const Comm& comm, const std::string& out,
                      const std::function<void(StateWriter&)>& save, const RunResult& res,
                      const Provenance& p, const std::function<void(io::FileWriter&)>& extra) {
  comm.on_root([&] {
    io::FileWriter w(out);
    FileStateWriter sw(w);
    save(sw);
    const Trace& t = res.trace;
    w.write("trace/" + p.objective_name, t.objective, {t.objective.size()});
    w.write("trace/seconds", t.seconds, {t.seconds.size()});
    if (!t.heldout.empty()) w.write("trace/" + p.heldout_name, t.heldout, {t.heldout.size()});
    w.attr("model", p.model);
    w.attr("algorithm", p.algorithm);
    w.attr(p.objective_name, t.objective.empty() ? 0.0 : t.objective.back());
    w.attr("n_iter", static_cast<std::int64_t>(res.iterations));
    w.attr("converged", static_cast<std::int64_t>(res.converged));
    write_run_attrs(w, comm, p);
    if (extra) extra(w);
    w.commit();
  });
}

void write_run_attrs(io::FileWriter& w, const Comm& comm, const Provenance& p) {
  w.attr("ranks", static_cast<std::int64_t>(comm.size()));
  w.attr("threads", static_cast<std::int64_t>(max_threads()));
  w.attr("seed", static_cast<std::int64_t>(p.seed));
  w.attr("data", p.data);
  w.attr("version", p.version);
  w.attr("command", p.command);
}

void write_rows_file(const Comm& comm, const std::string& out, const RowState& s) {
  io::ParallelRowWriter w(comm, out);
  w.write_rows(s.name, s.global_rows, s.rows, s.data, {static_cast<std::uint64_t>(s.width)});
  w.commit();
}

void require_model_kind(const io::FileReader& r, const std::string& file, const std::string& kind) {
  if (!r.has_attr("model") || r.read_string_attr("model") != kind)
    throw Error("'" + file + "' is not a caviar " + kind + " model");
}

}  // namespace caviar::engine
