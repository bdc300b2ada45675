"""The break-it JSON API and page, mounted by the service only when ``SAFETY_BREAKIT_DB`` is set.

Every player endpoint needs the player's secret token in the ``X-Player-Token`` header: tokens
are issued by the organiser (``dialogue-safety break-it invite``: an invite link per player) or,
on a round whose sign-up the organiser opened, by ``POST /break-it/api/players``. A player acts
only as themself: their tasks, their tries, their validations (never of their own attacks). Every
player action is rate-limited per token and per client address (:mod:`dialogue_safety.breakit.rates`).
Operators create rounds and
upload context pools through the ``/break-it/api/admin/*`` endpoints (:data:`admin_router`, under
:data:`ADMIN_PREFIX`), which need the API key (checked by the service, like ``/v1/*``; off when no
key is set), or with ``dialogue-safety break-it`` on the database directly.

Every attack is scored by the deployed model through the service's one door to it (the same path as
``/v1/classify``: :meth:`Host.score`) and by the round's reference models (A0, A(i-1): model directories loaded
in-process, once); the store records all the scores. Store calls run in a thread.

The routers are module-level; every route reaches the app's :class:`BreakItGame` through the
dependency :func:`game_of` (``app.state.breakit``). What the game needs from the service that
mounts it is :class:`Host` (the service's state implements it), so this package never imports
the service: the service imports it, mounts the routers with its error responses and puts the
admin router behind its API key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol, TypeVar

from fastapi import APIRouter, Depends, Query, Request
from fastapi import Path as PathParameter
from fastapi.security import APIKeyHeader
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from starlette.responses import FileResponse

from dialogue_safety.breakit.game import ATTACKS_PER_TASK, MAX_ID, TRIES_PER_ATTACK, Mode, TaskProgress, Verdict
from dialogue_safety.breakit.rates import RateLimits, parse_rates
from dialogue_safety.core.encoding import EncodedExample
from dialogue_safety.core.errors import Conflict, Forbidden, InvalidInput, NotFound, NotReady, Unauthenticated
from dialogue_safety.core.explain import DEFAULT_METHOD, Method
from dialogue_safety.core.limits import texts_in
from dialogue_safety.core.schema import Example, Label, Prediction, Turn

if TYPE_CHECKING:
    from dialogue_safety.breakit.store import Attack, BreakItStore, Context, Player, Round, Scores

PAGE = Path(__file__).parent / "static" / "break_it.html"
API_PREFIX = "/break-it/api"
ADMIN_PREFIX = f"{API_PREFIX}/admin"  # the service's API-key middleware guards everything under it
TOKEN_HEADER = "X-Player-Token"
T = TypeVar("T")


class Model(Protocol):
    """A reference model (what :class:`dialogue_safety.core.runtime.OnnxClassifier` offers)."""

    def encode(self, examples: Sequence[Example]) -> list[EncodedExample]: ...
    def predict_encoded(
        self, encoded: Sequence[EncodedExample], threshold: float | None = None
    ) -> list[Prediction]: ...


class Scored(Protocol):
    """What the service's door answers (:class:`dialogue_safety.service.state.Scored`)."""

    @property
    def outcomes(self) -> Sequence[Prediction | InvalidInput]: ...
    @property
    def served(self) -> Any: ...
    @property
    def model_id(self) -> str: ...
    @property
    def explanation(self) -> dict[str, Any] | None: ...


class Host(Protocol):
    """What the game needs from the service that mounts it (:class:`dialogue_safety.service.state.ServiceState`)."""

    @property
    def model_id(self) -> str:
        """The served model's id ("" before it is loaded)."""
        ...

    def require_ready(self) -> object:
        """Raise NotReady unless a model serves."""
        ...

    def check_item(self, utterance: str, turns: Sequence[str]) -> None:
        """The service's request limits for one message (SAFETY_MAX_UTTERANCE_CHARS...): InvalidInput."""
        ...

    async def score(
        self, examples: Sequence[Example], *, client: str, explain: Method | None = None, explain_history: bool = False
    ) -> Scored | None:
        """The service's one door to the served model (the path of ``/v1/classify``, its work charged to
        ``client``: each player apart); with ``explain``, the explanation ``/v1/classify`` gives."""
        ...

    def decide(self, prediction: Prediction, request_threshold: float | None = None, *, served: Any) -> dict[str, Any]:
        """The answer (``score``, ``label``, ``threshold``) for ``prediction`` made by the model ``served``."""
        ...

    def load_model(self, model_dir: Path) -> Model:
        """Another model directory, loaded like the served one (called in a thread)."""
        ...


# -- request bodies ---------------------------------------------------------------------------------
class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        """Every text of a body may be stored, and PostgreSQL's text cannot hold a NUL: refused here (422)."""
        if any("\x00" in text for text in texts_in(value)):  # a nested body checks its own fields
            raise ValueError("must not contain a NUL character (U+0000)")
        return value


class NewPlayer(_Body):
    nickname: str = Field(min_length=1, max_length=64, description="shown on the score board; unique")
    round: int | None = Field(None, ge=1, le=MAX_ID, description="the round to sign up for (default: newest open)")


class NewTask(_Body):
    mode: Mode = Field(description="offensive: fool the model with an offensive message; safe: make it flag a safe one")
    with_context: bool = Field(True, description="draw a dialogue context from the round's pool")
    round: int | None = Field(None, ge=1, le=MAX_ID, description="default: the newest open round")


class TurnBody(_Body):
    speaker: str | None = Field(None, max_length=64)
    text: str = Field(min_length=1)


class ScoreBody(_Body):
    history: list[TurnBody] = Field(default_factory=list)
    utterance: str = Field(min_length=1)
    explain: bool = Field(False, strict=True, description="add per-word Shapley contributions (utterance and history)")


class AttackBody(_Body):
    text: str = Field(min_length=1)


class ValidationBody(_Body):
    verdict: Verdict
    flagged: bool = False
    flag_reason: str | None = Field(None, max_length=2000, description="why it is flagged (needed with a flag)")
    contrast_text: str | None = Field(None, description="a minimal edit of the attack that flips its label")

    @model_validator(mode="after")
    def _a_flag_has_a_reason(self) -> ValidationBody:
        if self.flagged and not (self.flag_reason or "").strip():
            raise ValueError("a flag needs a reason: set flag_reason")
        return self


class NewRound(_Body):
    number: int = Field(ge=1, le=MAX_ID)
    references: dict[str, str] = Field(
        default_factory=dict, description='earlier models of the loop scored alongside, e.g. {"A0": "models/a0"}'
    )
    signup_open: bool = Field(False, description="anyone may register (else: only players the organiser invited)")
    rates: dict[str, dict[str, str]] = Field(
        default_factory=dict, description='rate limits overriding the defaults, e.g. {"try": {"player": "10/minute"}}'
    )


class RoundSettings(_Body):
    signup_open: bool | None = Field(None, description="turn open sign-up on or off")
    rates: dict[str, dict[str, str]] | None = Field(
        None, description="replace the round's rate overrides ({}: defaults)"
    )


class Invite(_Body):
    nicknames: list[str] = Field(min_length=1, max_length=500, description="one token per nickname")


class ContextUpload(_Body):
    source: str = Field("upload", max_length=100)
    contexts: list[list[TurnBody]] = Field(min_length=1, description="dialogues, each a list of turns, oldest first")


# -- views --------------------------------------------------------------------------------------------
def _round_view(rnd: Round, contexts: int) -> dict[str, Any]:
    return {
        "number": rnd.number,
        "model": rnd.model_id,
        "references": sorted(rnd.references),
        "open": rnd.open,
        "signup_open": bool(rnd.signup_open),
        "contexts": contexts,
        "rules": {"attacks_per_task": ATTACKS_PER_TASK, "tries_per_attack": TRIES_PER_ATTACK},
        "rates": parse_rates(rnd.rates),
    }


def _progress_view(progress: TaskProgress) -> dict[str, Any]:
    return {
        "slot": progress.slot,
        "tries_in_slot": progress.tries_in_slot,
        "fooled": progress.fooled_slots,
        "finished": progress.finished,
    }


def _attack_view(a: Attack) -> dict[str, Any]:
    return {
        "id": a.id,
        "round": a.round_number,
        "history": a.history,
        "text": a.text,
        "intended": a.intended_label,
        "slot": a.slot,
        "try": a.try_number,
        "model": a.model_id,
        "score": a.score,
        "label": a.model_label,
        "threshold": a.threshold,
        "reference_scores": a.reference_scores,
        "fooled": a.fooled,
        "created_at": a.created_at.isoformat(),
    }


def _context_view(c: Context | None) -> dict[str, Any] | None:
    return None if c is None else {"id": c.id, "source": c.source, "turns": c.turns}


def _example(history: list[Any], utterance: str) -> Example:
    turns = tuple(
        Turn(t["text"], t.get("speaker")) if isinstance(t, Mapping) else Turn(t.text, t.speaker) for t in history
    )
    return Example(utterance=utterance, history=turns)


def _predict_one(model: Model, example: Example) -> Prediction:
    [prediction] = model.predict_encoded(model.encode([example]))
    return prediction


class ReferenceModels:
    """The round's earlier models (role -> model directory), loaded once each by the host."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self._loaded: dict[Path, Model] = {}
        self._lock = asyncio.Lock()

    async def _get(self, directory: Path) -> Model:
        async with self._lock:
            if directory not in self._loaded:
                self._loaded[directory] = await asyncio.to_thread(self.host.load_model, directory)
            return self._loaded[directory]

    async def scores(self, references: Mapping[str, str], example: Example) -> dict[str, float]:
        out = {}
        for role, directory in sorted(references.items()):
            try:
                classifier = await self._get(Path(directory))
            except Exception as exc:  # noqa: BLE001
                raise NotReady(f"reference model {role} does not load from {directory}: {exc}") from exc
            prediction = await asyncio.to_thread(_predict_one, classifier, example)
            out[role] = float(prediction.score)
        return out


class BreakItGame:
    """The store and the scorers of one app's break-it game (its routes: :data:`router`, :data:`admin_router`)."""

    def __init__(self, host: Host, database: str) -> None:
        self.host = host
        self.database = database
        self.store: BreakItStore | None = None
        self.references = ReferenceModels(host)
        self.rates = RateLimits()

    async def open(self) -> None:
        try:
            from dialogue_safety.breakit.store import open_store  # imported here: the service runs without the extra
        except ImportError as exc:
            from dialogue_safety.extras import install_hint

            raise RuntimeError(
                f"SAFETY_BREAKIT_DB is set but the break-it extra is missing ({exc}); {install_hint('breakit')}"
            ) from exc
        self.store = await asyncio.to_thread(open_store, self.database)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a store call in a thread; the store's refusals become the domain errors (the service's statuses)."""
        from sqlalchemy.exc import OperationalError
        from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeoutError

        from dialogue_safety.breakit.store import (
            ConflictError,
            ForbiddenError,
            NotFoundError,
            StoreError,
            UnauthenticatedError,
        )

        if self.store is None:
            raise NotReady("the break-it database is not open")
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except NotFoundError as exc:
            raise NotFound(exc.message, field=exc.field) from None
        except ConflictError as exc:
            raise Conflict(exc.message, field=exc.field) from None
        except UnauthenticatedError as exc:
            raise Unauthenticated(exc.message, field=exc.field) from None
        except ForbiddenError as exc:
            raise Forbidden(exc.message, field=exc.field) from None
        except StoreError as exc:
            raise InvalidInput(exc.message, field=exc.field) from None
        except (OperationalError, SQLAlchemyTimeoutError) as exc:
            busy = isinstance(exc, SQLAlchemyTimeoutError) or any(w in str(exc.orig) for w in ("locked", "busy"))
            if not busy:
                raise  # not the load: a broken database is the server's error (500, logged)
            raise NotReady("the break-it database is busy; retry shortly") from None  # locked, or no connection free

    def require_store(self) -> BreakItStore:
        if self.store is None:
            raise NotReady("the break-it database is not open")
        return self.store

    async def round(self, number: int | None) -> Round:
        store = self.require_store()
        if number is None:
            return await self.call(store.latest_open_round)
        return await self.call(store.round, number)

    async def open_round(self, number: int | None, field: str = "round") -> Round:
        """:meth:`round`, refused 409 when it is closed: before a player's action is counted or scored (the store
        checks again when it writes)."""
        rnd = await self.round(number)
        if not rnd.open:
            raise Conflict(f"round {rnd.number} is closed", field=field)
        return rnd

    def check_text(self, text: str, field: str) -> None:
        """The service's request limits (SAFETY_MAX_UTTERANCE_CHARS...) for a player's message."""
        try:
            self.host.check_item(text, ())
        except InvalidInput as exc:
            raise InvalidInput(
                exc.message.replace("the utterance", f"the {field}"), code=exc.code, field=field
            ) from None

    async def limit(self, rnd: Round, action: str, request: Request, player: Player | None = None) -> None:
        """Count one ``action`` of ``player`` from the request's client address against the round's
        rate limits (429 ``rate_limited`` when one is spent)."""
        address = request.client.host if request.client else None
        self.rates.hit(rnd.number, rnd.rates, action, player=player.id if player else None, address=address)

    async def score(
        self, example: Example, player_id: str, *, explain: bool = False
    ) -> tuple[str, float, Label, float, dict[str, Any] | None]:
        """The deployed model's id, score, label and threshold for ``example`` through the service's one door
        (charged to the player), and with ``explain`` the explanation ``/v1/classify`` gives (history too)."""
        scored = await self.host.score(
            [example], client=f"player:{player_id}", explain=DEFAULT_METHOD if explain else None, explain_history=True
        )
        assert scored is not None  # no hang-up is watched here: the door always answers
        [outcome] = scored.outcomes[:1]
        if isinstance(outcome, InvalidInput):
            raise outcome
        decided = self.host.decide(outcome, None, served=scored.served)
        label, threshold = Label(decided["label"]), float(decided["threshold"])
        return scored.model_id, float(decided["score"]), label, threshold, scored.explanation

    async def score_attack(self, rnd: Round, example: Example, player_id: str) -> Scores:
        from dialogue_safety.breakit.store import Scores

        model_id, score, label, threshold, _ = await self.score(example, player_id)
        references = await self.references.scores(rnd.references, example)
        return Scores(model_id, score, label, threshold, references)


# -- the routes ---------------------------------------------------------------------------------------
def game_of(request: Request) -> BreakItGame:
    """The app's game (``app.state.breakit``: the service sets it when it mounts these routers)."""
    game: BreakItGame | None = getattr(request.app.state, "breakit", None)
    if game is None:
        raise NotReady("the break-it game is not enabled (SAFETY_BREAKIT_DB)")
    return game


Game = Annotated[BreakItGame, Depends(game_of)]
# every id and round number in a path or query: in range before any database sees it (MAX_ID)
RoundNumber = Annotated[int | None, Query(alias="round", ge=1, le=MAX_ID)]
TaskId = Annotated[int, PathParameter(ge=1, le=MAX_ID)]
AttackId = Annotated[int, PathParameter(ge=1, le=MAX_ID)]
RoundInPath = Annotated[int, PathParameter(ge=1, le=MAX_ID)]
_token_header = APIKeyHeader(name=TOKEN_HEADER, auto_error=False, description="the player's secret token")


async def player_of(game: Game, token: Annotated[str | None, Depends(_token_header)]) -> Player:
    """The player whose token the request carries (401 ``invalid_player_token`` otherwise)."""
    return await game.call(game.require_store().player_by_token, token)


if TYPE_CHECKING:
    Me = Player
else:
    Me = Annotated[Any, Depends(player_of)]

#: the players' endpoints (no API key)
router = APIRouter(prefix=API_PREFIX, tags=["break-it"])
#: the operators' endpoints: the service guards everything under ADMIN_PREFIX with its API key
admin_router = APIRouter(prefix=ADMIN_PREFIX, tags=["break-it"])
#: the page
page_router = APIRouter(tags=["break-it"])


@router.get("/round", summary="The round being played (default: the newest open one), its model and rules")
async def current_round(game: Game, number: RoundNumber = None) -> dict[str, Any]:
    rnd = await game.round(number)
    view = _round_view(rnd, await game.call(game.require_store().context_count, rnd.number))
    view["deployed"] = game.host.model_id or None
    return view


def _player_view(player: Player, token: str | None = None) -> dict[str, Any]:
    out = {"player_id": player.id, "nickname": player.nickname}
    if token is not None:
        out["token"] = token
    return out


@router.post("/players", summary="Sign up (only on a round whose sign-up the organiser opened)")
async def new_player(game: Game, body: NewPlayer, request: Request) -> dict[str, Any]:
    rnd = await game.round(body.round)
    if not rnd.signup_open:
        raise Forbidden(
            f"round {rnd.number} is by invitation: ask the organiser for your invite link", field="nickname"
        )
    await game.limit(rnd, "register", request)
    enrolment = await game.call(game.require_store().enrol, body.nickname, origin="signup")
    return _player_view(enrolment.player, enrolment.token)


@router.get("/players/me", summary="The player of the token (the page checks its stored token)")
async def get_me(me: Me) -> dict[str, Any]:
    return _player_view(me)


@router.post("/tasks", summary="Start a task: 5 attacks, up to 2 tries each")
async def new_task(game: Game, body: NewTask, me: Me, request: Request) -> dict[str, Any]:
    rnd = await game.open_round(body.round)
    await game.limit(rnd, "task", request, me)
    task, context = await game.call(game.require_store().start_task, rnd.number, me.id, body.mode, body.with_context)
    return {
        "task_id": task.id,
        "round": rnd.number,
        "mode": task.mode,
        "intended": Mode(task.mode).intended.value,
        "context": _context_view(context),
        "progress": _progress_view(TaskProgress.from_tries([])),
    }


@router.get("/tasks/{task_id}", summary="One of your tasks: its context, progress and tries")
async def get_task(game: Game, task_id: TaskId, me: Me) -> dict[str, Any]:
    task, context, progress, attacks = await game.call(game.require_store().task_state, task_id, me.id)
    return {
        "task_id": task.id,
        "round": task.round_number,
        "mode": task.mode,
        "intended": Mode(task.mode).intended.value,
        "context": _context_view(context),
        "progress": _progress_view(progress),
        "attacks": [_attack_view(a) for a in attacks],
    }


@router.post("/score", summary="The deployed model's live score for a draft, explained if asked (nothing stored)")
async def live_score(
    game: Game, body: ScoreBody, me: Me, request: Request, number: RoundNumber = None
) -> dict[str, Any]:
    game.host.check_item(body.utterance, [t.text for t in body.history])
    await game.limit(await game.open_round(number), "score", request, me)
    example = _example(body.history, body.utterance)
    model_id, score, label, threshold, explanation = await game.score(example, me.id, explain=body.explain)
    answer = {"model": model_id, "score": score, "label": label.value, "threshold": threshold}
    if explanation is not None:
        answer["explanation"] = explanation
    return answer


@router.post("/tasks/{task_id}/attacks", summary="Submit a try: scored by every model of the round, then stored")
async def submit_attack(game: Game, task_id: TaskId, body: AttackBody, me: Me, request: Request) -> dict[str, Any]:
    task, context, progress, _ = await game.call(game.require_store().task_state, task_id, me.id)
    if progress.finished:
        raise Conflict("this task is finished; start a new one", field="task_id")
    game.check_text(body.text, "text")
    rnd = await game.open_round(task.round_number, "task_id")
    await game.limit(rnd, "try", request, me)
    example = _example(context.turns if context else [], body.text)
    scores = await game.score_attack(rnd, example, me.id)
    attack, after = await game.call(game.require_store().record_attack, task_id, me.id, body.text, scores)
    return {"attack": _attack_view(attack), "progress": _progress_view(after)}


@router.get("/validations/todo", summary="Successful attacks by others for you to validate")
async def to_validate(
    game: Game, me: Me, number: RoundNumber = None, limit: int = Query(10, ge=1, le=100)
) -> dict[str, Any]:
    rnd = await game.round(number)
    attacks = await game.call(game.require_store().attacks_to_validate, rnd.number, me.id, limit)
    return {"round": rnd.number, "attacks": [_attack_view(a) for a in attacks]}


@router.post("/attacks/{attack_id}/validations", summary="Confirm or reject an attack's label; flag; contrast")
async def validate(game: Game, attack_id: AttackId, body: ValidationBody, me: Me, request: Request) -> dict[str, Any]:
    if body.contrast_text:
        game.check_text(body.contrast_text, "contrast_text")
    attack = await game.call(game.require_store().attack, attack_id)
    await game.limit(await game.open_round(attack.round_number, "attack_id"), "validate", request, me)
    v = await game.call(
        game.require_store().validate,
        attack_id,
        me.id,
        body.verdict,
        flagged=body.flagged,
        flag_reason=body.flag_reason,
        contrast_text=body.contrast_text,
    )
    return {"id": v.id, "attack_id": attack_id, "verdict": v.verdict, "flagged": v.flagged}


@router.get("/scoreboard", summary="Per-round score board (for players: it names them)")
async def scoreboard(game: Game, me: Me, number: RoundNumber = None) -> dict[str, Any]:
    rnd = await game.round(number)
    return {"round": rnd.number, "players": await game.call(game.require_store().scoreboard, rnd.number)}


@admin_router.post("/rounds", summary="Open a round against the deployed model (API key)")
async def new_round(game: Game, body: NewRound) -> dict[str, Any]:
    game.host.require_ready()
    parse_rates(body.rates)
    rnd = await game.call(
        game.require_store().create_round,
        body.number,
        game.host.model_id,
        body.references,
        signup_open=body.signup_open,
        rates=body.rates,
    )
    return _round_view(rnd, 0)


@admin_router.post("/rounds/{number}/settings", summary="Open or close sign-up; set rate limits (API key)")
async def round_settings(game: Game, number: RoundInPath, body: RoundSettings) -> dict[str, Any]:
    if body.rates is not None:
        parse_rates(body.rates)
    rnd = await game.call(game.require_store().configure_round, number, signup_open=body.signup_open, rates=body.rates)
    return _round_view(rnd, await game.call(game.require_store().context_count, number))


@admin_router.post("/players", summary="Invite players: one secret token per nickname (API key)")
async def invite(game: Game, body: Invite) -> dict[str, Any]:
    players = await game.call(game.require_store().enrol_all, body.nicknames, origin="invite")
    return {"players": [_player_view(e.player, e.token) for e in players]}


@admin_router.post("/rounds/{number}/contexts", summary="Upload a context pool for a round (API key)")
async def upload_contexts(game: Game, number: RoundInPath, body: ContextUpload) -> dict[str, Any]:
    turns = [[t.model_dump() for t in c] for c in body.contexts]
    added = await game.call(game.require_store().add_contexts, number, turns, body.source)
    return {"round": number, "added": added, "contexts": await game.call(game.require_store().context_count, number)}


@admin_router.post("/rounds/{number}/close", summary="Close a round (API key)")
async def close_round(game: Game, number: RoundInPath) -> dict[str, Any]:
    await game.call(game.require_store().close_round, number)
    return {"round": number, "open": False}


@page_router.get("/break-it", include_in_schema=False)
async def break_it_page() -> FileResponse:
    return FileResponse(PAGE, media_type="text/html; charset=utf-8")
