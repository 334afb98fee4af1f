"""The public namespace ``cvxdp.mechanisms``; its code and documentation are in :mod:`cvxdp.modelling.mechanisms`."""
from .modelling.mechanisms import *  # noqa: F403  (exactly the names in its __all__)
from .modelling.mechanisms import __all__, __doc__  # noqa: F401
