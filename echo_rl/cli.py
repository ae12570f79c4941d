"""`echo-rl`: one subcommand per module in ``echo_rl.commands``.

Each command module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``. Bad input (a :class:`ConfigError`, or an ImportError for
a missing extra) prints one line and exits 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from echo_rl.config import ConfigError


def _command_modules() -> list:
    import echo_rl.commands as pkg

    mods = [importlib.import_module(f"echo_rl.commands.{m.name}") for m in pkgutil.iter_modules(pkg.__path__)]
    return sorted((m for m in mods if hasattr(m, "NAME")), key=lambda m: m.NAME)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="echo-rl", description=__doc__.splitlines()[0].strip("`: "))
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import MODULE first: it registers your own tasks, backbones or baselines "
                             "(repeatable; also $ECHO_RL_PLUGINS and entry points, see echo_rl.plugins)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for mod in _command_modules():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser



def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        from echo_rl.plugins import load_plugins  # needed on this path only

        load_plugins(args.plugin)  # user registrations before any name is checked
        return int(args._run(args) or 0)
    except ConfigError as exc:
        print(f"echo-rl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        if "pip install" not in str(exc):
            raise
        print(f"echo-rl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"echo-rl {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
