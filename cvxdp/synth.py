"""The public namespace ``cvxdp.synth``; its code and documentation are in :mod:`cvxdp.estimates.synth`
(``CvxdpEstimator`` in :mod:`cvxdp.estimates.mbi_estimator`, the model class
``CvxdpMarkovRandomField`` in :mod:`cvxdp.estimates.mbi_model`; both need mbi and are imported on
first access)."""
from .estimates.synth import (LOG_FLOOR, OPTIONS, check_options, estimate, estimator,  # noqa: F401
                              mle_from_marginals, with_cvxdp)
from .estimates.synth import __doc__, _mbi  # noqa: F401
from .estimates.synth import __all__ as _all

__all__ = _all + ["CvxdpEstimator", "CvxdpMarkovRandomField"]  # noqa: F822 (made on first use)


def __getattr__(name: str):
    # the classes that subclass the optional mbi's are imported on first use
    if name == "CvxdpEstimator":
        _mbi()
        from .estimates.mbi_estimator import CvxdpEstimator
        return CvxdpEstimator
    if name == "CvxdpMarkovRandomField":
        _mbi()
        from .estimates.mbi_model import CvxdpMarkovRandomField
        return CvxdpMarkovRandomField
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
