"""The attack store: rounds, context pools, players, tasks, attacks and validations in one database.

SQLAlchemy 2 with Alembic migrations (``dialogue_safety/breakit/migrations``; :func:`open_store` upgrades
the schema to head before use). The embedded default is SQLite in WAL mode with ``synchronous=FULL``
(a committed attack survives a crash) and ``BEGIN IMMEDIATE`` transactions (one writer at a time,
so concurrent players never interleave a task's read-check-write); a shared deployment passes a
PostgreSQL URL (``postgresql+psycopg://...``), where the task row is locked ``FOR UPDATE``.
A unique (task, slot, try) key backs the rules up in both.

The store is synchronous (the API calls it in a thread) and knows nothing of HTTP or models:
callers score the attack and pass the scores in.
"""

from __future__ import annotations

import hashlib
import random
import secrets
import threading
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    case,
    create_engine,
    event,
    func,
    select,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from dialogue_safety.breakit.game import Mode, TaskProgress, Verdict, fooled, is_validated
from dialogue_safety.core.schema import Label

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 10_000


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Player(Base):
    """A player: a nickname shown on the board and the hash of the secret token that authenticates them."""

    __tablename__ = "players"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # random, pseudonymous
    nickname: Mapped[str] = mapped_column(String(64))
    nickname_key: Mapped[str | None] = mapped_column(String(64), unique=True, nullable=True)  # nickname_key()
    token_hash: Mapped[str | None] = mapped_column(String(64), unique=True, nullable=True)  # sha256 of the token
    origin: Mapped[str] = mapped_column(String(16), default="signup")  # invite | signup | legacy (before tokens)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Round(Base):
    """A round: the model under attack and the earlier models of the loop (A0, A(i-1)) scored alongside."""

    __tablename__ = "rounds"
    number: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    model_id: Mapped[str] = mapped_column(String(200))  # <name>@<version> of the model under attack
    references: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # role ("A0") -> model directory
    open: Mapped[bool] = mapped_column(Boolean, default=True)
    signup_open: Mapped[bool] = mapped_column(Boolean, default=False)  # anyone may register (else: invites only)
    rates: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # overrides of the default rate limits
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Context(Base):
    """A dialogue context a player may attack in (turns oldest first: ``[{"speaker", "text"}]``)."""

    __tablename__ = "contexts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    round_number: Mapped[int] = mapped_column(ForeignKey("rounds.number"), index=True)
    source: Mapped[str] = mapped_column(String(100))
    turns: Mapped[list[Any]] = mapped_column(JSON)


class Task(Base):
    __tablename__ = "tasks"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    round_number: Mapped[int] = mapped_column(ForeignKey("rounds.number"), index=True)
    player_id: Mapped[str] = mapped_column(ForeignKey("players.id"), index=True)
    mode: Mapped[str] = mapped_column(String(16))
    context_id: Mapped[int | None] = mapped_column(ForeignKey("contexts.id"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Attack(Base):
    """One try: the text, its context, the intended label and every model's score."""

    __tablename__ = "attacks"
    __table_args__ = (UniqueConstraint("task_id", "slot", "try_number", name="uq_attack_try"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    round_number: Mapped[int] = mapped_column(ForeignKey("rounds.number"), index=True)
    player_id: Mapped[str] = mapped_column(ForeignKey("players.id"), index=True)
    context_id: Mapped[int | None] = mapped_column(ForeignKey("contexts.id"), nullable=True)
    history: Mapped[list[Any]] = mapped_column(JSON)  # the context's turns as shown (copied: contexts may go)
    text: Mapped[str] = mapped_column(Text)
    intended_label: Mapped[str] = mapped_column(String(16))
    slot: Mapped[int] = mapped_column(Integer)
    try_number: Mapped[int] = mapped_column(Integer)
    model_id: Mapped[str] = mapped_column(String(200))
    score: Mapped[float] = mapped_column(Float)
    model_label: Mapped[str] = mapped_column(String(16))
    threshold: Mapped[float] = mapped_column(Float)
    reference_scores: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # role -> score
    fooled: Mapped[bool] = mapped_column(Boolean, index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Validation(Base):
    """Another player's judgement of a successful attack; every one is kept (disagreement included)."""

    __tablename__ = "validations"
    __table_args__ = (UniqueConstraint("attack_id", "player_id", name="uq_validation_player"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    attack_id: Mapped[int] = mapped_column(ForeignKey("attacks.id"), index=True)
    player_id: Mapped[str] = mapped_column(ForeignKey("players.id"), index=True)
    verdict: Mapped[str] = mapped_column(String(16))
    flagged: Mapped[bool] = mapped_column(Boolean, default=False)
    flag_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    contrast_text: Mapped[str | None] = mapped_column(Text, nullable=True)  # a minimal edit that flips the label
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


# -- errors the API maps to HTTP ------------------------------------------------------------------
class StoreError(Exception):
    """Base of the store's refusals; ``field`` names the request field at fault when there is one."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class NotFoundError(StoreError):
    pass


class UnauthenticatedError(StoreError):
    """No player token, or one that names no player."""


class ForbiddenError(StoreError):
    """The player is known but may not do this (sign-up closed)."""


class ConflictError(StoreError):
    """The request breaks a game rule or collides with another write (retry or fix the request)."""


# -- what the store returns -------------------------------------------------------------------------
@dataclass(frozen=True)
class Scores:
    """What the caller measured for one attack: the model under attack and the reference models."""

    model_id: str
    score: float
    label: Label
    threshold: float
    references: Mapping[str, float]


@dataclass(frozen=True)
class ValidatedAttack:
    """An attack with its validations, as the export reads it."""

    attack: Attack
    confirms: int
    rejects: int
    flags: int
    contrasts: tuple[str, ...]

    @property
    def validated(self) -> bool:
        return is_validated(self.confirms, self.rejects)


NICKNAME_MAX = 64
_INVISIBLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def clean_nickname(nickname: str) -> str:
    """The nickname as stored and shown: NFKC-normalised, whitespace runs made one space, trimmed.

    Refused (StoreError on ``nickname``): empty or longer than 64 characters, any control, format
    (zero-width joiners, direction marks), private-use or unassigned character, or no visible
    character at all (only spaces and combining marks)."""
    text = " ".join(unicodedata.normalize("NFKC", nickname).split())
    if not text or len(text) > NICKNAME_MAX:
        raise StoreError(f"nickname must be 1 to {NICKNAME_MAX} visible characters", field="nickname")
    bad = sorted({f"U+{ord(c):04X}" for c in text if unicodedata.category(c) in _INVISIBLE})
    if bad:
        raise StoreError(
            f"nickname has invisible or control characters ({', '.join(bad[:3])}); use visible characters only",
            field="nickname",
        )
    if not any(unicodedata.category(c)[0] in "LNPS" for c in text):
        raise StoreError("nickname must have at least one visible letter, digit or symbol", field="nickname")
    return text


def nickname_key(nickname: str) -> str:
    """What makes two nicknames the same: the cleaned nickname, case-folded, without combining marks."""
    folded = unicodedata.normalize("NFKD", clean_nickname(nickname).casefold())
    return unicodedata.normalize("NFC", "".join(c for c in folded if not unicodedata.combining(c)))[:NICKNAME_MAX]


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token() -> str:
    return secrets.token_urlsafe(24)


@dataclass(frozen=True)
class Enrolment:
    """A player and the secret token just issued to them (shown once; the store keeps its hash)."""

    player: Player
    token: str


def sqlite_url(path: str | Path) -> str:
    return f"sqlite:///{Path(path).resolve()}"


def database_url(value: str | Path) -> str:
    """A SQLAlchemy URL from ``SAFETY_BREAKIT_DB``: a URL as is, a file path as SQLite."""
    text = str(value)
    if "://" in text:
        if text.startswith("postgresql://"):
            return "postgresql+psycopg://" + text.removeprefix("postgresql://")
        return text
    return sqlite_url(text)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "isolation_level": None})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin_immediate(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_pre_ping=True)


_MIGRATING = threading.Lock()  # alembic's command API keeps module-level state: one migration per process at a time


def upgrade_schema(engine: Engine) -> None:
    """Bring the database to the newest migration (idempotent)."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with _MIGRATING, engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")


class BreakItStore:
    """Every read and write of the break-it game, each in its own transaction."""

    def __init__(self, engine: Engine, *, rng: random.Random | None = None) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._rng = rng or random.Random()

    @contextmanager
    def _tx(self) -> Iterator[Session]:
        with self._sessions.begin() as session:
            yield session

    def close(self) -> None:
        self.engine.dispose()

    # -- rounds and pools ---------------------------------------------------------------------------
    def create_round(
        self,
        number: int,
        model_id: str,
        references: Mapping[str, str] | None = None,
        *,
        signup_open: bool = False,
        rates: Mapping[str, Any] | None = None,
    ) -> Round:
        if number < 1:
            raise StoreError("round numbers start at 1", field="number")
        try:
            with self._tx() as s:
                if s.get(Round, number) is not None:
                    raise ConflictError(f"round {number} already exists", field="number")
                rnd = Round(
                    number=number,
                    model_id=model_id,
                    references=dict(references or {}),
                    open=True,
                    signup_open=signup_open,
                    rates=dict(rates) if rates else None,
                )
                s.add(rnd)
                return rnd
        except IntegrityError:
            raise ConflictError(f"round {number} already exists", field="number") from None

    def rounds(self) -> list[Round]:
        with self._tx() as s:
            return list(s.scalars(select(Round).order_by(Round.number)))

    def round(self, number: int) -> Round:
        with self._tx() as s:
            rnd = s.get(Round, number)
            if rnd is None:
                raise NotFoundError(f"no round {number}; create it first", field="round")
            return rnd

    def latest_open_round(self) -> Round:
        with self._tx() as s:
            rnd = s.scalars(select(Round).where(Round.open.is_(True)).order_by(Round.number.desc())).first()
            if rnd is None:
                raise NotFoundError("no open round; an operator creates one (dialogue-safety break-it new-round)")
            return rnd

    def configure_round(
        self, number: int, *, signup_open: bool | None = None, rates: Mapping[str, Any] | None = None
    ) -> Round:
        """Turn a round's open sign-up on or off; replace its rate limits (``{}``: the defaults again)."""
        with self._tx() as s:
            rnd = s.get(Round, number)
            if rnd is None:
                raise NotFoundError(f"no round {number}", field="round")
            if signup_open is not None:
                rnd.signup_open = signup_open
            if rates is not None:
                rnd.rates = dict(rates) or None
            return rnd

    def close_round(self, number: int) -> None:
        with self._tx() as s:
            rnd = s.get(Round, number)
            if rnd is None:
                raise NotFoundError(f"no round {number}", field="round")
            rnd.open = False

    def add_contexts(self, number: int, contexts: Sequence[Sequence[Mapping[str, Any]]], source: str) -> int:
        """Add dialogue contexts (each a list of ``{"speaker", "text"}`` turns) to a round's pool."""
        rows = []
        for i, turns in enumerate(contexts):
            clean = []
            for turn in turns:
                text = str(turn.get("text", "")).strip()
                if not text:
                    raise StoreError(f"context {i}: a turn has no text", field=f"contexts[{i}]")
                speaker = turn.get("speaker")
                clean.append({"speaker": None if speaker is None else str(speaker), "text": text})
            if not clean:
                raise StoreError(f"context {i} has no turns", field=f"contexts[{i}]")
            rows.append(Context(round_number=number, source=source, turns=clean))
        with self._tx() as s:
            if s.get(Round, number) is None:
                raise NotFoundError(f"no round {number}", field="round")
            s.add_all(rows)
        return len(rows)

    def context_count(self, number: int) -> int:
        with self._tx() as s:
            return int(s.scalar(select(func.count()).select_from(Context).where(Context.round_number == number)) or 0)

    # -- players and tasks -----------------------------------------------------------------------------
    def enrol(self, nickname: str, *, origin: str = "signup") -> Enrolment:
        """A new player with a fresh token (``origin``: ``invite`` by the organiser, ``signup`` on an
        open round). Nicknames are unique up to case and accents (409)."""
        [enrolment] = self.enrol_all([nickname], origin=origin)
        return enrolment

    def enrol_all(self, nicknames: Sequence[str], *, origin: str = "invite") -> list[Enrolment]:
        """:meth:`enrol` of every nickname in one transaction: all of them, or (one refused: invalid, taken,
        or the same as another of the list) none, so that no token is made that nobody is shown."""
        cleaned = [clean_nickname(n) for n in nicknames]
        keys: dict[str, str] = {}
        for nickname in cleaned:
            key = nickname_key(nickname)
            if key in keys:
                raise ConflictError(
                    f"the nicknames {keys[key]!r} and {nickname!r} are the same player; pick another", field="nickname"
                )
            keys[key] = nickname
        tokens = [new_token() for _ in keys]
        players = [
            Player(id=secrets.token_hex(16), nickname=n, nickname_key=k, token_hash=token_hash(t), origin=origin)
            for (k, n), t in zip(keys.items(), tokens, strict=True)
        ]
        try:
            with self._tx() as s:
                taken = s.scalars(select(Player.nickname).where(Player.nickname_key.in_(list(keys)))).first()
                if taken is not None:
                    raise ConflictError(f"the nickname {taken!r} is taken; pick another", field="nickname")
                s.add_all(players)
        except IntegrityError:
            taken = repr(cleaned[0]) if len(cleaned) == 1 else "of one of these"
            raise ConflictError(f"the nickname {taken} is taken; pick another", field="nickname") from None
        return [Enrolment(p, t) for p, t in zip(players, tokens, strict=True)]

    def register_player(self, nickname: str) -> Player:
        """:meth:`enrol` without keeping the token (for tests and tools that act on the store directly)."""
        return self.enrol(nickname).player

    def reissue_token(self, nickname: str) -> Enrolment:
        """A new token for an existing player (the old one stops working): for players of rounds
        played before tokens (origin ``legacy``) and for lost tokens."""
        key = nickname_key(nickname)
        token = new_token()
        with self._tx() as s:
            player = s.scalars(select(Player).where(Player.nickname_key == key)).first()
            if player is None:
                raise NotFoundError(f"no player called {nickname!r}", field="nickname")
            player.token_hash = token_hash(token)
            return Enrolment(player, token)

    def player_by_token(self, token: str | None) -> Player:
        if not token:
            raise UnauthenticatedError(
                "no player token: join with the invite link from the organiser (or sign up where the round allows it)"
            )
        with self._tx() as s:
            player = s.scalars(select(Player).where(Player.token_hash == token_hash(token))).first()
            if player is None:
                raise UnauthenticatedError("unknown player token: ask the organiser for a new invite link")
            return player

    def player(self, player_id: str) -> Player:
        with self._tx() as s:
            player = s.get(Player, player_id)
            if player is None:
                raise NotFoundError("unknown player id; register first", field="player_id")
            return player

    def start_task(self, number: int, player_id: str, mode: Mode, with_context: bool) -> tuple[Task, Context | None]:
        with self._tx() as s:
            rnd = s.get(Round, number)
            if rnd is None:
                raise NotFoundError(f"no round {number}", field="round")
            if not rnd.open:
                raise ConflictError(f"round {number} is closed", field="round")
            if s.get(Player, player_id) is None:
                raise NotFoundError("unknown player id; register first", field="player_id")
            context = None
            if with_context:
                ids = list(s.scalars(select(Context.id).where(Context.round_number == number)))
                if not ids:
                    raise ConflictError(f"round {number} has no context pool; write without context", field="context")
                context = s.get(Context, self._rng.choice(ids))
            task = Task(
                round_number=number, player_id=player_id, mode=mode.value, context_id=context.id if context else None
            )
            s.add(task)
            s.flush()
            return task, context

    def task_state(
        self, task_id: int, player_id: str | None = None
    ) -> tuple[Task, Context | None, TaskProgress, list[Attack]]:
        """A task, its context, progress and tries; with ``player_id``, only that player's task
        (another player's is reported as not found, the same as one that does not exist)."""
        with self._tx() as s:
            task = s.get(Task, task_id)
            if task is None or (player_id is not None and task.player_id != player_id):
                raise NotFoundError(f"no task {task_id} of yours", field="task_id")
            attacks = self._attacks_of(s, task_id)
            context = s.get(Context, task.context_id) if task.context_id is not None else None
            return task, context, TaskProgress.from_tries([(a.slot, a.fooled) for a in attacks]), attacks

    @staticmethod
    def _attacks_of(s: Session, task_id: int) -> list[Attack]:
        return list(s.scalars(select(Attack).where(Attack.task_id == task_id).order_by(Attack.id)))

    def record_attack(self, task_id: int, player_id: str, text: str, scores: Scores) -> tuple[Attack, TaskProgress]:
        """Record one try in the task's open slot (the rules are checked inside the transaction)."""
        text = text.strip()
        if not text:
            raise StoreError("the message is empty", field="text")
        try:
            with self._tx() as s:
                task = s.scalars(select(Task).where(Task.id == task_id).with_for_update()).first()
                if task is None:
                    raise NotFoundError(f"no task {task_id}", field="task_id")
                if task.player_id != player_id:
                    raise ConflictError("this task belongs to another player", field="player_id")
                rnd = s.get(Round, task.round_number)
                assert rnd is not None
                if not rnd.open:
                    raise ConflictError(f"round {rnd.number} is closed", field="task_id")
                progress = TaskProgress.from_tries([(a.slot, a.fooled) for a in self._attacks_of(s, task_id)])
                if progress.finished:
                    raise ConflictError("this task is finished; start a new one", field="task_id")
                context = s.get(Context, task.context_id) if task.context_id is not None else None
                intended = Mode(task.mode).intended
                attack = Attack(
                    task_id=task.id,
                    round_number=task.round_number,
                    player_id=player_id,
                    context_id=task.context_id,
                    history=list(context.turns) if context else [],
                    text=text,
                    intended_label=intended.value,
                    slot=progress.slot,
                    try_number=progress.tries_in_slot + 1,
                    model_id=scores.model_id,
                    score=float(scores.score),
                    model_label=scores.label.value,
                    threshold=float(scores.threshold),
                    reference_scores={k: float(v) for k, v in scores.references.items()},
                    fooled=fooled(intended, scores.label),
                )
                s.add(attack)
                s.flush()
                after = TaskProgress.from_tries([(a.slot, a.fooled) for a in self._attacks_of(s, task_id)])
                if after.finished:
                    task.finished_at = utcnow()
                return attack, after
        except IntegrityError:
            raise ConflictError(
                "another try was recorded for this slot at the same time; reload", field="task_id"
            ) from None

    def attack(self, attack_id: int) -> Attack:
        with self._tx() as s:
            attack = s.get(Attack, attack_id)
            if attack is None:
                raise NotFoundError(f"no attack {attack_id}", field="attack_id")
            return attack

    # -- validation --------------------------------------------------------------------------------
    def attacks_to_validate(self, number: int, player_id: str, limit: int = 10) -> list[Attack]:
        """Successful attacks by other players that ``player_id`` has not judged, least-judged first."""
        with self._tx() as s:
            judged = select(Validation.attack_id).where(Validation.player_id == player_id)
            counts = select(Validation.attack_id, func.count().label("n")).group_by(Validation.attack_id).subquery()
            query = (
                select(Attack)
                .outerjoin(counts, counts.c.attack_id == Attack.id)
                .where(
                    Attack.round_number == number,
                    Attack.fooled.is_(True),
                    Attack.player_id != player_id,
                    Attack.id.not_in(judged),
                )
                .order_by(func.coalesce(counts.c.n, 0), Attack.id)
                .limit(limit)
            )
            return list(s.scalars(query))

    def validate(
        self,
        attack_id: int,
        player_id: str,
        verdict: Verdict,
        *,
        flagged: bool = False,
        flag_reason: str | None = None,
        contrast_text: str | None = None,
    ) -> Validation:
        contrast = (contrast_text or "").strip() or None
        try:
            with self._tx() as s:
                attack = s.get(Attack, attack_id)
                if attack is None:
                    raise NotFoundError(f"no attack {attack_id}", field="attack_id")
                if s.get(Player, player_id) is None:
                    raise NotFoundError("unknown player id; register first", field="player_id")
                if attack.player_id == player_id:
                    raise ConflictError("players do not validate their own attacks", field="player_id")
                if not attack.fooled:
                    raise ConflictError("only attacks that fooled the model are validated", field="attack_id")
                rnd = s.get(Round, attack.round_number)
                if rnd is not None and not rnd.open:
                    raise ConflictError(f"round {rnd.number} is closed", field="attack_id")
                if contrast is not None and contrast == attack.text:
                    raise StoreError("the contrast example must change the text", field="contrast_text")
                validation = Validation(
                    attack_id=attack_id,
                    player_id=player_id,
                    verdict=verdict.value,
                    flagged=flagged,
                    flag_reason=(flag_reason or "").strip() or None,
                    contrast_text=contrast,
                )
                s.add(validation)
                return validation
        except IntegrityError:
            raise ConflictError("you already validated this attack", field="attack_id") from None

    def judged_attacks(self, number: int) -> list[ValidatedAttack]:
        """Every successful attack of a round with its validation tallies (oldest first)."""
        with self._tx() as s:
            attacks = list(
                s.scalars(
                    select(Attack).where(Attack.round_number == number, Attack.fooled.is_(True)).order_by(Attack.id)
                )
            )
            by_attack: dict[int, list[Validation]] = {a.id: [] for a in attacks}
            if attacks:
                for v in s.scalars(
                    select(Validation).where(Validation.attack_id.in_(by_attack)).order_by(Validation.id)
                ):
                    by_attack[v.attack_id].append(v)
        out = []
        for a in attacks:
            vs = by_attack[a.id]
            out.append(
                ValidatedAttack(
                    attack=a,
                    confirms=sum(v.verdict == Verdict.CONFIRM.value for v in vs),
                    rejects=sum(v.verdict == Verdict.REJECT.value for v in vs),
                    flags=sum(v.flagged for v in vs),
                    contrasts=tuple(v.contrast_text for v in vs if v.contrast_text),
                )
            )
        return out

    # -- the score board -----------------------------------------------------------------------------
    def scoreboard(self, number: int) -> list[dict[str, Any]]:
        """Per player: tries, model fooled, attacks validated by others (and not flagged: what the export
        keeps), validations given; best first."""
        judged = {j.attack.id: j for j in self.judged_attacks(number)}
        with self._tx() as s:
            players = {p.id: p.nickname for p in s.scalars(select(Player))}
            tries = s.execute(
                select(Attack.player_id, func.count(), func.sum(case((Attack.fooled.is_(True), 1), else_=0)))
                .where(Attack.round_number == number)
                .group_by(Attack.player_id)
            ).all()
            given = dict(
                s.execute(
                    select(Validation.player_id, func.count())
                    .join(Attack, Attack.id == Validation.attack_id)
                    .where(Attack.round_number == number)
                    .group_by(Validation.player_id)
                ).all()
            )
        rows: dict[str, dict[str, Any]] = {}
        for player_id, n, n_fooled in tries:
            rows[player_id] = {"player": players.get(player_id, "?"), "tries": int(n), "fooled": int(n_fooled or 0)}
        for player_id in given:
            rows.setdefault(player_id, {"player": players.get(player_id, "?"), "tries": 0, "fooled": 0})
        for player_id, row in rows.items():
            row["validated"] = sum(
                1 for j in judged.values() if j.attack.player_id == player_id and j.validated and not j.flags
            )
            row["validations_given"] = int(given.get(player_id, 0))
        return sorted(rows.values(), key=lambda r: (-r["validated"], -r["fooled"], r["tries"], r["player"]))


def open_store(url_or_path: str | Path, *, rng: random.Random | None = None) -> BreakItStore:
    """Open (creating and migrating as needed) the store at a SQLAlchemy URL or an SQLite file path."""
    url = database_url(url_or_path)
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    engine = make_engine(url)
    upgrade_schema(engine)
    return BreakItStore(engine, rng=rng)
