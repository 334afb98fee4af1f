"""The public namespace ``cvxdp.synth``; its code and documentation are in :mod:`cvxdp.estimates.synth`."""
from .estimates import synth as _synth
from .estimates.synth import LOG_FLOOR, estimate, estimator, with_cvxdp  # noqa: F401
from .estimates.synth import __all__, __doc__  # noqa: F401


def __getattr__(name: str):
    # CvxdpEstimator is made on first use (it subclasses the optional mbi's Estimator)
    return getattr(_synth, name)
