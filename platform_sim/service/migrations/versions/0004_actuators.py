"""Actuators: each tenant's scheduler scopes, each job's scheduler handle, and the durable outbox of stop actions.

``tenant_scopes`` holds what the operator let each tenant name on each scheduler (one row per kind and owner).
``scheduler_handles`` holds the handle a job registered (which scheduler runs it, and its name there).
``actuations`` is the durable outbox of stop actions: one row per stopped job with a handle, written in the
transaction of the stop decision, claimed with a lease by the actuate worker and kept as the record of what was done.

Revision ID: 0004_actuators
Revises: 0003_events
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_actuators"
down_revision = "0003_events"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tenant_scopes",
        sa.Column("tenant_id", sa.BigInteger, sa.ForeignKey("tenants.tenant_id"), primary_key=True),
        sa.Column("kind", sa.Text, primary_key=True),
        sa.Column("owner", sa.Text, primary_key=True),
    )
    op.create_table(
        "scheduler_handles",
        sa.Column("tenant_id", sa.BigInteger, primary_key=True),
        sa.Column("job_id", sa.Text, primary_key=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("ref", sa.Text, nullable=False),
        sa.Column("registered_at", sa.Float(53), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id", "job_id"], ["jobs.tenant_id", "jobs.job_id"]),
    )
    op.create_table(
        "actuations",
        sa.Column("action_id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("tenant_id", sa.BigInteger, nullable=False),
        sa.Column("job_id", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("ref", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False, server_default="pending"),
        sa.Column("phase", sa.Integer, nullable=False, server_default="0"),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("claims", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_attempt_at", sa.Float(53), nullable=False),
        sa.Column("created_at", sa.Float(53), nullable=False),
        sa.Column("updated_at", sa.Float(53), nullable=False),
        sa.Column("last_action", sa.Text),
        sa.Column("last_detail", sa.Text),
        sa.UniqueConstraint("tenant_id", "job_id"),
    )
    # The worker's poll: due pending actions.
    op.create_index("actuations_due", "actuations", ["state", "next_attempt_at"])


def downgrade() -> None:
    op.drop_index("actuations_due", "actuations")
    op.drop_table("actuations")
    op.drop_table("scheduler_handles")
    op.drop_table("tenant_scopes")
