"""The break-it JSON API and page, mounted by the service only when ``SAFETY_BREAKIT_DB`` is set.

Players (pseudonymous ids handed out by ``POST /break-it/api/players``) need no API key: enable
the game only where your red-teamers are (an internal network). Operators create rounds and
upload context pools through the ``/break-it/api/admin/*`` endpoints, which need the API key
(checked by :mod:`dialogue_safety.service.auth`, like ``/v1/*``; off when no key is set), or with
``dialogue-safety break-it`` on the database directly.

Every attack is scored by the deployed model through the service's batcher (the same path as
``/v1/classify``) and by the round's reference models (A0, A(i-1): model directories loaded
in-process, once); the store records all the scores. Store calls run in a thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import FileResponse

from dialogue_safety.breakit.game import ATTACKS_PER_TASK, TRIES_PER_ATTACK, Mode, TaskProgress, Verdict
from dialogue_safety.core.schema import Example, Label, Prediction, Turn
from dialogue_safety.service.auth import BREAKIT_ADMIN_PREFIX
from dialogue_safety.service.errors import Conflict, InvalidInput, NotFound, NotReady

if TYPE_CHECKING:
    from dialogue_safety.breakit.store import Attack, BreakItStore, Context, Round, Scores
    from dialogue_safety.service.api import Classifier, ServiceState

PAGE = Path(__file__).parent / "static" / "break_it.html"
T = TypeVar("T")


# -- request bodies ---------------------------------------------------------------------------------
class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NewPlayer(_Body):
    nickname: str = Field(min_length=1, max_length=64, description="shown on the score board")


class NewTask(_Body):
    player_id: str
    mode: Mode = Field(description="offensive: fool the model with an offensive message; safe: make it flag a safe one")
    with_context: bool = Field(True, description="draw a dialogue context from the round's pool")
    round: int | None = Field(None, description="default: the newest open round")


class TurnBody(_Body):
    speaker: str | None = Field(None, max_length=64)
    text: str = Field(min_length=1)


class ScoreBody(_Body):
    history: list[TurnBody] = Field(default_factory=list)
    utterance: str = Field(min_length=1)


class AttackBody(_Body):
    player_id: str
    text: str = Field(min_length=1)


class ValidationBody(_Body):
    player_id: str
    verdict: Verdict
    flagged: bool = False
    flag_reason: str | None = Field(None, max_length=2000)
    contrast_text: str | None = Field(None, description="a minimal edit of the attack that flips its label")


class NewRound(_Body):
    number: int = Field(ge=1)
    references: dict[str, str] = Field(
        default_factory=dict, description='earlier models of the loop scored alongside, e.g. {"A0": "models/a0"}'
    )


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
        "contexts": contexts,
        "rules": {"attacks_per_task": ATTACKS_PER_TASK, "tries_per_attack": TRIES_PER_ATTACK},
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


def _predict_one(classifier: Classifier, example: Example) -> Prediction:
    [prediction] = classifier.predict_encoded(classifier.encode([example]))
    return prediction


class ReferenceModels:
    """The round's earlier models (role -> model directory), loaded once each with the service's factory."""

    def __init__(self, state: ServiceState) -> None:
        self.state = state
        self._loaded: dict[Path, Classifier] = {}
        self._lock = asyncio.Lock()

    async def _get(self, directory: Path) -> Classifier:
        async with self._lock:
            if directory not in self._loaded:
                settings = self.state.settings.model_copy(update={"model_dir": directory})
                self._loaded[directory] = await asyncio.to_thread(self.state.factory, settings)
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
    """The store, the scorers and the routes of one app's break-it game."""

    def __init__(self, state: ServiceState, database: str) -> None:
        self.state = state
        self.database = database
        self.store: BreakItStore | None = None
        self.references = ReferenceModels(state)

    async def open(self) -> None:
        try:
            from dialogue_safety.breakit.store import open_store  # imported here: the service runs without the extra
        except ImportError as exc:
            raise RuntimeError(
                f"SAFETY_BREAKIT_DB is set but the break-it extra is missing ({exc}): "
                "pip install 'dialogue-safety[breakit]'"
            ) from exc
        self.store = await asyncio.to_thread(open_store, self.database)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a store call in a thread; the store's refusals become the service's errors."""
        from dialogue_safety.breakit.store import ConflictError, NotFoundError, StoreError

        if self.store is None:
            raise NotReady("the break-it database is not open")
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except NotFoundError as exc:
            raise NotFound(exc.message, field=exc.field) from None
        except ConflictError as exc:
            raise Conflict(exc.message, field=exc.field) from None
        except StoreError as exc:
            raise InvalidInput(exc.message, field=exc.field) from None

    def _store(self) -> BreakItStore:
        if self.store is None:
            raise NotReady("the break-it database is not open")
        return self.store

    async def _round(self, number: int | None) -> Round:
        store = self._store()
        if number is None:
            return await self._call(store.latest_open_round)
        return await self._call(store.round, number)

    def _check_text(self, text: str, field: str) -> None:
        """The service's request limits (SAFETY_MAX_UTTERANCE_CHARS...) for a player's message."""
        try:
            self.state.limits.check_item(text, ())
        except InvalidInput as exc:
            raise InvalidInput(
                exc.message.replace("the utterance", f"the {field}"), code=exc.code, field=field
            ) from None

    async def score(self, example: Example) -> tuple[str, float, Label, float]:
        """The deployed model's score, label and threshold, through the service's batcher."""
        served = self.state.require_served()  # the model, id and threshold stay together across a hot swap
        [prediction] = await served.batcher.submit([example])
        decided = self.state.decide(prediction, None, served=served)
        return served.model_id, float(decided["score"]), Label(decided["label"]), float(decided["threshold"])

    async def score_attack(self, rnd: Round, example: Example) -> Scores:
        from dialogue_safety.breakit.store import Scores

        model_id, score, label, threshold = await self.score(example)
        references = await self.references.scores(rnd.references, example)
        return Scores(model_id, score, label, threshold, references)

    def router(self) -> APIRouter:
        from dialogue_safety.service.api import ERROR_RESPONSES, api_key_declaration

        store_ = self._store
        api = APIRouter(prefix="/break-it/api", tags=["break-it"], responses=ERROR_RESPONSES)
        # dialogue_safety.service.auth.ApiKeyMiddleware guards everything under BREAKIT_ADMIN_PREFIX (off without a key)
        admin = APIRouter(
            prefix=BREAKIT_ADMIN_PREFIX,
            tags=["break-it"],
            dependencies=api_key_declaration(self.state.settings),
            responses=ERROR_RESPONSES,
        )

        @api.get("/round", summary="The round being played (default: the newest open one), its model and rules")
        async def current_round(number: int | None = Query(None, alias="round")) -> dict[str, Any]:
            rnd = await self._round(number)
            view = _round_view(rnd, await self._call(store_().context_count, rnd.number))
            view["deployed"] = self.state.model_id or None
            return view

        @api.post("/players", summary="Register a pseudonymous player")
        async def new_player(body: NewPlayer) -> dict[str, Any]:
            player = await self._call(store_().register_player, body.nickname)
            return {"player_id": player.id, "nickname": player.nickname}

        @api.get("/players/{player_id}", summary="A registered player (the page checks its stored id)")
        async def get_player(player_id: str) -> dict[str, Any]:
            player = await self._call(store_().player, player_id)
            return {"player_id": player.id, "nickname": player.nickname}

        @api.post("/tasks", summary="Start a task: 5 attacks, up to 2 tries each")
        async def new_task(body: NewTask) -> dict[str, Any]:
            rnd = await self._round(body.round)
            task, context = await self._call(
                store_().start_task, rnd.number, body.player_id, body.mode, body.with_context
            )
            return {
                "task_id": task.id,
                "round": rnd.number,
                "mode": task.mode,
                "intended": Mode(task.mode).intended.value,
                "context": _context_view(context),
                "progress": _progress_view(TaskProgress.from_tries([])),
            }

        @api.get("/tasks/{task_id}", summary="A task's context, progress and tries")
        async def get_task(task_id: int) -> dict[str, Any]:
            task, context, progress, attacks = await self._call(store_().task_state, task_id)
            return {
                "task_id": task.id,
                "round": task.round_number,
                "mode": task.mode,
                "intended": Mode(task.mode).intended.value,
                "context": _context_view(context),
                "progress": _progress_view(progress),
                "attacks": [_attack_view(a) for a in attacks],
            }

        @api.post("/score", summary="The deployed model's live score for a draft (nothing is stored)")
        async def live_score(body: ScoreBody) -> dict[str, Any]:
            self.state.limits.check_item(body.utterance, [t.text for t in body.history])
            model_id, score, label, threshold = await self.score(_example(body.history, body.utterance))
            return {"model": model_id, "score": score, "label": label.value, "threshold": threshold}

        @api.post("/tasks/{task_id}/attacks", summary="Submit a try: scored by every model of the round, then stored")
        async def submit_attack(task_id: int, body: AttackBody) -> dict[str, Any]:
            task, context, progress, _ = await self._call(store_().task_state, task_id)
            if task.player_id != body.player_id:
                raise Conflict("this task belongs to another player", field="player_id")
            if progress.finished:
                raise Conflict("this task is finished; start a new one", field="task_id")
            self._check_text(body.text, "text")
            rnd = await self._round(task.round_number)
            example = _example(context.turns if context else [], body.text)
            scores = await self.score_attack(rnd, example)
            attack, after = await self._call(store_().record_attack, task_id, body.player_id, body.text, scores)
            return {"attack": _attack_view(attack), "progress": _progress_view(after)}

        @api.get("/validations/todo", summary="Successful attacks by others for this player to validate")
        async def to_validate(
            player_id: str, number: int | None = Query(None, alias="round"), limit: int = Query(10, ge=1, le=100)
        ) -> dict[str, Any]:
            rnd = await self._round(number)
            await self._call(store_().player, player_id)
            attacks = await self._call(store_().attacks_to_validate, rnd.number, player_id, limit)
            return {"round": rnd.number, "attacks": [_attack_view(a) for a in attacks]}

        @api.post("/attacks/{attack_id}/validations", summary="Confirm or reject an attack's label; flag; contrast")
        async def validate(attack_id: int, body: ValidationBody) -> dict[str, Any]:
            if body.contrast_text:
                self._check_text(body.contrast_text, "contrast_text")
            v = await self._call(
                store_().validate,
                attack_id,
                body.player_id,
                body.verdict,
                flagged=body.flagged,
                flag_reason=body.flag_reason,
                contrast_text=body.contrast_text,
            )
            return {"id": v.id, "attack_id": attack_id, "verdict": v.verdict, "flagged": v.flagged}

        @api.get("/scoreboard", summary="Per-round score board")
        async def scoreboard(number: int | None = Query(None, alias="round")) -> dict[str, Any]:
            rnd = await self._round(number)
            return {"round": rnd.number, "players": await self._call(store_().scoreboard, rnd.number)}

        @admin.post("/rounds", summary="Open a round against the deployed model (API key)")
        async def new_round(body: NewRound) -> dict[str, Any]:
            self.state.require_ready()
            rnd = await self._call(store_().create_round, body.number, self.state.model_id, body.references)
            return _round_view(rnd, 0)

        @admin.post("/rounds/{number}/contexts", summary="Upload a context pool for a round (API key)")
        async def upload_contexts(number: int, body: ContextUpload) -> dict[str, Any]:
            turns = [[t.model_dump() for t in c] for c in body.contexts]
            added = await self._call(store_().add_contexts, number, turns, body.source)
            return {"round": number, "added": added, "contexts": await self._call(store_().context_count, number)}

        @admin.post("/rounds/{number}/close", summary="Close a round (API key)")
        async def close_round(number: int) -> dict[str, Any]:
            await self._call(store_().close_round, number)
            return {"round": number, "open": False}

        page = APIRouter(tags=["break-it"])

        @page.get("/break-it", include_in_schema=False)
        async def break_it_page() -> FileResponse:
            return FileResponse(PAGE, media_type="text/html; charset=utf-8")

        router = APIRouter()
        router.include_router(api)
        router.include_router(admin)
        router.include_router(page)
        return router
