"""Where batches of independent tasks run: a Dask cluster, or this process.

Shared by :func:`cvxdp.topdown` and :func:`cvxdp.solve_many`.  :class:`DaskRunner` connects to
(or starts) a cluster and submits tasks; the callers keep their own in-process path and their
own way of reporting failures.

* ``client=``: a ``distributed.Client`` (any cluster), left open afterwards;
* ``scheduler=``: an address; a client is opened for the call and closed after it;
* otherwise a ``distributed.LocalCluster`` of ``workers`` processes (one thread each) is started
  for the call and closed after it.

Every worker imports what the tasks need once (``warm_up``) before anything is submitted, so
the first task's time is not an import.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["DaskRunner", "dask_available", "missing_dask", "WORKER_ENV"]

_log = logging.getLogger("cvxdp.dask")

#: the environment of the workers of a LocalCluster started here.  Dask starts workers with
#: ``MALLOC_TRIM_THRESHOLD_=65536``, which also freezes glibc's mmap threshold at 128 KiB: every
#: array of 16,384 doubles or more is then mapped and unmapped at each allocation, page faults
#: included.  The solvers allocate such arrays at every iteration; measured, ADMM on a 2^14-leaf
#: hierarchy ran 1.9x slower in a worker than in this process.  Arrays up to 32 MiB (glibc's own
#: dynamic ceiling) come from the heap again; Dask's trimming of freed memory is unchanged.
WORKER_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 * 1024 * 1024)}


def dask_available() -> bool:
    """Whether ``distributed`` can be imported."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        return False
    return True


def missing_dask(who: str) -> ImportError:
    """The error raised when Dask was asked for and is not installed."""
    return ImportError(f"{who}: Dask is not installed; pip install cvxdp[distributed]")


def _local_cluster(distributed, workers: int):
    """A LocalCluster of single-threaded worker processes started with :data:`WORKER_ENV`
    (glibc reads it at process start, so it goes in Dask's pre-spawn environment)."""
    import dask
    key = "distributed.nanny.pre-spawn-environ"
    env = {**dask.config.get(key, default={}), **WORKER_ENV}
    with dask.config.set({key: env}):
        return distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                        dashboard_address=None)


class DaskRunner:
    """A connection to a Dask cluster for one call; :meth:`close` closes what it opened.

    ``backend``: ``"local"`` (no cluster: :attr:`client` is ``None``), ``"dask"`` (Dask
    required) or ``"auto"`` (Dask when installed, else in this process -- unless a client or a
    scheduler was given, which requires Dask).  ``default_workers``: the LocalCluster's size
    when ``workers`` is not given.  ``warm_up``: run once on every worker before any task.
    """

    def __init__(self, who: str, backend: str, client=None, scheduler: str | None = None,
                 workers: int | None = None, retries: int = 0,
                 warm_up: Callable[[], Any] | None = None, default_workers: int = 2) -> None:
        self.who = who
        self.retries = retries
        self._owned: list = []
        self.client = None
        self.name, self.workers = "local", 1
        if backend == "local":
            return
        try:
            import distributed
        except ImportError:
            if backend == "dask" or client is not None or scheduler is not None:
                raise missing_dask(who) from None
            return
        if client is None:
            if scheduler is not None:
                client = distributed.Client(scheduler)
            else:
                cluster = _local_cluster(distributed, workers or default_workers)
                self._owned.append(cluster)
                client = distributed.Client(cluster)
            self._owned.insert(0, client)
        self.client = client
        try:
            if warm_up is not None:
                client.run(warm_up)
        except BaseException:
            self.close()
            raise
        self._as_completed = distributed.as_completed
        self.name = "dask"
        self.workers = len(client.scheduler_info().get("workers", {})) or 1

    def as_completed(self, fn: Callable, items: Sequence, *args: Any
                     ) -> Iterator[tuple[int, bool, Any]]:
        """Submit ``fn(item, *args)`` for every item (Dask retries each ``retries`` times);
        yield ``(position, True, result)`` or ``(position, False, exception)`` as they
        finish."""
        futures = [self.client.submit(fn, item, *args, retries=self.retries, pure=False)
                   for item in items]
        position = {f.key: i for i, f in enumerate(futures)}
        try:
            for fut in self._as_completed(futures):
                i = position[fut.key]
                if fut.status == "error":
                    yield i, False, fut.exception()
                else:
                    yield i, True, fut.result()
        finally:            # stopped early (an exception, an interrupt): nothing left running
            pending = [f for f in futures if not f.done()]
            if pending:
                self.client.cancel(pending)

    def close(self) -> None:
        for obj in self._owned:
            try:
                obj.close()
            except Exception as exc:  # noqa: BLE001 -- closing must not hide the result
                _log.warning("%s: closing %r failed: %r", self.who, obj, exc)
        self._owned = []

    def __enter__(self) -> "DaskRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
