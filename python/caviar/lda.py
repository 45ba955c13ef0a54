"""Latent Dirichlet allocation fitted by ``caviar lda fit``, with scikit-learn's interface.

``fit`` writes the document-word counts as a CSR corpus (caviar's file layout, that of
scipy.sparse) to a temporary HDF5 file, or takes the name of one, runs caviar and reads lambda
(``components_``) back. caviar has no command that returns the topic proportions of new
documents, so ``transform``, ``perplexity`` and ``score`` are computed here with NumPy/SciPy by
scikit-learn's formulas (the document fixed point from gamma = 1, then its bound).
"""

import numbers
import os

import numpy as np
import scipy.sparse as sp
from scipy.special import gammaln, logsumexp, psi

from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted, check_non_negative

from . import _runner
from .mixture import _attr, _check_launch, _not_implemented, _seed, _validate_data

try:  # scikit-learn >= 1.2
    from sklearn.decomposition._lda import LatentDirichletAllocation as _SkLDA
    _LDA_CONSTRAINTS = dict(getattr(_SkLDA, "_parameter_constraints", {}))
except ImportError:  # pragma: no cover
    _LDA_CONSTRAINTS = {}

EPS = np.finfo(float).eps
_DOC_BLOCK = 4096  # documents per block of the NumPy document fixed point


def _dirichlet_expectation(a):
    """E[ln x] for x ~ Dir(a), row by row."""
    return psi(a) - psi(np.sum(a, axis=1))[:, None]


def _write_corpus(path, X):
    """caviar's corpus layout: /indptr (int64), /indices, /data, attribute shape = [D, V]."""
    import h5py
    X = sp.csr_matrix(X)
    X.sum_duplicates()
    with h5py.File(path, "w") as f:
        f["indptr"] = X.indptr.astype(np.int64)
        f["indices"] = X.indices.astype(np.int64)
        f["data"] = np.asarray(X.data, dtype=np.float64)
        f.attrs["shape"] = np.array(X.shape, dtype=np.int64)


def _corpus_shape(ref):
    """(documents, vocabulary size) of the corpus named by ref (metadata only)."""
    import h5py
    fname, group = _runner.split_ref(ref, "/")
    with h5py.File(fname, "r") as f:
        if group not in f or "indptr" not in f[group]:
            raise ValueError("no corpus (indptr, indices, data) at '%s' in '%s'" % (group, fname))
        g = f[group]
        n_docs = g["indptr"].shape[0] - 1
        if "vocab" in g:
            return n_docs, g["vocab"].shape[0]
        if "shape" in g.attrs:
            return n_docs, int(g.attrs["shape"][1])
        raise ValueError("%s:%s has neither a vocab dataset nor a shape attribute"
                         % (fname, group))


def _corpus_blocks(ref, n_words, block=_DOC_BLOCK):
    """Yields CSR blocks of `block` documents of the corpus named by ref."""
    import h5py
    fname, group = _runner.split_ref(ref, "/")
    with h5py.File(fname, "r") as f:
        g = f[group]
        indptr = g["indptr"][...].astype(np.int64)
        for d0 in range(0, len(indptr) - 1, block):
            d1 = min(d0 + block, len(indptr) - 1)
            a, b = indptr[d0], indptr[d1]
            yield sp.csr_matrix((np.asarray(g["data"][a:b], dtype=np.float64),
                                 np.asarray(g["indices"][a:b], dtype=np.int64),
                                 indptr[d0:d1 + 1] - a), shape=(d1 - d0, n_words))


class LatentDirichletAllocation(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """LDA by variational Bayes in caviar: batch (CAVI) or online (SVI, Hoffman et al. 2010).

    The parameters are scikit-learn's, mapped to ``caviar lda fit``: n_components (--topics),
    doc_topic_prior (--alpha), topic_word_prior (--eta), learning_method 'batch' (cavi) or
    'online' (svi), learning_decay (--kappa, caviar needs (0.5, 1]), learning_offset
    (--tau0 learning_offset + 1: the same step sizes rho_t),
    max_iter (--max-iter: iterations, or passes when online), batch_size (--batch-size),
    mean_change_tol (--doc-tol), max_doc_update_iter (--doc-max-iter), random_state (--seed).
    Differences:

    - X must hold integer counts (caviar refuses other values with its one-line error).
    - Online: caviar draws each pass's minibatches at random (from random_state); scikit-learn
      takes them in order.
    - evaluate_every > 0 (perplexity-based stopping, perp_tol) raises NotImplementedError; use
      tol, caviar's relative tolerance on the ELBO of an iteration (batch) or of a pass
      (online) (default 0: run max_iter of them, which is what scikit-learn does with
      evaluate_every <= 0).
    - n_jobs (not None) raises NotImplementedError: use n_ranks and n_threads.
    - There is no partial_fit (fit with learning_method='online' runs caviar's SVI over the
      whole corpus). total_samples is therefore not used (only scikit-learn's partial_fit
      reads it).
    - verbose > 0 prints caviar's progress lines.

    caviar's own parameters: tol, n_ranks, n_threads, caviar_bin, mpirun, stream (as in
    caviar.BayesianGaussianMixture).

    Fitted attributes: components_ (lambda, n_components x n_features),
    exp_dirichlet_component_, doc_topic_prior_, topic_word_prior_, n_iter_, n_batch_iter_,
    bound_ (exp(-ELBO / tokens) of the training corpus, from caviar's final ELBO: scikit-learn
    recomputes the documents' gammas from 1 for it), elbo_trace_, n_features_in_,
    caviar_summary_.

    transform, perplexity and score follow scikit-learn: each document's gamma starts at 1 and
    is iterated until its mean change is below mean_change_tol (at most max_doc_update_iter
    sweeps); perplexity = exp(-bound / tokens) of that fixed point. caviar's own held-out
    estimator (`caviar lda score`, document completion) is a different quantity.
    """

    _parameter_constraints = dict(_LDA_CONSTRAINTS)

    def __init__(self, n_components=10, *, doc_topic_prior=None, topic_word_prior=None,
                 learning_method="batch", learning_decay=0.7, learning_offset=10.0, max_iter=10,
                 batch_size=128, evaluate_every=-1, total_samples=1e6, perp_tol=1e-1,
                 mean_change_tol=1e-3, max_doc_update_iter=100, n_jobs=None, verbose=0,
                 random_state=None, tol=0.0, n_ranks=1, n_threads=None, caviar_bin=None,
                 mpirun=None, stream=False):
        self.n_components = n_components
        self.doc_topic_prior = doc_topic_prior
        self.topic_word_prior = topic_word_prior
        self.learning_method = learning_method
        self.learning_decay = learning_decay
        self.learning_offset = learning_offset
        self.max_iter = max_iter
        self.batch_size = batch_size
        self.evaluate_every = evaluate_every
        self.total_samples = total_samples
        self.perp_tol = perp_tol
        self.mean_change_tol = mean_change_tol
        self.max_doc_update_iter = max_doc_update_iter
        self.n_jobs = n_jobs
        self.verbose = verbose
        self.random_state = random_state
        self.tol = tol
        self.n_ranks = n_ranks
        self.n_threads = n_threads
        self.caviar_bin = caviar_bin
        self.mpirun = mpirun
        self.stream = stream

    def _more_tags(self):
        return {"preserves_dtype": [np.float64], "requires_positive_X": True}

    def _check_params(self):
        if hasattr(self, "_validate_params"):
            self._validate_params()
        if self.evaluate_every is not None and self.evaluate_every > 0:
            raise _not_implemented(
                "evaluate_every > 0 (stopping on the change of the perplexity, perp_tol)",
                "caviar's batch fit stops on the relative ELBO change: set tol")
        if self.n_jobs is not None:
            raise _not_implemented(
                "n_jobs (joblib workers)",
                "caviar runs n_ranks MPI processes of n_threads OpenMP threads each")
        _check_launch(self)
        if not (isinstance(self.tol, numbers.Real) and self.tol >= 0):
            raise ValueError("tol must be a number >= 0, got %r" % (self.tol,))

    def _check_X(self, X, reset, whom):
        X = _validate_data(self, X, reset=reset, accept_sparse="csr",
                           dtype=[np.float64, np.float32])
        check_non_negative(X, whom)
        return X

    def fit(self, X, y=None):
        """Fit the topics with caviar. X is a document-word count matrix (dense or sparse), or
        the name of a caviar corpus file, "corpus.h5" or "corpus.h5:/group". Returns self."""
        self._check_params()
        with _runner.Workdir() as wd:
            if _runner.is_data_ref(X):
                # caviar opens and checks the corpus itself (its errors are the ones raised).
                ref = os.fsdecode(os.fspath(X))
                if hasattr(self, "feature_names_in_"):
                    del self.feature_names_in_
            else:
                Xc = self._check_X(X, True, "LatentDirichletAllocation.fit")
                ref = wd.file("corpus.h5")
                _write_corpus(ref, Xc)
            model = wd.file("lda.h5")
            online = self.learning_method == "online"
            args = ["lda", "fit", "--data", ref, "--topics", self.n_components,
                    "--algorithm", "svi" if online else "cavi",
                    # scikit-learn's first step has rho = (learning_offset + 1)^-decay (its
                    # step count starts at 1), caviar's (tau0 + 0)^-kappa.
                    "--batch-size", self.batch_size,
                    "--tau0", repr(float(self.learning_offset) + 1.0),
                    "--kappa", repr(float(self.learning_decay)),
                    "--doc-tol", repr(float(self.mean_change_tol)),
                    "--doc-max-iter", self.max_doc_update_iter,
                    "--seed", _seed(self.random_state), "--out", model]
            args += ["--max-iter", self.max_iter, "--tol", repr(float(self.tol))]
            if self.doc_topic_prior is not None:
                args += ["--alpha", repr(float(self.doc_topic_prior))]
            if self.topic_word_prior is not None:
                args += ["--eta", repr(float(self.topic_word_prior))]
            if self.stream:
                args.append("--stream")
            summary = _runner.run(args, caviar_bin=self.caviar_bin, n_ranks=self.n_ranks,
                                  n_threads=self.n_threads, mpirun=self.mpirun,
                                  verbose=self.verbose)
            import h5py
            with h5py.File(model, "r") as f:
                attrs = dict(f.attrs)
                self.components_ = f["components"][...]
                self.elbo_trace_ = f["trace/elbo"][...]
        self.n_features_in_ = self.components_.shape[1]
        self.doc_topic_prior_ = float(_attr(attrs, "alpha"))
        self.topic_word_prior_ = float(_attr(attrs, "eta"))
        self.n_iter_ = int(_attr(attrs, "n_iter"))
        n_docs = int(summary.get("documents", 0))
        # As scikit-learn: one more than the number of updates (its count starts at 1).
        self.n_batch_iter_ = 1 + (self.n_iter_ * -(-n_docs // int(self.batch_size)) if online
                                  else self.n_iter_)
        self.exp_dirichlet_component_ = np.exp(_dirichlet_expectation(self.components_))
        tokens = float(summary.get("tokens", 0.0))
        elbo = float(_attr(attrs, "elbo"))
        self.bound_ = float(np.exp(-elbo / tokens)) if tokens > 0 else np.nan
        self.caviar_summary_ = summary
        return self

    @property
    def _n_features_out(self):
        return self.components_.shape[0]

    # ---------------------------------------------------------------- the document step
    def _blocks(self, X, whom):
        check_is_fitted(self)
        if _runner.is_data_ref(X):
            n_docs, n_words = _corpus_shape(X)
            if n_words != self.n_features_in_:
                raise ValueError("X has %d features, but LatentDirichletAllocation is expecting "
                                 "%d features as input." % (n_words, self.n_features_in_))
            yield from _corpus_blocks(X, n_words)
        else:
            X = sp.csr_matrix(self._check_X(X, False, whom), dtype=np.float64)
            for d0 in range(0, X.shape[0], _DOC_BLOCK):
                yield X[d0:d0 + _DOC_BLOCK]

    def _gamma(self, X):
        """Unnormalised gamma of each document of the CSR block X: the fixed point of Blei et
        al. (2003) eqs. (6)-(7) from gamma = 1, each document stopping when the mean change of
        its gamma is below mean_change_tol (as scikit-learn's transform)."""
        n, K = X.shape[0], self.n_components
        alpha, beb = self.doc_topic_prior_, self.exp_dirichlet_component_
        gamma = np.ones((n, K))
        et = np.exp(_dirichlet_expectation(gamma))
        active = np.arange(n)
        for _ in range(self.max_doc_update_iter):
            if active.size == 0:
                break
            Xa = X[active]
            rows = np.repeat(np.arange(active.size), np.diff(Xa.indptr))
            norm_phi = np.einsum("jk,kj->j", et[active][rows], beb[:, Xa.indices]) + EPS
            ratio = sp.csr_matrix((Xa.data / norm_phi, Xa.indices, Xa.indptr), shape=Xa.shape)
            new = et[active] * (ratio @ beb.T) + alpha
            change = np.mean(np.abs(new - gamma[active]), axis=1)
            gamma[active] = new
            et[active] = np.exp(_dirichlet_expectation(new))
            active = active[change >= self.mean_change_tol]
        return gamma

    def _bound_docs(self, X, gamma):
        """The documents' part of scikit-learn's _approx_bound: E[ln p(w | theta, beta)] +
        E[ln p(theta | alpha)] - E[ln q(theta | gamma)]."""
        elog_theta = _dirichlet_expectation(gamma)
        elog_beta = _dirichlet_expectation(self.components_)
        rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
        temp = elog_theta[rows] + elog_beta[:, X.indices].T  # nnz x K
        score = float(np.dot(X.data, logsumexp(temp, axis=1)))
        a, K = self.doc_topic_prior_, self.n_components
        score += np.sum((a - gamma) * elog_theta)
        score += np.sum(gammaln(gamma) - gammaln(a))
        score += np.sum(gammaln(a * K) - gammaln(np.sum(gamma, 1)))
        return score

    def _bound_topics(self):
        lam, eta, V = self.components_, self.topic_word_prior_, self.components_.shape[1]
        elog_beta = _dirichlet_expectation(lam)
        return float(np.sum((eta - lam) * elog_beta) + np.sum(gammaln(lam) - gammaln(eta))
                     + np.sum(gammaln(eta * V) - gammaln(np.sum(lam, 1))))

    def _unnormalized_transform(self, X):
        return np.vstack([self._gamma(b) for b in self._blocks(X, "LatentDirichletAllocation"
                                                                    ".transform")])

    def transform(self, X):
        """Topic proportions of each document (normalised gamma), n_samples x n_components."""
        gamma = self._unnormalized_transform(X)
        return gamma / gamma.sum(axis=1)[:, None]

    def _bound(self, X, whom):
        score, words = 0.0, 0.0
        for b in self._blocks(X, whom):
            score += self._bound_docs(b, self._gamma(b))
            words += float(b.data.sum())
        return score + self._bound_topics(), words

    def score(self, X, y=None):
        """scikit-learn's approximate log-likelihood: the variational bound of X."""
        return self._bound(X, "LatentDirichletAllocation.score")[0]

    def perplexity(self, X, sub_sampling=False):
        """exp(-bound / word count), as scikit-learn."""
        if sub_sampling:
            raise _not_implemented("perplexity(sub_sampling=True)", "use sub_sampling=False")
        bound, words = self._bound(X, "LatentDirichletAllocation.perplexity")
        return float(np.exp(-bound / words))
