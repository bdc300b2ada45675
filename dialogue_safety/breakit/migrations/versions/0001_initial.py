"""rounds, contexts, players, tasks, attacks, validations

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "players",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("nickname", sa.String(64), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
    )
    op.create_table(
        "rounds",
        sa.Column("number", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("model_id", sa.String(200), nullable=False),
        sa.Column("references", sa.JSON, nullable=False),
        sa.Column("open", sa.Boolean, nullable=False),
        sa.Column("created_at", TZ, nullable=False),
    )
    op.create_table(
        "contexts",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("round_number", sa.Integer, sa.ForeignKey("rounds.number"), nullable=False, index=True),
        sa.Column("source", sa.String(100), nullable=False),
        sa.Column("turns", sa.JSON, nullable=False),
    )
    op.create_table(
        "tasks",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("round_number", sa.Integer, sa.ForeignKey("rounds.number"), nullable=False, index=True),
        sa.Column("player_id", sa.String(32), sa.ForeignKey("players.id"), nullable=False, index=True),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("context_id", sa.Integer, sa.ForeignKey("contexts.id"), nullable=True),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("finished_at", TZ, nullable=True),
    )
    op.create_table(
        "attacks",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("task_id", sa.Integer, sa.ForeignKey("tasks.id"), nullable=False, index=True),
        sa.Column("round_number", sa.Integer, sa.ForeignKey("rounds.number"), nullable=False, index=True),
        sa.Column("player_id", sa.String(32), sa.ForeignKey("players.id"), nullable=False, index=True),
        sa.Column("context_id", sa.Integer, sa.ForeignKey("contexts.id"), nullable=True),
        sa.Column("history", sa.JSON, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("intended_label", sa.String(16), nullable=False),
        sa.Column("slot", sa.Integer, nullable=False),
        sa.Column("try_number", sa.Integer, nullable=False),
        sa.Column("model_id", sa.String(200), nullable=False),
        sa.Column("score", sa.Float, nullable=False),
        sa.Column("model_label", sa.String(16), nullable=False),
        sa.Column("threshold", sa.Float, nullable=False),
        sa.Column("reference_scores", sa.JSON, nullable=False),
        sa.Column("fooled", sa.Boolean, nullable=False, index=True),
        sa.Column("created_at", TZ, nullable=False),
        sa.UniqueConstraint("task_id", "slot", "try_number", name="uq_attack_try"),
    )
    op.create_table(
        "validations",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("attack_id", sa.Integer, sa.ForeignKey("attacks.id"), nullable=False, index=True),
        sa.Column("player_id", sa.String(32), sa.ForeignKey("players.id"), nullable=False, index=True),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("flagged", sa.Boolean, nullable=False),
        sa.Column("flag_reason", sa.Text, nullable=True),
        sa.Column("contrast_text", sa.Text, nullable=True),
        sa.Column("created_at", TZ, nullable=False),
        sa.UniqueConstraint("attack_id", "player_id", name="uq_validation_player"),
    )


def downgrade() -> None:
    for table in ("validations", "attacks", "tasks", "contexts", "rounds", "players"):
        op.drop_table(table)
