"""The public namespace ``cvxdp.analysis``; its code and documentation are in :mod:`cvxdp.modelling.analysis`."""
from .modelling.analysis import *  # noqa: F403  (exactly the names in its __all__)
from .modelling.analysis import __all__, __doc__  # noqa: F401
