"""cvxdp: differentially private post-processing as cvxpy models."""
from .measurement import Measurement
from .losses import nll, elastic_net

__all__ = ["Measurement", "nll", "elastic_net"]
