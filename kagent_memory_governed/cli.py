"""The ``kagent-memory-governed`` command.

``static``, ``run`` and ``test`` are upstream ``kagent-adk``'s commands, with the same arguments, run
with governed memory installed. ``migrate``, ``sweep``, ``doctor``, ``demo`` and ``serve`` (the memory service)
are this package's own.
Output and errors are content-free: counts, revisions and reason codes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import warnings
from collections.abc import Awaitable, Callable

from pydantic import ValidationError

from kagent_memory_governed.embedded import database_url, describe, key_store
from kagent_memory_governed.errors import ConfigurationError, GovernedMemoryError, Reason
from kagent_memory_governed.mode import check, connect, load
from kagent_memory_governed.settings import Settings, problems
from kagent_memory_governed.store import Store


def _migrate(to: str) -> Callable[[Store], Awaitable[None]]:
    async def migrate(store: Store) -> None:
        print(f"governed memory schema at revision {await store.migrate(to)}")

    return migrate


async def _sweep(store: Store) -> None:
    await store.check_ready()
    print(f"swept {await store.sweep()} expired entries")


async def _with_store(settings: Settings, work: Callable[[Store], Awaitable[None]]) -> None:
    keys = key_store(settings)  # first: a refused key store is then the only line, before any database
    try:
        policy = settings.load_policy()
        url = database_url(settings)
        print(f"database: {describe(settings)}")
        store = Store.connect(url, policy, keys=keys)
    except BaseException:
        await keys.close()
        raise
    try:
        await work(store)
    finally:
        await store.close()


UPSTREAM_COMMANDS = ("static", "run", "test")


def _upstream(argv: list[str]) -> int:
    from kagent_memory_governed.activation import EXIT_ACTIVATION_FAILED

    try:
        settings = load()  # before kagent is imported: a refusal is then the only line
        settings.trust()
        store = connect(settings)  # the service's data plane, or the in-process store (``mode``)
        from kagent_memory_governed.adk.runtime import install

        install(settings=settings, store=store)
    except (ConfigurationError, GovernedMemoryError) as error:  # each names settings and codes, never values
        print(f"kagent-memory-governed: activation failed: {error}", file=sys.stderr)
        return EXIT_ACTIVATION_FAILED
    except Exception as error:  # a defect: its type only, never a traceback that could quote a value
        print(f"kagent-memory-governed: activation failed: {type(error).__name__}", file=sys.stderr)
        return EXIT_ACTIVATION_FAILED
    from kagent.adk.cli import run_cli

    sys.argv = ["kagent-adk", *argv]
    run_cli()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in UPSTREAM_COMMANDS:
        return _upstream(argv)
    parser = argparse.ArgumentParser(prog="kagent-memory-governed", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    migrate = commands.add_parser("migrate", help="create or upgrade the store schema in the configured database")
    migrate.add_argument("--to", default="head", help="the revision to upgrade or downgrade to (default: head)")
    commands.add_parser("sweep", help="physically delete expired entries now; prints a count")
    commands.add_parser("demo", help="the governed lifecycle, step by step, on the embedded default")
    commands.add_parser("doctor", help="content-free checks that this environment runs governed memory")
    commands.add_parser("serve", help="the governed memory service: the store, its data plane and the control API")
    for name in UPSTREAM_COMMANDS:
        commands.add_parser(name, help=f"kagent-adk {name} with governed memory installed", add_help=False)
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from kagent_memory_governed.doctor import main_report

        return main_report()
    if args.command == "serve":
        from kagent_memory_governed.service.process import EXIT_CONFIG
        from kagent_memory_governed.service.process import main as serve

        try:
            return serve(load())
        except ConfigurationError as error:
            print(f"kagent-memory-governed: not serving: {error}", file=sys.stderr)
            return EXIT_CONFIG
    try:
        settings = check(Settings())
        if args.command == "demo":
            os.environ.setdefault("LOG_LEVEL", "ERROR")  # before kagent configures logging on import
            warnings.filterwarnings("ignore", message=r".*EXPERIMENTAL.*")
            try:
                from kagent_memory_governed.testing.demo import run
            except ImportError:
                print(
                    "the demo needs the testing extra: pip install 'kagent-memory-governed[testing]'", file=sys.stderr
                )
                return 2
            asyncio.run(run(settings))
        else:
            asyncio.run(_with_store(settings, _migrate(args.to) if args.command == "migrate" else _sweep))
    except ConfigurationError as error:
        print(f"configuration error: {error}", file=sys.stderr)
        return 2
    except ValidationError as error:  # never print input values: a URL may carry a password
        print(f"configuration error: {problems(error)}", file=sys.stderr)
        return 2
    except GovernedMemoryError as error:
        print(f"refused: {error.explained()}", file=sys.stderr)
        return 1
    except Exception as error:  # a defect: one content-free line, never a traceback that could quote a value
        print(f"failed: {Reason.INTERNAL_ERROR.value} ({type(error).__name__})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
