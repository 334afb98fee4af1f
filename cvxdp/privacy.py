"""The public namespace ``cvxdp.privacy``; its code and documentation are in :mod:`cvxdp.modelling.privacy`."""
from .modelling.privacy import *  # noqa: F403  (exactly the names in its __all__)
from .modelling.privacy import __all__, __doc__  # noqa: F401
