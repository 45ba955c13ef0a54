"""HDF5 input of the plotting scripts (plot_gmm.py, plot_hmm.py), which import it from their own
directory: dataset specs and file opening, with one-line errors raised as UserError; and the
atomic PNG output of plot_compare.py and plot_gibbs_summary.py."""
import os


class UserError(Exception):
    """A bad input; the script prints it as one line and exits non-zero."""


def split_spec(spec, default_path=None, what="--data"):
    """'file.h5:/path' -> (file, '/path'); the split is at the last ':/'. A bare file gets
    default_path, or is an error where there is none."""
    idx = spec.rfind(":/")
    if idx < 0:
        if default_path is None:
            raise UserError("%s expects FILE.h5:/dataset, got %r" % (what, spec))
        return spec, default_path
    return spec[:idx], spec[idx + 1:]


def open_h5(fname, what):
    import h5py
    if not os.path.exists(fname):
        raise UserError("%s file not found: %s" % (what, fname))
    try:
        return h5py.File(fname, "r")
    except OSError as e:
        raise UserError("cannot open %s file %s as HDF5: %s" % (what, fname, e))


def table_args(doc):
    """The command line every script run by caviar's render_png takes, `SCRIPT TABLE --png PNG`:
    returns (the JSON table read, the parsed arguments: .table, .png)."""
    import argparse
    import json
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("table")
    p.add_argument("--png", required=True)
    a = p.parse_args()
    with open(a.table) as f:
        return json.load(f), a


def save_png(fig, png):
    """Writes the figure to png atomically: a temporary file beside it, renamed over it, so that
    a failed or interrupted run leaves no half-written PNG."""
    tmp = png + ".tmp-caviar.png"
    try:
        fig.savefig(tmp, dpi=100, format="png")
        os.replace(tmp, png)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
