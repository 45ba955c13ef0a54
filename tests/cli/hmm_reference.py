"""NumPy references shared by the HMM CLI tests: the sequence file layout, Gaussian log densities
the scaled forward-backward (Rabiner 1989) with its expected counts, and the Dirichlet's E[ln p]
and KL divergence (Bishop 2006, eqs B.21 and B.23) of the variational Bayes checks."""
import h5py
import numpy as np
from scipy.special import digamma, gammaln


def write_data(f, seqs):
    """The layout hmm reads: /X every step of every sequence, /offsets n+1 boundaries."""
    with h5py.File(f, "w") as h:
        h["X"] = np.concatenate(seqs)
        h["offsets"] = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)


def read_data(f):
    with h5py.File(f, "r") as h:
        x, off = h["X"][()], h["offsets"][()]
    return [x[off[i]:off[i + 1]] for i in range(len(off) - 1)]


def log_gauss(x, mean, cov):
    """log N(x | mean, cov) of one step x (D), or of every row of x (T x D) at once."""
    d = np.atleast_2d(x - mean)
    _, logdet = np.linalg.slogdet(cov)
    q = np.sum(d * np.linalg.solve(cov, d.T).T, axis=1)
    out = -0.5 * (len(mean) * np.log(2 * np.pi) + logdet + q)
    return out if np.ndim(x) > 1 else out[0]


def forward_backward(pi, A, logb):
    """Scaled forward-backward (Rabiner 1989): log Z, gamma (T x K), summed xi (K x K)."""
    T, K = logb.shape
    m = logb.max(1, keepdims=True)
    b = np.exp(logb - m)
    al, c = np.zeros((T, K)), np.zeros(T)
    for t in range(T):
        al[t] = (pi if t == 0 else al[t - 1] @ A) * b[t]
        c[t] = al[t].sum()
        al[t] /= c[t]
    be = np.ones((T, K))
    xi = np.zeros((K, K))
    for t in range(T - 2, -1, -1):
        u = b[t + 1] * be[t + 1] / c[t + 1]
        be[t] = A @ u
        xi += np.outer(al[t], u) * A
    return np.log(c).sum() + m.sum(), al * be, xi


def expected_counts(seqs, pi, A, logb_fn, K):
    ll, st, tr, gam = 0.0, np.zeros(K), np.zeros((K, K)), []
    for x in seqs:
        l, g, xi = forward_backward(pi, A, logb_fn(x))
        ll += l
        st += g[0]
        tr += xi
        gam.append(g)
    return ll, st, tr, gam


def read_model(f):
    with h5py.File(f, "r") as h:
        out = {k: h[k][()] for k in ("startprob", "transmat", "emissionprob", "means",
                                     "covariances") if k in h}
        for g in ("posterior", "prior"):
            if g in h:
                for k in h[g]:
                    out[g + "/" + k] = h[g][k][()]
        out["trace"] = h["trace/objective"][()]
        out["attrs"] = dict(h.attrs)
    return out


def elog_dir(a):
    """E[ln p] under Dirichlet(a), along the last axis."""
    return digamma(a) - digamma(a.sum(-1, keepdims=True))


def kl_dir(a, a0):
    """KL(Dir(a) || Dir(a0 1))."""
    a0v = np.full_like(a, a0)
    return (gammaln(a.sum()) - gammaln(a).sum() - gammaln(a0v.sum()) + gammaln(a0v).sum()
            + ((a - a0) * (digamma(a) - digamma(a.sum()))).sum())
