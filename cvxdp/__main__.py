"""Command line: ``python -m cvxdp tour [--fast]``."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cvxdp", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    tour = sub.add_parser("tour", help="solve every family with the custom method and a standard "
                                       "solver and print a comparison table")
    tour.add_argument("--fast", action="store_true", help="small sizes (seconds)")
    args = parser.parse_args(argv)
    if args.command == "tour":
        from .tour import adult_dir, format_rows, run_tour

        d = adult_dir()
        print("cvxdp tour: custom methods against standard solvers on the same cvxpy models")
        print(f"Adult data: {d if d else 'not found (synthetic data instead)'}\n")
        rows = run_tour(fast=args.fast)
        print(format_rows(rows))
        print("\ngap = (objective - reference objective) / max(1, |reference|); "
              "times are whole prob.solve calls.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
