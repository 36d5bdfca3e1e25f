"""``fs3 config-template SERVICE``: print a config file with every option, its default and its meaning."""

from __future__ import annotations

import argparse
import sys

from fs3.config import SERVICE_CONFIGS, load_config, to_toml
from fs3.errors import FS3Error


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fs3 config-template", description=(__doc__ or "").replace("``", "'"))
    p.add_argument("service", choices=sorted(SERVICE_CONFIGS))
    p.add_argument("--check", metavar="FILE", help="validate FILE for SERVICE instead of printing a template")
    args = p.parse_args(argv)
    cls = SERVICE_CONFIGS[args.service]
    if args.check:
        try:
            load_config(cls, args.check)
        except FS3Error as e:
            sys.stderr.write(f"fs3 config-template: {e.message}\n")
            return 2  # as the daemon's own exit for a bad config
        print(f"{args.check}: valid {args.service} config")
        return 0
    doc = (cls.__doc__ or "").strip()
    print(
        f"# fs3 {args.service} configuration. {doc}\n# Every key is optional; the values shown are the defaults.\n"
    )
    print(to_toml(cls()), end="")
    return 0
