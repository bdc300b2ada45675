"""Run a command of a table (name → module, help): the module is imported only when it is asked for.

``dialogue-safety`` (:mod:`dialogue_safety.cli.main`) dispatches here, and so does the repository's
``python -m lab.bench`` (outside the package); command modules never import their dispatcher.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from dialogue_safety.extras import extra_providing, install_hint, missing_distributions, missing_extra_message

#: our own top-level package: a missing module inside it is a bug, not a missing extra
OWN_PACKAGES = frozenset({"dialogue_safety"})


def usage(table: dict[str, tuple[str, str]], prog: str = "dialogue-safety", kind: str = "command") -> str:
    width = max(len(name) for name in table) + 2
    lines = [f"usage: {prog} <{kind}> [options]", "", f"{kind}s:"]
    lines += [f"  {name:<{width}} {help_}" for name, (_, help_) in table.items()]
    lines += ["", f"run '{prog} <{kind}> --help' for its options"]
    return "\n".join(lines)


def dispatch(
    table: dict[str, tuple[str, str]],
    argv: Sequence[str] | None,
    prog: str = "dialogue-safety",
    kind: str = "command",
    extras: dict[str, str] | None = None,
    own_packages: frozenset[str] = OWN_PACKAGES,
) -> int:
    """Run ``table[name]``'s module ``main(rest, prog=...)``, imported only when it is asked for.

    A command whose extra (``extras[name]``) is not installed fails with one line naming it, and so
    does any other missing third-party module: a missing install is not a traceback.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(usage(table, prog, kind))
        return 0
    name, rest = args[0], args[1:]
    if name not in table:
        print(f"{prog}: unknown {kind} {name!r}\n\n{usage(table, prog, kind)}", file=sys.stderr)
        return 2
    command = f"{prog} {name}"
    extra = (extras or {}).get(name)
    missing = missing_distributions(extra) if extra else []
    if extra and missing:
        print(missing_extra_message(command, extra, missing), file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(table[name][0])
        result: int = module.main(rest, prog=command)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if not top or top in own_packages:
            raise
        provider = extra_providing(top) or extra
        hint = f"the '{provider}' extra: {install_hint(provider)}" if provider else "reinstall the package"
        print(f"{command}: the Python module {top!r} is not installed; it comes with {hint}", file=sys.stderr)
        return 2
    return result
