"""The public namespace ``cvxdp.workloads``; its code and documentation are in :mod:`cvxdp.modelling.workloads`."""
from .modelling.workloads import *  # noqa: F403  (exactly the names in its __all__)
from .modelling.workloads import __all__, __doc__  # noqa: F401
