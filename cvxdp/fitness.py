"""The public namespace ``cvxdp.fitness``; its code and documentation are in :mod:`cvxdp.modelling.fitness`."""
from .modelling.fitness import *  # noqa: F403  (exactly the names in its __all__)
from .modelling.fitness import __all__, __doc__  # noqa: F401
