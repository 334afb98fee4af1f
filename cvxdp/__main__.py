"""Command line of cvxdp.

Commands:
  tour      solve every implemented family with its cvxdp method and with a standard solver
            (Clarabel) on the same cvxpy model, and print a comparison row as each finishes:
            objective, relative gap to the standard solver, both wall times and the speed-up.
            About 1-2 minutes (--fast: about 15 seconds).

Options of tour:
  --fast    small sizes for every row

Environment:
  CVXDP_ADULT_DIR   folder with adult.csv and adult-domain.json (the UCI Adult data); the
                    tour uses it when present (also ../shared/data/adult), synthetic data
                    otherwise.

The tour writes no files.
"""
from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    from . import __version__
    parser = argparse.ArgumentParser(prog="python -m cvxdp", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"cvxdp {__version__}")
    sub = parser.add_subparsers(dest="command")
    tour = sub.add_parser("tour", help="custom methods against a standard solver (1-2 minutes)",
                          description="Solve every family with its cvxdp method and with Clarabel "
                                      "on the same cvxpy model; a row per problem as it finishes.")
    tour.add_argument("--fast", action="store_true", help="small sizes for every row (about 15 s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "tour":
        from .tour import adult_dir, format_header, format_row, run_tour

        d = adult_dir()
        print("cvxdp tour: custom methods against standard solvers on the same cvxpy models")
        print(f"Adult data: {d if d else 'not found (synthetic data instead)'}\n")
        print(format_header(), flush=True)
        run_tour(fast=args.fast, on_row=lambda row: print(format_row(row), flush=True))
        print("\ngap = (objective - reference objective) / max(1, |reference|); "
              "times are whole prob.solve calls.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
