"""caviar from Python: scikit-learn-style estimators that run the caviar binary.

    import caviar
    gm = caviar.BayesianGaussianMixture(n_components=5, n_ranks=2).fit(X)   # or fit("x.h5:/X")
    gm.predict(X)

Pure Python (NumPy, SciPy, h5py, scikit-learn); nothing is compiled. Make it importable with
``PYTHONPATH=python`` from the repository root (or the absolute path of python/). Each fit
writes an in-memory X to a temporary HDF5 file ($TMPDIR), runs ``caviar ...`` (``mpirun -n
n_ranks caviar ...`` when n_ranks > 1) and reads the model file back. The binary is the
estimator's caviar_bin, else $CAVIAR_BIN, else ``caviar`` on PATH, else build/caviar of this
repository.

Errors of the binary are raised as CaviarError (a ValueError) carrying caviar's one-line
message; scikit-learn options caviar does not implement raise NotImplementedError.
"""

from ._runner import CaviarError, find_binary
from .lda import LatentDirichletAllocation
from .mixture import BayesianGaussianMixture, GaussianMixture

__all__ = ["BayesianGaussianMixture", "GaussianMixture", "LatentDirichletAllocation",
           "CaviarError", "find_binary"]
__version__ = "0.1.0"
