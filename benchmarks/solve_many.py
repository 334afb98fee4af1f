"""Benchmark: ``cvxdp.solve_many`` in this process against a 2-worker Dask LocalCluster.

``--n`` solves (default 200) of one small hierarchy problem (a binary hierarchy of
``--leaves`` leaves, default 2^10; the Laplace L1 likelihood of every node's noisy count, tree
consistency and ``x >= 0``; ``solver=cvxdp.ADMM``), each with its own noise draw: the bootstrap
case, one parametrised problem and a list of parameter dicts.  Printed:

* in this process (``backend="local"``): wall time, time per solve;
* on a ``distributed.LocalCluster`` of ``--workers`` processes (default 2, one thread each)
  started before the clock (``client=``): wall time and speedup over this process; whether the
  results are the same bits;
* the same with ``workers=2`` (the cluster started and closed inside the call);
* the same draws as a list of ``--n`` separate problems (each pickled and shipped), both ways;
* the pickled size of a task (``ManyResult.task_bytes``) for each.

Usage: ``python benchmarks/solve_many.py [--n 200] [--leaves 1024] [--workers 2] [--seed 0]``
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import cvxpy as cp

import cvxdp


def model(leaves: int, seed: int, n: int):
    rng = np.random.default_rng(seed)
    tree = cvxdp.workloads.hierarchy(n_leaves=leaves, branching=2)
    truth = tree.queries @ rng.poisson(3.0, leaves)
    scale = 2.0
    y = cp.Parameter(tree.n_nodes, name="y")
    x = cp.Variable(tree.n_nodes, name="x")
    prob = cp.Problem(cp.Minimize(cp.norm1(x - y) / scale),
                      [cvxdp.consistent(tree, x), x >= 0])
    draws = [truth + rng.laplace(0.0, scale, truth.size) for _ in range(n)]
    return prob, x, y, draws


def same(a, b) -> bool:
    return all(p.status == q.status and p.value == q.value
               and all(np.array_equal(p.variables[k], q.variables[k]) for k in p.variables)
               for p, q in zip(a, b))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--leaves", type=int, default=2 ** 10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import distributed

    print(f"solve_many benchmark: {args.n} solves, binary hierarchy of {args.leaves} leaves, "
          f"L1 + consistency + x >= 0, solver=cvxdp.ADMM")
    print(f"machine: {os.cpu_count()} cores; load average at start "
          f"{', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    prob, x, y, draws = model(args.leaves, args.seed, args.n)
    params = [{y: d} for d in draws]
    opts = dict(solver=cvxdp.ADMM)

    t = time.perf_counter()
    cvxdp.solve_many(prob, parameters=params[:2], **opts)          # imports, first solve
    warm = time.perf_counter() - t
    local = cvxdp.solve_many(prob, parameters=params, **opts)
    print(f"\nparametrised problem ({args.n} parameter dicts)")
    print(f"  this process:        {local.wall_time:7.2f} s  ({local.wall_time / args.n * 1e3:.1f} ms "
          f"per solve; {local.chunks} chunks; task {local.task_bytes / 1024:.0f} KB; "
          f"statuses {sorted(set(local.statuses))}; warm-up {warm:.2f} s)")

    t = time.perf_counter()
    cluster = distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1,
                                       processes=True, dashboard_address=None)
    client = distributed.Client(cluster)
    start = time.perf_counter() - t
    try:
        first = cvxdp.solve_many(prob, parameters=params, client=client, **opts)
        dask = cvxdp.solve_many(prob, parameters=params, client=client, **opts)
        print(f"  {args.workers}-worker cluster:    {dask.wall_time:7.2f} s  (speedup "
              f"{local.wall_time / dask.wall_time:.2f}x; {dask.chunks} chunks; task "
              f"{dask.task_bytes / 1024:.0f} KB; same bits as this process: "
              f"{same(local, dask)}; cluster start {start:.2f} s, first call "
              f"{first.wall_time:.2f} s with the workers' imports)")
        # fresh problems for each run: a solve writes its point back, and the next solve of
        # the same objects would start from it
        llist = cvxdp.solve_many([pickle_copy(prob, d) for d in draws], backend="local", **opts)
        dlist = cvxdp.solve_many([pickle_copy(prob, d) for d in draws], client=client, **opts)
        print(f"\nlist of {args.n} separate problems (each pickled and shipped)")
        print(f"  this process:        {llist.wall_time:7.2f} s  (task {llist.task_bytes / 1024:.0f} KB)")
        print(f"  {args.workers}-worker cluster:    {dlist.wall_time:7.2f} s  (speedup "
              f"{llist.wall_time / dlist.wall_time:.2f}x; task {dlist.task_bytes / 1024:.0f} KB; "
              f"same bits: {same(llist, dlist)})")
    finally:
        client.close()
        cluster.close()
    own = cvxdp.solve_many(prob, parameters=params, workers=args.workers, **opts)
    print(f"\nworkers={args.workers} (cluster started and closed inside the call): "
          f"{own.wall_time:.2f} s (speedup {local.wall_time / own.wall_time:.2f}x)")
    print(f"load average at end {', '.join(f'{v:.2f}' for v in os.getloadavg())}")


def pickle_copy(prob: cp.Problem, draw) -> cp.Problem:
    """The parametrised problem with the Parameter's value set, as its own Problem."""
    import pickle
    q = pickle.loads(pickle.dumps(prob))
    q.parameters()[0].value = draw
    return q


if __name__ == "__main__":
    main()
