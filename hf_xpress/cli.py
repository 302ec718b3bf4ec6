"""`hf-xpress` command line: one sub-command per job, each implemented in the module named for it."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# sub-command -> "module:function" where function(subparsers) adds the sub-command's parser and sets `func`.
COMMANDS: dict[str, str] = {
    "demo": "hf_xpress.demo:add_parser",
    "data": "hf_xpress.training:add_data_parser",
    "train": "hf_xpress.training:add_train_parser",
    "tau": "hf_xpress.training:add_tau_parser",
    "ship": "hf_xpress.training:add_ship_parser",
    "convert": "hf_xpress.conversion:add_convert_parser",
    "export": "hf_xpress.conversion:add_export_parser",
    "push": "hf_xpress.hub:add_push_parser",
    "bench": "hf_xpress.benchmarking:add_parser",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-xpress", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for target in COMMANDS.values():
        module, function = target.split(":")
        getattr(importlib.import_module(module), function)(subparsers)
    return parser


def report_bad_input(command: str, run) -> int:
    """`run()`'s exit status; bad input (our `ValueError`s and `ConversionError`s, a path that is missing, of the
    wrong kind or not permitted) is reported as one line naming the problem, exit status 2, a failed Hub upload
    likewise with exit status 1; `HF_XPRESS_TRACEBACK=1` shows the traceback instead."""
    from .conversion import ConversionError
    from .hub import PublishError

    try:
        return int(run() or 0)
    except (ConversionError, ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError,
            PermissionError, argparse.ArgumentTypeError, PublishError) as err:
        if os.environ.get("HF_XPRESS_TRACEBACK"):
            raise
        print(f"{command}: error: {err}", file=sys.stderr)
        return 1 if isinstance(err, PublishError) else 2


def main(argv: list[str] | None = None) -> int:
    """Run one sub-command (see `report_bad_input` for how errors are reported)."""
    args = build_parser().parse_args(argv)
    return report_bad_input(f"hf-xpress {args.command}", lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
