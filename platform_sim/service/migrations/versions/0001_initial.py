"""Initial schema: tenants, jobs (with the scheduler core's state), reports.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("tenant_id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("name", sa.Text, nullable=False, unique=True),
        sa.Column("token_hash", sa.Text, nullable=False, unique=True),
        sa.Column("created_at", sa.Float(53), nullable=False),
        sa.Column("revoked_at", sa.Float(53)),
    )
    op.create_table(
        "jobs",
        sa.Column("tenant_id", sa.BigInteger, sa.ForeignKey("tenants.tenant_id"), nullable=False),
        sa.Column("job_id", sa.Text, nullable=False),
        sa.Column("job_type", sa.Text, nullable=False),
        # JSON as text, as in the SQLite store: the core's state dicts round-trip exactly through json.dumps/loads.
        sa.Column("detector", sa.Text, nullable=False),
        sa.Column("detector_state", sa.Text, nullable=False),
        sa.Column("gpus", sa.Integer),
        sa.Column("planned_steps", sa.BigInteger),
        sa.Column("created_at", sa.Float(53), nullable=False),
        # n_reports doubles as the row's version: a replica's cached monitor is valid only while it matches.
        sa.Column("n_reports", sa.Integer, nullable=False, server_default="0"),
        sa.Column("first_step", sa.BigInteger),
        sa.Column("first_report_at", sa.Float(53)),
        sa.Column("last_step", sa.BigInteger),
        sa.Column("best_step", sa.BigInteger),
        sa.Column("best_score", sa.Float(53)),
        sa.Column("stopped_at", sa.BigInteger),
        sa.Column("stop_reason", sa.Text, nullable=False, server_default=""),
        sa.Column("finished_at", sa.Float(53)),
        sa.Column("finish_reason", sa.Text),
        sa.PrimaryKeyConstraint("tenant_id", "job_id"),
    )
    op.create_table(
        "reports",
        sa.Column("tenant_id", sa.BigInteger, nullable=False),
        sa.Column("job_id", sa.Text, nullable=False),
        sa.Column("step", sa.BigInteger, nullable=False),
        sa.Column("eval_score", sa.Float(53), nullable=False),
        sa.Column("eval_scores", sa.Text),
        # The decision answered to this report (a re-send of the step gets it again).
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("declines", sa.Integer, nullable=False),
        sa.Column("best_step", sa.BigInteger),
        sa.Column("best_score", sa.Float(53)),
        sa.Column("received_at", sa.Float(53), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "job_id", "step"),
        sa.ForeignKeyConstraint(["tenant_id", "job_id"], ["jobs.tenant_id", "jobs.job_id"]),
    )


def downgrade() -> None:
    op.drop_table("reports")
    op.drop_table("jobs")
    op.drop_table("tenants")
