"""Gaussian mixtures fitted by the caviar binary, with scikit-learn's interface.

``fit`` runs ``caviar gmm fit`` (under ``mpirun -n n_ranks`` when n_ranks > 1) and reads the
model file it writes; ``predict``, ``predict_proba``, ``score_samples``, ``score`` and ``sample``
are computed here with NumPy from the fitted attributes, by the formulas of caviar's model
(scikit-learn's for GaussianMixture and for the variational full covariance; see
BayesianGaussianMixture for the others).
"""

import numbers
import os
import warnings

import numpy as np
from scipy import linalg
from scipy.special import digamma, logsumexp

from sklearn.base import BaseEstimator, DensityMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from . import _runner

try:  # scikit-learn >= 1.2: the estimators' own parameter constraints
    from sklearn.mixture._bayesian_mixture import BayesianGaussianMixture as _SkBGM
    from sklearn.mixture._gaussian_mixture import GaussianMixture as _SkGM
    _BGM_CONSTRAINTS = dict(getattr(_SkBGM, "_parameter_constraints", {}))
    _GM_CONSTRAINTS = dict(getattr(_SkGM, "_parameter_constraints", {}))
except ImportError:  # pragma: no cover
    _BGM_CONSTRAINTS, _GM_CONSTRAINTS = {}, {}

_COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")
_CONVERGENCE_MSG = ("Initialization 1 did not converge. Try different init parameters, or "
                    "increase max_iter, tol or check for degenerate data.")


def _validate_data(est, X, reset, **kw):
    try:  # scikit-learn >= 1.6
        from sklearn.utils.validation import validate_data
    except ImportError:
        return est._validate_data(X, reset=reset, **kw)
    return validate_data(est, X, reset=reset, **kw)


def _not_implemented(what, hint):
    return NotImplementedError("caviar does not implement %s yet; %s" % (what, hint))


def _seed(random_state):
    """caviar's --seed: an int random_state is used as is (so the same fit can be repeated with
    `caviar gmm fit --seed S`); None or a RandomState draws one, as scikit-learn would draw its
    randomness from them."""
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool):
        if random_state < 0:
            raise ValueError("random_state must be >= 0, got %d" % random_state)
        return int(random_state)
    return int(check_random_state(random_state).randint(np.iinfo(np.int32).max))


def _attr(attrs, key, default=None):
    v = attrs.get(key, default)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray) and v.size == 1:
        return v.reshape(()).item()
    if isinstance(v, np.generic):
        return v.item()
    return v


def _upper_precision_factor(cov):
    """The upper factor P of Sigma^-1 = P P^T, as scikit-learn computes it: (L^-1)^T with
    Sigma = L L^T."""
    chol = linalg.cholesky(cov, lower=True)
    return linalg.solve_triangular(chol, np.eye(len(cov)), lower=True).T


def _precisions_cholesky_from_covariances(covariances, covariance_type):
    """As scikit-learn: the upper factor P with precision = P P^T, one per component (full) or
    one shared (tied); diag and spherical: 1/sigma."""
    if covariance_type == "full":
        return np.stack([_upper_precision_factor(cov) for cov in covariances])
    if covariance_type == "tied":
        return _upper_precision_factor(covariances)
    return 1.0 / np.sqrt(covariances)


def _check_init_array(value, shape, name):
    """A given initial parameter as float64 of the expected shape (scikit-learn's message)."""
    a = np.asarray(value, dtype=np.float64)
    if a.shape != tuple(shape):
        raise ValueError("The parameter '%s' should have the shape of %s, but got %s"
                         % (name, tuple(shape), a.shape))
    if not np.all(np.isfinite(a)):
        raise ValueError("The parameter '%s' should be finite" % name)
    return a


def _check_init_weights(value, K):
    """weights_init: K proportions in [0, 1] that sum to 1 (scikit-learn's messages, whose
    range message names the minimum 'max value' and the maximum 'min value')."""
    w = _check_init_array(value, (K,), "weights")
    if np.any(w < 0.0) or np.any(w > 1.0):
        raise ValueError("The parameter 'weights' should be in the range [0, 1], but got max "
                         "value %.5f, min value %.5f" % (np.min(w), np.max(w)))
    if not np.allclose(np.abs(1.0 - np.sum(w)), 0.0):
        raise ValueError("The parameter 'weights' should be normalized, but got sum(weights) = "
                         "%.5f" % np.sum(w))
    return w


def _covariances_of_precisions(value, covariance_type, K, D):
    """precisions_init checked (scikit-learn's shapes and messages) and turned into the
    covariances of a model file in the fit's shape: full (K, D, D) and tied (D, D),
    Sigma = L^-T L^-1 from the Cholesky factor Lambda = L L^T; diag (K, D) and spherical (K,),
    1 / lambda."""
    name = "%s precision" % covariance_type
    if covariance_type in ("full", "tied"):
        shape = (K, D, D) if covariance_type == "full" else (D, D)
        prec = _check_init_array(value, shape, name)
        out = np.empty_like(prec)
        for lam, cov in zip(prec.reshape(-1, D, D), out.reshape(-1, D, D)):
            if not (np.allclose(lam, lam.T) and np.all(linalg.eigvalsh(lam) > 0.0)):
                raise ValueError("'%s' should be symmetric, positive-definite" % name)
            inv_l = linalg.solve_triangular(linalg.cholesky(lam, lower=True), np.eye(D),
                                            lower=True)
            cov[...] = inv_l.T @ inv_l
        return out
    prec = _check_init_array(value, (K, D) if covariance_type == "diag" else (K,), name)
    if np.any(prec <= 0.0):
        raise ValueError("'%s' should be positive" % name)
    return 1.0 / prec


def _precisions(prec_chol, covariance_type):
    if covariance_type == "full":
        return np.einsum("kij,klj->kil", prec_chol, prec_chol)
    if covariance_type == "tied":
        return prec_chol @ prec_chol.T
    return prec_chol ** 2


def _check_launch(est):
    """caviar's own parameters of every estimator."""
    if not (isinstance(est.n_ranks, numbers.Integral) and est.n_ranks >= 1):
        raise ValueError("n_ranks must be an int >= 1, got %r" % (est.n_ranks,))
    if est.n_threads is not None and not (
            isinstance(est.n_threads, numbers.Integral) and est.n_threads >= 1):
        raise ValueError("n_threads must be None or an int >= 1, got %r" % (est.n_threads,))


class _CaviarMixture(DensityMixin, BaseEstimator):
    """Shared by the two mixtures: parameter checks, the run, prediction."""

    _algorithms = ()

    # ------------------------------------------------------------------ checks
    def _check_caviar_params(self):
        if hasattr(self, "_validate_params"):
            self._validate_params()  # scikit-learn's own constraints and messages
        if self.covariance_type not in _COVARIANCE_TYPES:
            # scikit-learn < 1.2 has no _validate_params to refuse it first.
            raise ValueError("covariance_type must be one of %s, got %r"
                             % (", ".join(_COVARIANCE_TYPES), self.covariance_type))
        _check_launch(self)
        algorithm = getattr(self, "algorithm", "em")
        if algorithm not in self._algorithms:
            raise ValueError("algorithm must be one of %s, got %r"
                             % (", ".join(self._algorithms), algorithm))

    def _init_args(self, wd, n_rows):
        """--init for caviar, from init_resp (given responsibilities) or init_params."""
        if self.init_resp is not None:
            if _runner.is_data_ref(self.init_resp):
                return ["--init", os.fsdecode(self.init_resp)]
            resp = np.asarray(self.init_resp, dtype=np.float64)
            if resp.ndim != 2 or resp.shape[1] != self.n_components or (
                    n_rows is not None and resp.shape[0] != n_rows):
                raise ValueError("init_resp must be n_samples x n_components (%s x %d), got shape %s"
                                 % (n_rows, self.n_components, resp.shape))
            path = wd.file("resp.h5")
            _runner.write_matrix(path, resp, "resp")
            return ["--init", path + ":/resp"]
        if self.init_params == "kmeans":
            # scikit-learn runs KMeans(n_init=1) to convergence; caviar seeds by greedy
            # k-means++ and then takes 10 Lloyd steps: a similar start, not the same algorithm.
            return ["--init", "kmeans++"]
        if self.init_params == "k-means++":
            # scikit-learn gives the K seeds one-hot rows and every other row zero; caviar needs
            # a positive row everywhere, so each row goes to its nearest seed (no Lloyd step).
            return ["--init", "kmeans++", "--kmeans-iter", "0"]
        if self.init_params == "random_from_data":
            # K points drawn without replacement by the seed (caviar's Philox stream, not
            # scikit-learn's RandomState), one-hot; every other row is zero, as scikit-learn's.
            return ["--init", "random-from-data"]
        return ["--init", "random"]

    # ------------------------------------------------------------------ fit
    def fit(self, X, y=None):
        """Fit the mixture with caviar. X is an (n_samples, n_features) array, or the name of
        an HDF5 dataset, "data.h5:/X" (caviar reads it; its rows never pass through Python).
        Returns self."""
        self._fit(X)
        return self

    def fit_predict(self, X, y=None):
        """fit(X) then predict(X): the labels of the fitted model."""
        return self._fit(X).predict(X)

    def _fit(self, X):
        self._check_caviar_params()
        with _runner.Workdir() as wd:
            if _runner.is_data_ref(X):
                # caviar opens and checks the file itself (its errors are the ones raised).
                ref = os.fsdecode(os.fspath(X))
                n_rows = n_features = None
                self._forget_feature_names()
                X_mem = None
            else:
                X_mem = _validate_data(self, X, reset=True, dtype=[np.float64, np.float32],
                                       ensure_min_samples=2)
                n_rows, n_features = X_mem.shape
                if n_rows < self.n_components:
                    raise ValueError(
                        "Expected n_samples >= n_components but got n_components = %d, "
                        "n_samples = %d" % (self.n_components, n_rows))
                ref = None
            args, shift = self._model_args(wd, X_mem, ref, n_features)
            if ref is None:
                data = X_mem if shift is None else X_mem - shift
                ref = wd.file("x.h5") + ":/X"
                _runner.write_matrix(wd.file("x.h5"), data)
            model = wd.file("model.h5")
            base = (["gmm", "fit", "--data", ref, "--components", self.n_components,
                     "--covariance", self.covariance_type, "--tol", repr(float(self.tol)),
                     "--seed", _seed(self.random_state)] + args
                    + (["--stream"] if self.stream else []))

            def run(extra):
                return _runner.run(base + extra, caviar_bin=self.caviar_bin,
                                   n_ranks=self.n_ranks, n_threads=self.n_threads,
                                   mpirun=self.mpirun, verbose=self.verbose)

            # A warm start continues the previous fit (scikit-learn then ignores n_init and the
            # initialisation); given parameters (GaussianMixture) start EM as a warm start from
            # them: scikit-learn's max_iter and first convergence test count from them, as
            # --warm-start's do.
            start = (self._previous_model(wd)
                     or self._given_start(wd, run, ref, n_rows, n_features))
            if start is not None:
                summary = run(["--max-iter", self.max_iter, "--warm-start", start,
                               "--out", model])
                self._read_model(model, shift)
            else:
                extra = ["--max-iter", self.max_iter, "--out", model] + self._init_args(wd, n_rows)
                if self.n_init != 1:
                    # caviar's starts are keyed by (seed, start) and the best final bound is
                    # kept, as scikit-learn keeps the best lower bound.
                    extra += ["--n-init", self.n_init]
                summary = run(extra)
                self._read_model(model, shift)
            self._keep_model(model)
        self.n_features_in_ = self.means_.shape[1]
        self.caviar_summary_ = summary
        if not self.converged_:
            warnings.warn("%s (caviar: %d iterations, stop reason %r; caviar's tol is a relative "
                          "change of the total bound)" % (_CONVERGENCE_MSG, self.n_iter_,
                                                          summary.get("stop_reason")),
                          ConvergenceWarning, stacklevel=3)  # points at the caller of fit
        return self

    def _previous_model(self, wd):
        """With warm_start=True, once fitted: the previous fit's model file, written into wd
        for `caviar gmm fit --warm-start` (which continues from its whole state), or None."""
        blob = getattr(self, "_warm_model_h5", None)
        if not self.warm_start or blob is None:
            return None
        path = wd.file("previous.h5")
        with open(path, "wb") as f:
            f.write(blob)
        return path

    def _keep_model(self, model):
        """Keeps the model file's bytes for the next warm-started fit (only with warm_start:
        they hold the full posterior, K x D x D matrices)."""
        self._warm_model_h5 = None
        if self.warm_start and os.path.exists(model):
            with open(model, "rb") as f:
                self._warm_model_h5 = f.read()

    def _given_start(self, wd, run, ref, n_rows, n_features):
        """A start from given parameters (GaussianMixture), or None: start from
        responsibilities."""
        return None

    def _forget_feature_names(self):
        if hasattr(self, "feature_names_in_"):
            del self.feature_names_in_

    # ------------------------------------------------------------------ prediction
    def _rows(self, X):
        """Yields blocks of X (validated like scikit-learn), or of the named HDF5 dataset."""
        check_is_fitted(self)
        if _runner.is_data_ref(X):
            shape = _runner.dataset_shape(X)
            if len(shape) != 2 or shape[1] != self.n_features_in_:
                raise ValueError("%s has shape %s, but %s is expecting %d features as input."
                                 % (os.fsdecode(os.fspath(X)), shape, type(self).__name__,
                                    self.n_features_in_))
            for _, block in _runner.iter_rows(X):
                yield block
        else:
            yield _validate_data(self, X, reset=False)

    def _estimate_weighted_log_prob(self, X):
        return self._estimate_log_prob(X) + self._estimate_log_weights()

    def score_samples(self, X):
        """scikit-learn's per-row score: the log mixture density (GaussianMixture), or
        logsumexp_k E_q[ln pi_k] + E_q[ln N(x | mu_k, Lambda_k^-1)] (BayesianGaussianMixture,
        scikit-learn's definition; caviar's `gmm score` is the posterior predictive instead)."""
        return np.concatenate([logsumexp(self._estimate_weighted_log_prob(x), axis=1)
                               for x in self._rows(X)])

    def score(self, X, y=None):
        """Mean of score_samples(X)."""
        return float(self.score_samples(X).mean())

    def predict_proba(self, X):
        """Responsibilities of the fitted model, n_samples x n_components."""
        out = []
        for x in self._rows(X):
            wlp = self._estimate_weighted_log_prob(x)
            out.append(np.exp(wlp - logsumexp(wlp, axis=1)[:, None]))
        return np.concatenate(out)

    def predict(self, X):
        """Most probable component of each row."""
        return np.concatenate([self._estimate_weighted_log_prob(x).argmax(axis=1)
                               for x in self._rows(X)])

    def sample(self, n_samples=1):
        """Draw n_samples rows from the fitted mixture (as scikit-learn: weights_, means_,
        covariances_). Returns (X, y)."""
        check_is_fitted(self)
        if n_samples < 1:
            raise ValueError("Invalid value for 'n_samples': %d . The sampling requires at "
                             "least one sample." % (self.n_components))
        _, n_features = self.means_.shape
        rng = check_random_state(self.random_state)
        counts = rng.multinomial(n_samples, self.weights_)
        if self.covariance_type == "full":
            X = np.vstack([rng.multivariate_normal(m, c, int(s))
                           for m, c, s in zip(self.means_, self.covariances_, counts)])
        elif self.covariance_type == "tied":
            X = np.vstack([rng.multivariate_normal(m, self.covariances_, int(s))
                           for m, s in zip(self.means_, counts)])
        else:  # diag: sigma per feature; spherical: one sigma broadcast over the features
            X = np.vstack([m + rng.standard_normal(size=(s, n_features)) * np.sqrt(c)
                           for m, c, s in zip(self.means_, self.covariances_, counts)])
        y = np.concatenate([np.full(s, j, dtype=int) for j, s in enumerate(counts)])
        return X, y


class BayesianGaussianMixture(_CaviarMixture):
    """Variational Bayesian Gaussian mixture fitted by ``caviar gmm fit`` (CAVI or SVI).

    The parameters are scikit-learn's, with these differences:

    tol : float, default=1e-6
        caviar stops when the relative change of the total ELBO, |L_t - L_{t-1}| / |L_t|, falls
        below tol (0: run max_iter iterations). scikit-learn stops on the absolute change of
        its bound (a total without constant terms), so its tol t is about t / |lower_bound_|
        here. The default is caviar's.
    reg_covar : float, default=0
        caviar's variational M-step adds no regularisation, so only 0 is accepted
        (scikit-learn's default 1e-6 adds N_k 1e-6 I to each W_k^-1).
    init_params : {'kmeans', 'k-means++', 'random', 'random_from_data'}
        'kmeans': caviar's greedy k-means++ seeding + 10 Lloyd steps (scikit-learn runs KMeans
        to convergence: a similar start, not the same algorithm); 'k-means++': the seeding
        only, each row one-hot to its nearest seed; 'random': random responsibilities;
        'random_from_data': K distinct points, one per component, as scikit-learn (drawn by
        caviar's own random stream, so other points than scikit-learn's for the same seed).
    mean_prior : None or array
        None: the data mean (caviar --prior-mean data). An array works by fitting X - mean_prior
        with a zero prior mean (the model is translation equivariant), for in-memory X only.
    covariance_prior : None, array or float
        None: scikit-learn's default (caviar --prior-scale data): the data covariance (full,
        tied; normalised by N - 1 as numpy.cov), the per-feature variances (diag) or their
        mean (spherical). The identity is also accepted (np.eye(D); diag: np.ones(D);
        spherical: 1.0). Other values raise NotImplementedError.
    covariance_type : {'full', 'tied', 'diag', 'spherical'}
        caviar's models are the exact conjugate ones, fitted by coordinate ascent (or SVI) on
        their ELBO; for tied and spherical they are not scikit-learn's, whose updates for these
        two types are ad hoc, so the fitted parameters differ (the attributes have
        scikit-learn's shapes and meaning):
        'tied': one Wishart q(Lambda) = W(W, nu) shared by all components and
        q(mu_k | Lambda) = N(m_k, (beta_k Lambda)^-1); nu = nu0 + N (scikit-learn:
        nu0 + N / K) and W^-1 = W0^-1 + sum_k [N_k S_k + beta0 N_k / beta_k (xbar_k - m0)
        (xbar_k - m0)^T] (scikit-learn divides the sum by K), so the prior weighs K times less
        than in scikit-learn. degrees_of_freedom_ is one number, as scikit-learn's.
        'spherical': a precision lambda_k I per component, lambda_k ~ Gamma(nu0 / 2, rate
        W0^-1 / 2) (a 1-D Wishart) and mu_k | lambda_k ~ N(m0, (beta0 lambda_k)^-1 I);
        nu_k = nu0 + D N_k (scikit-learn: nu0 + N_k) and w_k^-1 = W0^-1 + sum_d [N_k S_kdd +
        beta0 N_k / beta_k (xbar_kd - m0_d)^2] (scikit-learn: the mean over d); its E-step
        has E[ln|Lambda_k|] = D (psi(nu_k / 2) + ln 2 + ln w_k) where scikit-learn uses the
        full Wishart's sum of D digammas. covariance_prior_ is one number.
        covariances_ is E_q[Lambda]^-1 = W^-1 / nu for every type, as in scikit-learn.
    degrees_of_freedom_prior : caviar needs nu0 > D - 1 for full and tied, > 0 for diag and
        spherical (whose precisions are 1-D Wisharts); scikit-learn asks > D - 1 for all.
    warm_start : once fitted, fit() continues from the previous fit's whole variational
        posterior for max_iter more iterations (caviar's --warm-start on its model file);
        n_init and the initialisation are then ignored, as in scikit-learn.
    n_init runs caviar's --n-init (starts keyed by random_state and the start).
    verbose_interval : not used (caviar reports every iteration; verbose > 0 prints them).

    caviar's own parameters:

    n_ranks : int, default=1
        MPI ranks (`mpirun -n n_ranks`; 1 runs the binary directly). Results are bitwise the
        same for any n_ranks and n_threads.
    n_threads : int or None
        OpenMP threads per rank (OMP_NUM_THREADS); None keeps the environment's.
    caviar_bin : path or None
        The binary; None: $CAVIAR_BIN, else `caviar` on PATH, else build/caviar of the
        repository this package belongs to.
    mpirun : str, list or None
        Launcher for n_ranks > 1; None: $CAVIAR_MPIRUN, else "mpirun".
    algorithm : {'cavi', 'svi'}
        Coordinate ascent, or stochastic VI with natural gradients (max_iter counts epochs).
    batch_size : int, default=512
        SVI minibatch.
    stream : bool
        caviar reads the rows from the file chunk by chunk and never holds them all (init must
        then be 'random' or init_resp).
    init_resp : None, array (n_samples, n_components) or "file.h5:/resp"
        Initial responsibilities (caviar --init FILE.h5:/resp); overrides init_params.

    Fitted attributes are scikit-learn's: weights_, means_, covariances_, precisions_,
    precisions_cholesky_, weight_concentration_prior_, weight_concentration_ (array, or the
    (a, b) tuple of the sticks for 'dirichlet_process'), mean_precision_prior_,
    mean_precision_, mean_prior_, degrees_of_freedom_prior_, degrees_of_freedom_,
    covariance_prior_, converged_, n_iter_, n_features_in_, and lower_bound_, which here is
    caviar's full ELBO (Bishop 10.70-10.77, every constant included; scikit-learn's drops
    constant terms, so the two differ by a constant). Also elbo_trace_ (the ELBO after each
    update, from the initial one) and caviar_summary_ (caviar's JSON summary line).
    """

    _parameter_constraints = dict(_BGM_CONSTRAINTS)
    _algorithms = ("cavi", "svi")

    def __init__(self, *, n_components=1, covariance_type="full", tol=1e-6, reg_covar=0.0,
                 max_iter=100, n_init=1, init_params="kmeans",
                 weight_concentration_prior_type="dirichlet_process",
                 weight_concentration_prior=None, mean_precision_prior=None, mean_prior=None,
                 degrees_of_freedom_prior=None, covariance_prior=None, random_state=None,
                 warm_start=False, verbose=0, verbose_interval=10, n_ranks=1, n_threads=None,
                 caviar_bin=None, mpirun=None, algorithm="cavi", batch_size=512, stream=False,
                 init_resp=None):
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.tol = tol
        self.reg_covar = reg_covar
        self.max_iter = max_iter
        self.n_init = n_init
        self.init_params = init_params
        self.weight_concentration_prior_type = weight_concentration_prior_type
        self.weight_concentration_prior = weight_concentration_prior
        self.mean_precision_prior = mean_precision_prior
        self.mean_prior = mean_prior
        self.degrees_of_freedom_prior = degrees_of_freedom_prior
        self.covariance_prior = covariance_prior
        self.random_state = random_state
        self.warm_start = warm_start
        self.verbose = verbose
        self.verbose_interval = verbose_interval
        self.n_ranks = n_ranks
        self.n_threads = n_threads
        self.caviar_bin = caviar_bin
        self.mpirun = mpirun
        self.algorithm = algorithm
        self.batch_size = batch_size
        self.stream = stream
        self.init_resp = init_resp

    def _model_args(self, wd, X, ref, n_features):
        if self.reg_covar != 0:
            raise _not_implemented(
                "reg_covar=%r for the variational mixture" % (self.reg_covar,),
                "its M-step has no covariance regularisation (`gmm fit --reg-covar` applies to "
                "EM only); use reg_covar=0")
        args = ["--algorithm", self.algorithm, "--weights",
                "stick-breaking" if self.weight_concentration_prior_type == "dirichlet_process"
                else "dirichlet"]
        if self.algorithm == "svi":
            args += ["--batch-size", int(self.batch_size)]
        if self.weight_concentration_prior is not None:
            args += ["--alpha0", repr(float(self.weight_concentration_prior))]
        if self.mean_precision_prior is not None:
            args += ["--beta0", repr(float(self.mean_precision_prior))]
        if self.degrees_of_freedom_prior is not None:
            args += ["--nu0", repr(float(self.degrees_of_freedom_prior))]
        shift = None
        if n_features is None and (self.mean_prior is not None or
                                   self.covariance_prior is not None):
            n_features = _runner.dataset_shape(ref)[1]  # a file: its metadata
        if self.mean_prior is None:
            args += ["--prior-mean", "data"]
        else:
            mp = np.asarray(self.mean_prior, dtype=np.float64)
            if mp.shape != (n_features,):
                raise ValueError("The parameter 'means' should have the shape of (%d,), but "
                                 "got %s" % (n_features, mp.shape))
            args += ["--prior-mean", "zero"]
            if np.any(mp != 0):
                if X is None:
                    raise _not_implemented(
                        "a mean_prior other than None or zeros for data given as a file",
                        "caviar's --prior-mean takes zero or data; for arrays the wrapper "
                        "shifts the data, which it cannot do for a file")
                shift = mp
        if self.covariance_prior is None:
            args += ["--prior-scale", "data"]
        else:
            # W0^-1 = I in scikit-learn's shape of covariance_prior for the type.
            cp = np.asarray(self.covariance_prior, dtype=np.float64)
            ident = {"full": np.eye(n_features), "tied": np.eye(n_features),
                     "diag": np.ones(n_features), "spherical": np.float64(1.0)}[
                         self.covariance_type]
            if cp.shape != ident.shape or not np.array_equal(cp, ident):
                raise _not_implemented(
                    "covariance_prior other than None (the data covariance) or the identity",
                    "caviar's --prior-scale takes data or identity")
            args += ["--prior-scale", "identity"]
        return args, shift

    def _read_model(self, path, shift):
        import h5py
        with h5py.File(path, "r") as f:
            attrs = dict(f.attrs)
            post, prior = f["posterior"], f["prior"]
            self.weights_ = f["weights"][...]
            self.means_ = f["means"][...]
            self.covariances_ = f["covariances"][...]
            if "alpha" in post:
                self.weight_concentration_ = post["alpha"][...]
            else:
                self.weight_concentration_ = (post["stick_a"][...], post["stick_b"][...])
            self.mean_precision_ = post["beta"][...]
            self._nu = post["nu"][...]
            self._W_inv = post["W_inv"][...]
            self.weight_concentration_prior_ = float(prior["alpha0"][()])
            self.mean_precision_prior_ = float(prior["beta0"][()])
            self.mean_prior_ = prior["m0"][...]
            self.degrees_of_freedom_prior_ = float(prior["nu0"][()])
            self.covariance_prior_ = prior["W0_inv"][...]
            self.elbo_trace_ = f["trace/elbo"][...]
        # scikit-learn's shapes: tied has one degrees_of_freedom_ (caviar writes it for each
        # component, all equal) and spherical one covariance_prior_ (caviar: a (1,) array).
        self.degrees_of_freedom_ = self._nu
        if self.covariance_type == "tied":
            if np.any(self._nu != self._nu[0]):
                raise ValueError("%s: the tied model's /posterior/nu are not all equal: %r"
                                 % (path, self._nu))
            self.degrees_of_freedom_ = float(self._nu[0])
        elif self.covariance_type == "spherical":
            self.covariance_prior_ = float(self.covariance_prior_.reshape(()))
        if shift is not None:
            self.means_ = self.means_ + shift
            self.mean_prior_ = self.mean_prior_ + shift
        self.lower_bound_ = float(_attr(attrs, "elbo"))
        self.n_iter_ = int(_attr(attrs, "n_iter"))
        self.converged_ = bool(_attr(attrs, "converged"))
        self.precisions_cholesky_ = _precisions_cholesky_from_covariances(
            self.covariances_, self.covariance_type)
        self.precisions_ = _precisions(self.precisions_cholesky_, self.covariance_type)

    def _estimate_log_weights(self):
        """E[ln pi_k] under q (Bishop 10.66; stick-breaking: Blei & Jordan 2006)."""
        if self.weight_concentration_prior_type == "dirichlet_process":
            a, b = self.weight_concentration_
            dsum = digamma(a + b)
            return (digamma(a) - dsum
                    + np.hstack((0, np.cumsum(digamma(b) - dsum)[:-1])))
        alpha = self.weight_concentration_
        return digamma(alpha) - digamma(np.sum(alpha))

    def _estimate_log_prob(self, X):
        """E_q[ln N(x | mu_k, Lambda_k^-1)] (Bishop 10.64-10.65; ln rho_nk of 10.46 without
        E[ln pi_k]), for caviar's conjugate models:
        full: one Wishart W(W_k, nu_k) per component; tied: one W(W, nu) for all, so the
        formulas of full with W_k = W; diag: an independent 1-D Wishart per dimension,
        E[ln Lambda_kd] = psi(nu_k / 2) + ln 2 + ln W_kd (scikit-learn's diag uses the full
        Wishart's sum of D digammas instead); spherical: Lambda_k = lambda_k I with lambda_k a
        1-D Wishart of scale w_k and nu_k degrees of freedom, E[ln|Lambda_k|] =
        D (psi(nu_k / 2) + ln 2 + ln w_k)."""
        n, D = X.shape
        nu, beta, m = self._nu, self.mean_precision_, self.means_
        cov = self.covariance_type
        if cov == "tied":
            C_tied = linalg.cholesky(self._W_inv, lower=True)
        out = np.empty((n, len(nu)))
        for k in range(len(nu)):
            diff = X - m[k]
            if cov in ("full", "tied"):
                # W_k^-1 = C C^T: (x-m)^T W_k (x-m) = |C^-1 (x-m)|^2, ln|W_k| = -2 sum ln diag C
                C = C_tied if cov == "tied" else linalg.cholesky(self._W_inv[k], lower=True)
                y = linalg.solve_triangular(C, diff.T, lower=True)
                maha = np.einsum("ij,ij->j", y, y)
                e_logdet = (np.sum(digamma(0.5 * (nu[k] - np.arange(D)))) + D * np.log(2.0)
                            - 2.0 * np.sum(np.log(np.diag(C))))
            elif cov == "diag":
                w = 1.0 / self._W_inv[k]
                maha = (diff * diff) @ w
                e_logdet = D * (digamma(0.5 * nu[k]) + np.log(2.0)) + np.sum(np.log(w))
            else:
                w = 1.0 / self._W_inv[k]
                maha = w * np.einsum("ij,ij->i", diff, diff)
                e_logdet = D * (digamma(0.5 * nu[k]) + np.log(2.0) + np.log(w))
            out[:, k] = 0.5 * (e_logdet - D * np.log(2 * np.pi) - D / beta[k] - nu[k] * maha)
        return out


class GaussianMixture(_CaviarMixture):
    """Maximum-likelihood Gaussian mixture fitted by EM in ``caviar gmm fit --algorithm em``.

    The parameters are scikit-learn's, with these differences:

    tol : float, default=1e-6
        caviar stops when the relative change of the total log-likelihood falls below tol
        (0: run max_iter iterations). scikit-learn stops on the absolute change of the mean
        log-likelihood per row (lower_bound_), so its tol t is t / |lower_bound_| here.
    init_params : as BayesianGaussianMixture.
    weights_init, means_init, precisions_init : EM starts from them (caviar's --warm-start on
        a model file of them); the missing ones come from the M-step of the init_params
        responsibilities.
    warm_start : once fitted, fit() continues EM from the fitted parameters for max_iter
        more iterations (caviar's --warm-start on the previous model file; n_init and the
        *_init are then ignored, as in scikit-learn).
    covariance_type : {'full', 'tied', 'diag', 'spherical'}, scikit-learn's models (EM is the
        same algorithm), with precisions_init in scikit-learn's shapes: (K, D, D), (D, D),
        (K, D), (K,).
    n_init runs caviar's --n-init (not with given parameters, from which every start is the
    same).
    reg_covar is caviar's --reg-covar (the same meaning as scikit-learn's).

    caviar's own parameters: n_ranks, n_threads, caviar_bin, mpirun, stream, init_resp, as in
    BayesianGaussianMixture.

    Fitted attributes: weights_, means_, covariances_, precisions_, precisions_cholesky_,
    converged_, n_iter_, lower_bound_ (mean log-likelihood per row of the final parameters;
    scikit-learn's is that of the parameters before the last M-step), n_features_in_,
    log_likelihood_trace_ (total log-likelihood after each update), caviar_summary_.
    """

    _parameter_constraints = dict(_GM_CONSTRAINTS)
    _algorithms = ("em",)

    def __init__(self, n_components=1, *, covariance_type="full", tol=1e-6, reg_covar=1e-6,
                 max_iter=100, n_init=1, init_params="kmeans", weights_init=None,
                 means_init=None, precisions_init=None, random_state=None, warm_start=False,
                 verbose=0, verbose_interval=10, n_ranks=1, n_threads=None, caviar_bin=None,
                 mpirun=None, stream=False, init_resp=None):
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.tol = tol
        self.reg_covar = reg_covar
        self.max_iter = max_iter
        self.n_init = n_init
        self.init_params = init_params
        self.weights_init = weights_init
        self.means_init = means_init
        self.precisions_init = precisions_init
        self.random_state = random_state
        self.warm_start = warm_start
        self.verbose = verbose
        self.verbose_interval = verbose_interval
        self.n_ranks = n_ranks
        self.n_threads = n_threads
        self.caviar_bin = caviar_bin
        self.mpirun = mpirun
        self.stream = stream
        self.init_resp = init_resp

    def _model_args(self, wd, X, ref, n_features):
        return ["--algorithm", "em", "--reg-covar", repr(float(self.reg_covar))], None

    def _given_start(self, wd, run, ref, n_rows, n_features):
        """EM's first parameters when they are given: weights_init, means_init and
        precisions_init, the missing ones taken from the M-step of the init_params
        responsibilities (scikit-learn's _initialize). Returns an EM model file holding them
        (/weights, /means, /covariances, /precisions_cholesky), for --warm-start, or None:
        start from responsibilities."""
        import h5py
        given = (self.weights_init, self.means_init, self.precisions_init)
        if all(v is None for v in given):
            return None
        K = self.n_components
        D = n_features if n_features is not None else _runner.dataset_shape(ref)[1]
        w = None if given[0] is None else _check_init_weights(given[0], K)
        m = None if given[1] is None else _check_init_array(given[1], (K, D), "means")
        c = None if given[2] is None else _covariances_of_precisions(
            given[2], self.covariance_type, K, D)
        if w is None or m is None or c is None:
            first = wd.file("first.h5")
            run(["--max-iter", 0, "--out", first] + self._init_args(wd, n_rows))
            with h5py.File(first, "r") as f:
                w = f["weights"][...] if w is None else w
                m = f["means"][...] if m is None else m
                c = f["covariances"][...] if c is None else c
        path = wd.file("start.h5")
        with h5py.File(path, "w") as f:
            f["weights"], f["means"], f["covariances"] = w, m, c
            f["precisions_cholesky"] = _precisions_cholesky_from_covariances(
                np.asarray(c, dtype=np.float64), self.covariance_type)
            f.attrs["algorithm"], f.attrs["covariance_type"] = "em", self.covariance_type
        return path

    def _read_model(self, path, shift):
        import h5py
        with h5py.File(path, "r") as f:
            attrs = dict(f.attrs)
            self.weights_ = f["weights"][...]
            self.means_ = f["means"][...]
            self.covariances_ = f["covariances"][...]
            self.precisions_cholesky_ = f["precisions_cholesky"][...]
            self.precisions_ = f["precisions"][...]
            self.log_likelihood_trace_ = f["trace/log_likelihood"][...]
        self.lower_bound_ = float(_attr(attrs, "lower_bound"))
        self.n_iter_ = int(_attr(attrs, "n_iter"))
        self.converged_ = bool(_attr(attrs, "converged"))

    def _estimate_log_weights(self):
        with np.errstate(divide="ignore"):
            return np.log(self.weights_)

    def _estimate_log_prob(self, X):
        """ln N(x | mu_k, Sigma_k) from the precisions' Cholesky factors (P P^T = Sigma^-1):
        per component (full), shared (tied), 1/sigma per feature (diag) or one 1/sigma_k for
        every feature (spherical)."""
        n, D = X.shape
        cov, pc = self.covariance_type, self.precisions_cholesky_
        out = np.empty((n, len(self.weights_)))
        for k, mu in enumerate(self.means_):
            if cov in ("full", "tied"):
                P = pc[k] if cov == "full" else pc
                y = (X - mu) @ P
                logdet = np.sum(np.log(np.diag(P)))
            else:
                y = (X - mu) * pc[k]
                logdet = np.sum(np.log(pc[k])) if cov == "diag" else D * np.log(pc[k])
            out[:, k] = -0.5 * (D * np.log(2 * np.pi) + np.einsum("ij,ij->i", y, y)) + logdet
        return out

    def _n_parameters(self):
        """Free parameters of the model (for bic and aic), as scikit-learn counts them."""
        K, D = self.means_.shape
        cov = {"full": K * D * (D + 1) / 2.0, "tied": D * (D + 1) / 2.0, "diag": K * D,
               "spherical": K}[self.covariance_type]
        return int(cov + K * D + K - 1)

    def _n_rows(self, X):
        return _runner.dataset_shape(X)[0] if _runner.is_data_ref(X) else len(X)

    def bic(self, X):
        """Bayesian information criterion (lower is better)."""
        n = self._n_rows(X)
        return -2 * self.score(X) * n + self._n_parameters() * np.log(n)

    def aic(self, X):
        """Akaike information criterion (lower is better)."""
        return -2 * self.score(X) * self._n_rows(X) + 2 * self._n_parameters()
