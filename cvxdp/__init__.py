"""cvxdp: differentially private post-processing as cvxpy models.

Write the problem in cvxpy; solve it with a structure-exploiting cvxdp method or
with any standard solver by changing one word::

    prob.solve(method="cvxdp", solver=cvxdp.ADMM)
    prob.solve(method="cvxdp", solver=cp.CLARABEL)
"""
import logging as _logging

import cvxpy as _cp

from . import analysis, fitness, histograms, mechanisms, synth, workloads
from . import privacy as privacy    # a public namespace too (Gaussian accounting), not in __all__
from .modelling.atoms import privacy_cost, query_variance
from .modelling.constraints import HierarchicalHistogram, TreeConsistent, consistent, ordered
from .dispatch import ADMM, METHODS, MIRROR_DESCENT, NEWTON_CG, solve
from .modelling.domain import Domain
from .estimates.graphical_model import GraphicalModel
from .modelling.local_polytope import LocalPolytope
from .modelling.marginal_polytope import MarginalPolytope, ModelTooLarge
from .modelling.fitness import fitness_problem
from .errors import NotRecognised
from .modelling.losses import elastic_net, nll
from .modelling.measurement import Measurement
from .estimates.reconstruction import reconstruct
from .estimates.rounding import round_consistent
from .modelling.histograms import HistogramMeasurement
from .estimates.top_down import TopDownError, TopDownResult, topdown
from .estimates.many import ManyResult, SolveManyError, SolveOutcome, solve_many
from .estimates.error_bars import ErrorBars, error_bars

__version__ = "0.1.0"

__all__ = ["ADMM", "HierarchicalHistogram", "METHODS", "NEWTON_CG", "MIRROR_DESCENT", "Domain", "GraphicalModel",
           "LocalPolytope", "MarginalPolytope", "ModelTooLarge", "Measurement", "analysis", "fitness", "fitness_problem",
           "privacy_cost", "query_variance", "NotRecognised", "TreeConsistent", "consistent",
           "elastic_net", "mechanisms", "nll", "ordered", "round_consistent", "solve", "synth",
           "workloads", "histograms", "HistogramMeasurement", "topdown", "TopDownResult",
           "TopDownError", "reconstruct", "solve_many", "ManyResult", "SolveOutcome",
           "SolveManyError", "error_bars", "ErrorBars"]

_logging.getLogger("cvxdp").addHandler(_logging.NullHandler())
_cp.Problem.register_solve("cvxdp", solve)
