"""The audit trail and webhooks: each stop's GPU-hours freed, the events table, webhooks and their outbox.

``jobs.gpu_hours_freed`` is written when the core stops a job (nullable: jobs stopped before this revision, and jobs
that never said their GPUs or planned steps, have none). ``events`` is the append-only audit trail, written in the
transaction of what it records. ``webhooks`` holds each endpoint with its signing secret (in plain text: the server
signs with it); ``webhook_outbox`` one row per event still to deliver to one webhook.

Revision ID: 0003_events
Revises: 0002
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_events"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("gpu_hours_freed", sa.Float(53)))
    op.create_table(
        "events",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("tenant_id", sa.BigInteger, nullable=False),
        sa.Column("type", sa.Text, nullable=False),
        sa.Column("job_id", sa.Text),
        sa.Column("time", sa.Float(53), nullable=False),
        sa.Column("details", sa.Text, nullable=False, server_default="{}"),
    )
    # Per-tenant reads (GET /v1/events) follow (tenant_id, id); retention deletes the oldest ids.
    op.create_index("events_tenant_id", "events", ["tenant_id", "id"])
    op.create_table(
        "webhooks",
        sa.Column("webhook_id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("tenant_id", sa.BigInteger, sa.ForeignKey("tenants.tenant_id"), nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("events", sa.Text, nullable=False),
        sa.Column("secret", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float(53), nullable=False),
    )
    op.create_table(
        "webhook_outbox",
        sa.Column("outbox_id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("webhook_id", sa.BigInteger, sa.ForeignKey("webhooks.webhook_id"), nullable=False),
        sa.Column("event_id", sa.BigInteger, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_attempt_at", sa.Float(53), nullable=False),
        sa.UniqueConstraint("webhook_id", "event_id"),
    )


def downgrade() -> None:
    op.drop_table("webhook_outbox")
    op.drop_table("webhooks")
    op.drop_table("events")
    op.drop_column("jobs", "gpu_hours_freed")
