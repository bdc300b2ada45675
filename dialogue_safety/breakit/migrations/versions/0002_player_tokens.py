"""player tokens, unique nicknames, open sign-up and rate limits per round

Players of earlier rounds keep their attacks and validations; they get ``origin = 'legacy'`` and
no token until the organiser re-issues one (``dialogue-safety break-it invite --reissue NICK``).
Nicknames equal up to case and accents get a numbered suffix ("bob (2)") so that the new unique
key holds; a nickname that is not valid any more (invisible characters) becomes "player-<id>".

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from dialogue_safety.breakit.store import StoreError, clean_nickname, nickname_key

    # plain ADD COLUMNs and unique indexes: no table is rebuilt (SQLite would have to drop tables that
    # others reference, which its foreign keys refuse)
    op.add_column("players", sa.Column("nickname_key", sa.String(64), nullable=True))
    op.add_column("players", sa.Column("token_hash", sa.String(64), nullable=True))
    op.add_column("players", sa.Column("origin", sa.String(16), nullable=False, server_default="legacy"))
    op.add_column("rounds", sa.Column("signup_open", sa.Boolean, nullable=False, server_default=sa.true()))
    op.add_column("rounds", sa.Column("rates", sa.JSON, nullable=True))

    conn = op.get_bind()
    players = sa.table(
        "players",
        sa.column("id", sa.String),
        sa.column("nickname", sa.String),
        sa.column("nickname_key", sa.String),
        sa.column("created_at", sa.DateTime),
    )
    taken: set[str] = set()
    rows = conn.execute(sa.select(players.c.id, players.c.nickname).order_by(players.c.created_at, players.c.id))
    for pid, nickname in rows.all():
        try:
            name = clean_nickname(nickname)
        except StoreError:
            name = f"player-{pid[:8]}"
        candidate, n = name, 1
        while nickname_key(candidate) in taken:
            n += 1
            candidate = f"{name[:56]} ({n})"
        taken.add(nickname_key(candidate))
        conn.execute(
            players.update().where(players.c.id == pid).values(nickname=candidate, nickname_key=nickname_key(candidate))
        )
    op.create_index("uq_player_nickname_key", "players", ["nickname_key"], unique=True)
    op.create_index("uq_player_token_hash", "players", ["token_hash"], unique=True)


def downgrade() -> None:
    op.drop_index("uq_player_token_hash", "players")
    op.drop_index("uq_player_nickname_key", "players")
    for table, column in (
        ("rounds", "rates"),
        ("rounds", "signup_open"),
        ("players", "origin"),
        ("players", "token_hash"),
        ("players", "nickname_key"),
    ):
        op.drop_column(table, column)
