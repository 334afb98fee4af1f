"""Solve many independent problems: in this process or on a Dask cluster.

:func:`solve_many` takes

* a list of ``cp.Problem``\\ s, solved and written back into each one (values, status, optimal
  value, duals and ``solver_stats``, as ``prob.solve(method="cvxdp", ...)`` would have left
  them);
* one ``cp.Problem`` with ``cp.Parameter``\\ s and ``parameters=[{param: value}, ...]``: solved
  once per dict (bootstrap draws, a sweep of a regularisation weight); the problem itself is
  left exactly as it was;
* a ``builder(values) -> cp.Problem`` and ``parameters=[values, ...]``: one problem built and
  solved per entry, where the problems are built (on the workers, on Dask).

Tasks are grouped into chunks (``chunk_size``; by default about four chunks per worker): a
chunk is pickled and shipped once, and a parametrised problem is unpickled once per chunk and
re-used for every dict of the chunk.  The memory a chunk ships is ``ManyResult.task_bytes``
(the largest pickled chunk: one copy of the problem plus the parameter values for a
parametrised problem, every problem of the chunk for a list); a worker holds that plus the
solver's workspace for one problem at a time.

Every task starts from the state its problem was shipped in (the Variable values of the list's
problem, or of the parametrised problem), never from the previous task's solution: results
depend on the task only, not on the chunking nor the backend, so a deterministic method gives
the same bits in one process and on any cluster.  (Starting a task from the previous draw's
solution was measured and does not pay: on a 2^10-leaf L1 hierarchy ADMM took 68 iterations on
average from the previous draw against 64 from the shipped start; mirror descent and the
local-polytope ADMM took the same number either way.  The methods' own warm-start state is
kept per Parameter values, so it never carries over between draws.)

A solve that raises is retried ``retries`` times, then reported with status ``"error"`` and the
exception's text: nothing is dropped; :meth:`ManyResult.raise_on_error` turns failures into an
exception.
"""
from __future__ import annotations

import inspect
import math
import pickle
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union, overload

import numpy as np
import cvxpy as cp
import cvxpy.lin_ops.lin_utils as _lu

from ..solvers.result import SOLUTION_PRESENT
from .dask_runner import DaskRunner, dask_available, missing_dask

__all__ = ["solve_many", "ManyResult", "SolveOutcome", "SolveManyError"]

_INF_OR_UNB = ("infeasible", "infeasible_inaccurate", "unbounded", "unbounded_inaccurate",
               "infeasible_or_unbounded")
#: the keywords of ``solve_many`` itself (never forwarded to ``Problem.solve``)
_OWN = ("parameters", "client", "scheduler", "workers", "backend", "retries", "progress",
        "chunk_size")


class SolveManyError(RuntimeError):
    """Problems that failed after their retries: ``failures`` lists their indices."""

    def __init__(self, outcomes: Sequence["SolveOutcome"]) -> None:
        self.failures = [o.index for o in outcomes]
        shown = "\n  ".join(f"problem {o.index} ({o.attempts} attempt(s)): {o.error}"
                            for o in outcomes[:10])
        more = f"\n  ... and {len(outcomes) - 10} more" if len(outcomes) > 10 else ""
        super().__init__(f"{len(outcomes)} problem(s) failed after their retries: indices "
                         f"{_span(self.failures)}\n  {shown}{more}")


@dataclass(frozen=True)
class SolveOutcome:
    """One problem's result.

    ``status``: cvxpy's status string, or ``"error"`` when the solve raised on every attempt
    (``error`` then holds the exception's text).  ``value``: the optimal value (``None`` on
    error).  ``variables``: every variable's value by name (a name shared by several variables
    gets ``"name#id"``); :meth:`value_of` looks one up by the Variable object.
    ``solve_time``, ``setup_time``, ``iterations``, ``solver_name``, ``extra_stats``: the
    essentials of ``problem.solver_stats``.  ``attempts``: solves tried (1 unless retried).
    """

    index: int
    status: str
    value: float | None = None
    variables: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    solve_time: float | None = None
    setup_time: float | None = None
    iterations: int | None = None
    solver_name: str | None = None
    extra_stats: Any = field(default=None, repr=False)
    attempts: int = 1
    error: str | None = None
    _by_id: dict[int, np.ndarray] = field(default_factory=dict, repr=False, compare=False)
    _names: dict[int, str] = field(default_factory=dict, repr=False, compare=False)
    _duals: dict[int, Any] = field(default_factory=dict, repr=False, compare=False)
    _compile_time: float | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """Whether the solve returned (any cvxpy status, not ``"error"``)."""
        return self.status != "error"

    def value_of(self, var: cp.Variable | str) -> np.ndarray | None:
        """The value of ``var`` (a Variable of the problem solved, or its name) in this
        solution; ``None`` when the status carries no point (infeasible, error).  A problem
        built on a worker has its own Variable objects: look those up by name."""
        if self.status == "error":
            return None
        if not isinstance(var, str):
            vid = getattr(var, "id", None)
            if vid in self._names:
                return self._by_id.get(vid)
        name = var if isinstance(var, str) else var.name()
        for vid, n in self._names.items():
            if n == name:
                return self._by_id.get(vid)
        raise KeyError(f"no variable {name!r} in problem {self.index}")


class ManyResult(Sequence[SolveOutcome]):
    """The outcomes of :func:`solve_many`, one per problem in the input's order.

    ``backend`` (``"local"`` or ``"dask"``), ``workers``, ``wall_time`` (seconds, the whole
    call: a cluster started for it included),
    ``failures`` (indices of the problems with status ``"error"``), ``chunks`` and
    ``chunk_size`` (how the tasks were grouped) and ``task_bytes``: the largest pickled chunk,
    the memory one task ships to a worker (``None`` when it could not be measured).
    """

    def __init__(self, outcomes: list[SolveOutcome], *, backend: str, workers: int,
                 wall_time: float, task_bytes: int | None, chunks: int,
                 chunk_size: int) -> None:
        self._outcomes = outcomes
        self.backend = backend
        self.workers = workers
        self.wall_time = wall_time
        self.task_bytes = task_bytes
        self.chunks = chunks
        self.chunk_size = chunk_size
        self.failures = [o.index for o in outcomes if o.status == "error"]

    @overload
    def __getitem__(self, i: int) -> SolveOutcome: ...

    @overload
    def __getitem__(self, i: slice) -> list[SolveOutcome]: ...

    def __getitem__(self, i):
        return self._outcomes[i]

    def __len__(self) -> int:
        return len(self._outcomes)

    @property
    def statuses(self) -> list[str]:
        return [o.status for o in self._outcomes]

    @property
    def values(self) -> np.ndarray:
        """The optimal values (NaN where a problem failed)."""
        return np.array([np.nan if o.value is None else o.value for o in self._outcomes],
                        dtype=float)

    def stack(self, var: cp.Variable | str) -> np.ndarray:
        """``var``'s value in every solution, stacked along a new first axis (NaN where a
        problem failed or has no point): the draws of a parametrised problem, say."""
        vals = [o.value_of(var) for o in self._outcomes]
        shape = next((np.shape(v) for v in vals if v is not None), None)
        if shape is None:
            shape = getattr(var, "shape", ())
        return np.stack([np.full(shape, np.nan) if v is None else np.asarray(v, dtype=float)
                         for v in vals]) if vals else np.zeros((0, *shape))

    def raise_on_error(self) -> "ManyResult":
        """Raise :class:`SolveManyError` listing every failed problem; else return self."""
        if self.failures:
            raise SolveManyError([self._outcomes[i] for i in self.failures])
        return self

    def __repr__(self) -> str:
        counts: dict[str, int] = {}
        for o in self._outcomes:
            counts[o.status] = counts.get(o.status, 0) + 1
        statuses = ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"
        size = "?" if self.task_bytes is None else _bytes(self.task_bytes)
        return (f"ManyResult({len(self)} problems: {statuses}; backend {self.backend}, "
                f"{self.workers} worker(s), {self.wall_time:.3g} s, {self.chunks} chunk(s) of "
                f"<= {self.chunk_size}, {size} per task)")


Problems = Union[Sequence[cp.Problem], cp.Problem, Callable[[Any], cp.Problem]]


def solve_many(problems: Problems, *, parameters: Sequence[Any] | None = None, client=None,
               scheduler: str | None = None, workers: int | None = None,
               backend: str = "auto", retries: int = 1,
               progress: bool | Callable[[int, int], None] = False,
               chunk_size: int | None = None, **solve_options: Any) -> ManyResult:
    """Solve many independent problems with ``prob.solve(method="cvxdp", **solve_options)``.

    Parameters
    ----------
    problems : a list of ``cp.Problem``; or one ``cp.Problem`` with Parameters, solved once
        per dict of ``parameters``; or a callable ``builder(values) -> cp.Problem``, called
        once per entry of ``parameters``.
    parameters : for one problem, dicts ``{Parameter or its name: value}`` (a Parameter not
        in a dict keeps the problem's own value); for a builder, its arguments (anything
        picklable on Dask).  Not allowed with a list.
    client, scheduler, workers, backend : where it runs.  By default (``backend="auto"``
        and none of the three given) in this process; ``client=`` a ``distributed.Client``,
        ``scheduler=`` an address, ``workers=k`` a ``LocalCluster`` of ``k`` processes
        started for the call and closed after it, or ``backend="dask"`` (two workers by
        default) run on Dask (``pip install cvxdp[distributed]``).  ``backend="local"``
        always runs here.
    retries : further attempts of a solve that raised, before it is reported with status
        ``"error"``.
    progress : ``True`` draws a text bar on stderr as problems finish; a callable gets
        ``(done, total)``.
    chunk_size : problems per task (default: about four tasks per worker).
    solve_options : passed to every solve (``solver=cvxdp.ADMM``, ``eps_rel=1e-6``,
        ``solver=cp.CLARABEL``, ...); checked before any work: an unknown or out-of-range
        option raises ``ValueError`` or ``TypeError`` naming it.

    Returns a :class:`ManyResult`: the :class:`SolveOutcome` of every problem in the input's
    order, and ``task_bytes``, the memory each task ships (the largest pickled chunk).

    Example::

        y = cp.Parameter(tree.n_nodes)
        prob = cp.Problem(cp.Minimize(cp.norm1(x - y)), [cvxdp.consistent(tree, x), x >= 0])
        draws = [{y: answers + rng.laplace(0, b, answers.size)} for _ in range(200)]
        res = cvxdp.solve_many(prob, parameters=draws, solver=cvxdp.ADMM, workers=2)
        res.raise_on_error()
        spread = res.stack(x).std(axis=0)
    """
    _check_own(backend, retries, chunk_size, workers, progress)
    _check_solve_options(solve_options)
    kind, n, make_chunk, problems = _plan(problems, parameters)
    if backend == "auto" and client is None and scheduler is None and workers is None:
        backend = "local"
    if backend != "local" and not dask_available():
        raise missing_dask("solve_many")
    t0 = time.perf_counter()
    tick = _progress(progress, n)
    runner = DaskRunner("solve_many", backend, client, scheduler, workers, retries,
                        warm_up=_warm_up, default_workers=2)
    try:
        size = chunk_size or max(1, math.ceil(n / (4 * runner.workers)))
        bounds = [(a, min(a + size, n)) for a in range(0, n, size)]
        floor = _lu.ID_COUNTER.count
        opts = dict(solve_options)
        outcomes: list[SolveOutcome | None] = [None] * n
        task_bytes = 0
        done = 0
        if runner.client is None:
            def one(_: int) -> None:
                nonlocal done
                done += 1
                tick(done)
            for a, b in bounds:             # one chunk at a time: one copy in memory
                chunk = make_chunk(a, b, opts, retries, floor)
                task_bytes = _max(task_bytes, _size(chunk))
                for o in _run_chunk(chunk, on_task=one):
                    outcomes[o.index] = o
        else:
            blobs = [_dumps(make_chunk(a, b, opts, retries, floor)) for a, b in bounds]
            task_bytes = max((len(x) for x in blobs), default=0)
            for i, ok, res in runner.as_completed(_run_blob, blobs):
                a, b = bounds[i]
                if ok:
                    for o in res:
                        outcomes[o.index] = o
                else:
                    for j in range(a, b):
                        outcomes[j] = SolveOutcome(j, "error", attempts=retries + 1,
                                                   error=f"the task failed on Dask: {res!r}")
                done += b - a
                tick(done)
        if kind == "problems":
            for p, o in zip(problems, outcomes):
                _write_back(p, o)
        return ManyResult(outcomes, backend=runner.name, workers=runner.workers,
                          wall_time=time.perf_counter() - t0, task_bytes=task_bytes or None,
                          chunks=len(bounds), chunk_size=size)
    finally:
        runner.close()


# ---------------------------------------------------------------------- checks
def _check_own(backend, retries, chunk_size, workers, progress) -> None:
    if backend not in ("auto", "dask", "local"):
        raise ValueError(f"solve_many: backend must be 'auto', 'dask' or 'local', got {backend!r}")
    if not (isinstance(retries, int) and not isinstance(retries, bool) and retries >= 0):
        raise ValueError(f"solve_many: retries must be a non-negative integer, got {retries!r}")
    for name, v in (("chunk_size", chunk_size), ("workers", workers)):
        if v is not None and not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            raise ValueError(f"solve_many: {name} must be a positive integer, got {v!r}")
    if not (isinstance(progress, bool) or callable(progress)):
        raise TypeError(f"solve_many: progress must be a bool or a callable, got {progress!r}")


def _check_solve_options(opts: dict) -> None:
    """Every option checked before any work, as :func:`cvxdp.solve` checks it; a standard
    solver's own settings by that solver, on a one-variable LP."""
    from ..dispatch import _validated, solve
    from ..methods.registry import METHODS, method_for
    if "method" in opts:
        raise TypeError("solve_many: method= is not an option (every solve is "
                        "prob.solve(method='cvxdp', ...))")
    try:
        bound = inspect.signature(solve).bind(None, **opts)
    except TypeError as exc:
        raise TypeError(f"solve_many: {exc}") from None
    bound.apply_defaults()
    args = dict(bound.arguments)
    kwargs = args.pop("kwargs")
    solver = args["solver"]
    shared = {k: args[k] for k in ("max_iters", "eps_abs", "eps_rel", "time_limit")}
    named = {k: args[k] for k in ("warm_start", "verbose", "callback", "verify", "fallback", "duals")}
    method = method_for(solver)
    if solver is not None and method is None:
        if not isinstance(args["duals"], (bool, np.bool_)):
            raise ValueError(f"solve_many: option duals={args['duals']!r} is not allowed; "
                             "expected True or False")
        _check_standard(solver, {k: v for k, v in opts.items() if k != "duals"})
        return
    given = _validated(method, kwargs, shared, **named)
    if method is None:              # solver=None: some method must accept them all
        errors = []
        for m in METHODS.values():
            try:
                m.options.parse(given)
                return
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError("solve_many: no cvxdp method accepts these options: "
                         + "; ".join(errors))


def _check_standard(solver, opts: dict) -> None:
    if not isinstance(solver, str) or solver.upper() not in cp.installed_solvers():
        raise ValueError(f"solve_many: solver={solver!r} is neither a cvxdp method nor an "
                         f"installed cvxpy solver ({', '.join(cp.installed_solvers())})")
    extra = {k: v for k, v in opts.items() if k != "solver"}
    if not extra:
        return
    x = cp.Variable()
    probe = cp.Problem(cp.Minimize(x), [x >= 0])
    try:
        probe.solve(solver=solver, **{**extra, "verbose": False})
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"solve_many: option(s) {sorted(extra)} refused by {solver}: "
                        f"{exc}") from None
    except cp.error.SolverError:
        pass                        # a setting the LP cannot honour is not a bad option


# ---------------------------------------------------------------------- the tasks
@dataclass
class _Chunk:
    """One task: problems ``start .. start + count - 1``.  ``kind`` ``"problems"``: ``blobs``
    (each problem pickled); ``"template"``: ``template`` (the problem pickled) and ``values``
    (``{parameter id: value}`` per task); ``"builder"``: ``builder`` and ``values``."""

    kind: str
    start: int
    options: dict
    retries: int
    id_floor: int
    blobs: list[bytes] | None = None
    template: bytes | None = None
    builder: Callable[[Any], cp.Problem] | None = None
    values: list | None = None

    @property
    def count(self) -> int:
        return len(self.blobs) if self.blobs is not None else len(self.values)


def _plan(problems, parameters) -> tuple[str, int, Callable[..., _Chunk], Any]:
    """The input's kind, number of tasks, how to make the chunk of tasks ``a .. b - 1``, and
    the input (a list of problems as a list)."""
    if isinstance(problems, cp.Problem):
        if parameters is None:
            raise ValueError("solve_many: one Problem needs parameters=[{param: value}, ...]; "
                             "pass a list of problems instead")
        values = _parameter_dicts(problems, parameters)
        blob = _dumps_problem(problems, "the problem")
        return "template", len(values), lambda a, b, opts, r, floor: _Chunk(
            "template", a, opts, r, floor, template=blob, values=values[a:b]), problems
    if callable(problems):
        if parameters is None:
            raise ValueError("solve_many: a builder needs parameters=[values, ...]")
        values = list(parameters)
        return "builder", len(values), lambda a, b, opts, r, floor: _Chunk(
            "builder", a, opts, r, floor, builder=problems, values=values[a:b]), problems
    if parameters is not None:
        raise ValueError("solve_many: parameters= goes with one Problem or a builder, "
                         "not with a list of problems")
    if isinstance(problems, (str, bytes)) or not isinstance(problems, Sequence | Iterator):
        raise TypeError("solve_many: problems must be a list of cvxpy Problems, one Problem "
                        f"with parameters=, or a builder; got {type(problems).__name__}")
    problems = list(problems)
    for i, p in enumerate(problems):
        if not isinstance(p, cp.Problem):
            raise TypeError(f"solve_many: problems[{i}] is a {type(p).__name__}, "
                            "not a cvxpy Problem")
    return "problems", len(problems), lambda a, b, opts, r, floor: _Chunk(
        "problems", a, opts, r, floor,
        blobs=[_dumps_problem(p, f"problems[{i}]") for i, p in enumerate(problems[a:b], a)]), problems


def _parameter_dicts(problem: cp.Problem, parameters) -> list[dict[int, Any]]:
    """``{parameter id: value}`` per dict, each value checked by cvxpy (shape, sign) on the
    problem's own Parameter, whose value is restored afterwards."""
    params = problem.parameters()
    by_name: dict[str, list] = {}
    for p in params:
        by_name.setdefault(p.name(), []).append(p)
    ids = {p.id for p in params}
    old = {p.id: p.value for p in params}
    out = []
    try:
        for i, d in enumerate(parameters):
            if not isinstance(d, Mapping):
                raise TypeError(f"solve_many: parameters[{i}] must be a dict "
                                f"{{Parameter or name: value}}, got {type(d).__name__}")
            row = {}
            for key, val in d.items():
                if isinstance(key, cp.Parameter):
                    if key.id not in ids:
                        raise ValueError(f"solve_many: parameters[{i}]: {key.name()!r} is not "
                                         "a Parameter of the problem")
                    p = key
                elif isinstance(key, str) and len(by_name.get(key, [])) == 1:
                    p = by_name[key][0]
                elif isinstance(key, str) and key in by_name:
                    raise ValueError(f"solve_many: parameters[{i}]: several Parameters are "
                                     f"named {key!r}; use the Parameter objects as keys")
                else:
                    raise ValueError(f"solve_many: parameters[{i}]: no Parameter named "
                                     f"{key!r} in the problem ({sorted(by_name)})")
                try:
                    p.value = val
                except ValueError as exc:
                    raise ValueError(f"solve_many: parameters[{i}][{p.name()!r}]: {exc}") from None
                row[p.id] = p.value
            missing = [p.name() for p in params if p.id not in row and old[p.id] is None]
            if missing:
                raise ValueError(f"solve_many: parameters[{i}] gives no value to {missing}, "
                                 "which have none in the problem")
            out.append(row)
    finally:
        for p in params:
            p.value = old[p.id]
    return out


def _run_blob(blob: bytes) -> list[SolveOutcome]:
    return _run_chunk(_loads(blob))


def _run_chunk(chunk: _Chunk, on_task: Callable[[int], None] | None = None
               ) -> list[SolveOutcome]:
    """Solve every task of the chunk in order; a task that raises is retried, then reported."""
    if _lu.ID_COUNTER.count < chunk.id_floor:       # a worker's fresh cvxpy must not re-use
        _lu.ID_COUNTER.count = chunk.id_floor       # the ids of the problems it received
    out = []
    template = _Template(chunk.template) if chunk.kind == "template" else None
    for k in range(chunk.count):
        index = chunk.start + k
        errors = []
        for _attempt in range(chunk.retries + 1):
            try:
                if chunk.kind == "problems":
                    prob = pickle.loads(chunk.blobs[k])
                elif chunk.kind == "template":
                    prob = template.prepare(chunk.values[k])
                else:
                    prob = chunk.builder(chunk.values[k])
                    if not isinstance(prob, cp.Problem):
                        raise TypeError(f"the builder returned a {type(prob).__name__}, "
                                        "not a cvxpy Problem")
                prob.solve(method="cvxdp", **chunk.options)
                out.append(_outcome(index, prob, len(errors) + 1, chunk.kind == "problems"))
                break
            except Exception as exc:  # noqa: BLE001 -- retried, then reported with its text
                errors.append(f"{type(exc).__name__}: {exc}")
                if template is not None:
                    template.reset()
        else:
            out.append(SolveOutcome(index, "error", attempts=len(errors), error=errors[-1]))
        if on_task is not None:
            on_task(index)
    return out


class _Template:
    """A parametrised problem unpickled once per chunk; every task starts from the state it
    was shipped in (Parameter and Variable values; no method state)."""

    def __init__(self, blob: bytes) -> None:
        self.blob = blob
        self.reset()

    def reset(self) -> None:
        self.problem = pickle.loads(self.blob)
        self.params = {p.id: p for p in self.problem.parameters()}
        self.start_params = {i: p.value for i, p in self.params.items()}
        self.start_vars = [(v, v.value) for v in self.problem.variables()]

    def prepare(self, values: dict[int, Any]) -> cp.Problem:
        from ..methods.warm_start import CACHE
        for i, p in self.params.items():
            p.value = values.get(i, self.start_params[i])
        for v, val in self.start_vars:
            v.value = val
        CACHE.clear(self.problem)
        return self.problem


def _outcome(index: int, prob: cp.Problem, attempts: int, duals: bool) -> SolveOutcome:
    st = prob.solver_stats
    by_id, names, variables = {}, {}, {}
    counts: dict[str, int] = {}
    for v in prob.variables():
        counts[v.name()] = counts.get(v.name(), 0) + 1
    for v in prob.variables():
        val = None if v.value is None else np.array(v.value, copy=True)
        by_id[v.id] = val
        name = v.name() if counts[v.name()] == 1 else f"{v.name()}#{v.id}"
        names[v.id] = name
        if val is not None:
            variables[name] = val
    dual = {}
    if duals:
        for c in prob.constraints:
            if c.dual_value is not None:
                dual[c.id] = c.dual_value
    value = prob.value
    return SolveOutcome(
        index, prob.status, None if value is None else float(value), variables,
        solve_time=getattr(st, "solve_time", None), setup_time=getattr(st, "setup_time", None),
        iterations=getattr(st, "num_iters", None), solver_name=getattr(st, "solver_name", None),
        extra_stats=_picklable(getattr(st, "extra_stats", None)), attempts=attempts,
        _by_id=by_id, _names=names, _duals=dual, _compile_time=prob.compilation_time)


def _write_back(problem: cp.Problem, o: SolveOutcome) -> None:
    """What ``problem.solve(method="cvxdp", ...)`` would have left in ``problem``."""
    from ..methods.compat import write_solution
    if o.status not in SOLUTION_PRESENT and o.status not in _INF_OR_UNB:
        return                      # an error (or a status cvxpy cannot unpack): untouched
    present = o.status in SOLUTION_PRESENT
    write_solution(problem, status=o.status, opt_val=o.value,
                   primal_vars={i: v for i, v in o._by_id.items() if v is not None} if present else {},
                   dual_vars=o._duals if present else {}, solver_name=o.solver_name,
                   solve_time=o.solve_time, setup_time=o.setup_time, num_iters=o.iterations,
                   extra_stats=o.extra_stats, compilation_time=o._compile_time)


# ---------------------------------------------------------------------- pickling
def _dumps_problem(problem: cp.Problem, what: str) -> bytes:
    try:
        return pickle.dumps(problem, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 -- said clearly, before any work
        raise TypeError(f"solve_many: {what} cannot be pickled ({type(exc).__name__}: {exc}); "
                        "every problem is copied into its task") from None


def _dumps(chunk: _Chunk) -> bytes:
    """A chunk for Dask: cloudpickle (a builder may be a lambda or a local function)."""
    import cloudpickle
    try:
        return cloudpickle.dumps(chunk, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 -- said clearly, before anything is shipped
        what = "the builder or its parameters" if chunk.kind == "builder" else "the options"
        raise TypeError(f"solve_many: {what} cannot be pickled for Dask "
                        f"({type(exc).__name__}: {exc})") from None


def _loads(blob: bytes) -> _Chunk:
    return pickle.loads(blob)


def _size(chunk: _Chunk) -> int | None:
    """The pickled size of a chunk run in this process (``None``: it does not pickle)."""
    try:
        if chunk.kind == "builder":
            import cloudpickle
            return len(cloudpickle.dumps(chunk, protocol=pickle.HIGHEST_PROTOCOL))
        return len(pickle.dumps(chunk, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 -- only a measurement
        return None


def _picklable(extra: Any) -> Any:
    if extra is None:
        return None
    try:
        pickle.dumps(extra)
        return extra
    except Exception:  # noqa: BLE001 -- a solver's own object: kept as its text
        return {"repr": repr(extra)}


def _warm_up() -> bool:
    import cvxdp.dispatch  # noqa: F401 -- initialises cvxdp (method="cvxdp" registered)
    return True


# ---------------------------------------------------------------------- small things
def _progress(progress, total: int) -> Callable[[int], None]:
    if callable(progress):
        return lambda done: progress(done, total)
    if progress:
        def bar(done: int) -> None:
            width = 30
            fill = int(width * done / max(total, 1))
            sys.stderr.write(f"\rsolve_many: [{'#' * fill}{'.' * (width - fill)}] "
                             f"{done}/{total}")
            if done >= total:
                sys.stderr.write("\n")
            sys.stderr.flush()
        return bar
    return lambda done: None


def _max(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else max(a, b)


def _bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _span(ix: list[int]) -> str:
    shown = ", ".join(map(str, ix[:20]))
    return shown + (f", ... ({len(ix)} in all)" if len(ix) > 20 else "")

