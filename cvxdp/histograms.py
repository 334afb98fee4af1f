"""The public namespace ``cvxdp.histograms``; its code and documentation are in :mod:`cvxdp.modelling.histograms`."""
from .modelling.histograms import *  # noqa: F403  (exactly the names in its __all__)
from .modelling.histograms import __all__, __doc__  # noqa: F401
