"""``dialogue-safety serve``: run the HTTP service (uvicorn, one worker per process).

Flags override the ``SAFETY_*`` environment; everything else comes from it (see
docs/api.md, "Settings"). Scale out with more processes/containers, not workers.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any, Literal, get_args, get_origin

from pydantic import ValidationError

from dialogue_safety.core.model_dir import default_model_dir, model_dir_candidates, model_dir_problem
from dialogue_safety.service.settings import ENV_PREFIX, ServiceSettings


def model_hint() -> str:
    """What to do when no model directory is found: where the bundled model was looked for."""
    searched = ", ".join(str(c) for c in model_dir_candidates())
    return (
        f"the bundled model is looked for in: {searched}; point the service at an exported model directory with "
        "--model DIR or SAFETY_MODEL_DIR=DIR (dialogue-safety export writes one)"
    )


MODEL_FAILED = 3  # exit status when the model cannot be loaded (a supervisor restarts or alerts)
FLAG_NAMES = {"model_dir": "--model"}
SECRET_SETTINGS = {"api_key"}  # environment only: a flag would show in `ps`


def _scalar_type(annotation: Any) -> Any:
    if get_origin(annotation) is Literal:
        return annotation
    args = [a for a in get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation


def build_parser(prog: str) -> argparse.ArgumentParser:
    """One flag per setting (``--max-wait-ms`` for ``SAFETY_MAX_WAIT_MS``...), except secrets."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Serve the dialogue safety classifier over HTTP (uvicorn, one worker). Every flag overrides "
        "its SAFETY_* environment variable; the API key is read from SAFETY_API_KEY only. See docs/api.md.",
    )
    for name, info in ServiceSettings.model_fields.items():
        if name in SECRET_SETTINGS:
            continue
        flag = FLAG_NAMES.get(name, "--" + name.replace("_", "-"))
        env = f"{ENV_PREFIX}{name.upper()}"
        kind = _scalar_type(info.annotation)
        default = f"${env} or " + (str(default_model_dir()) if name == "model_dir" else str(info.default))
        help_ = f"{info.description} (default: {default})"
        if kind is bool:
            p.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_)
        elif get_origin(kind) is Literal:
            p.add_argument(flag, dest=name, choices=get_args(kind), default=None, help=help_)
        else:
            p.add_argument(flag, dest=name, type=kind, default=None, help=help_)
    return p


def settings_from_args(args: argparse.Namespace) -> ServiceSettings:
    overrides: dict[str, Any] = {k: v for k, v in vars(args).items() if v is not None}
    return ServiceSettings(**overrides)


def main(argv: Sequence[str] | None = None, prog: str = "dialogue-safety serve") -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        settings = settings_from_args(args)
    except ValidationError as exc:
        print(f"{prog}: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    problem = model_dir_problem(settings.model_dir)
    if problem:
        hint = model_hint() if args.model_dir is None else "dialogue-safety export writes a model directory"
        print(f"{prog}: {problem}; {hint}", file=sys.stderr)
        return 2
    if settings.policy is not None:  # a bad policy file stops the start: file, line and problem
        from dialogue_safety.core.model_card import ModelCard
        from dialogue_safety.core.policy import PolicyError, load_policy

        try:
            load_policy(settings.policy, ModelCard.load(settings.model_dir).heads)
        except PolicyError as exc:
            print(f"{prog}: invalid policy: {exc}", file=sys.stderr)
            return 2

    from dialogue_safety.service.memory import fix_trim_threshold, give_back_freed_memory, settle_heap
    from dialogue_safety.service.server import uvicorn_config

    fix_trim_threshold()  # before the model and the first request bodies are allocated
    import uvicorn

    from dialogue_safety.service.app import create_app

    level = "DEBUG" if settings.log_level == "trace" else settings.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server: uvicorn.Server | None = None

    failed: list[str] = []

    def stop_on_fatal(error: str) -> None:  # the model cannot load: exit instead of answering 503 forever
        failed.append(error)
        if server is not None:
            server.should_exit = True

    config = None

    def on_ready() -> None:  # on the event loop, once the model serves
        settle_heap()
        if config is not None:
            give_back_freed_memory(config.connection_guard)

    app = create_app(settings, on_fatal=stop_on_fatal, on_ready=on_ready)
    config = uvicorn_config(app, settings)
    server = uvicorn.Server(config)
    server.run()
    if failed:
        print(f"{prog}: the model in {settings.model_dir} failed to load: {failed[-1]}", file=sys.stderr)
        return MODEL_FAILED
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
