"""Job cadences: each job's cadence spec, and the cadence hint of each answered decision.

``jobs.cadence`` holds the job's cadence spec as JSON (NULL: the fixed cadence, no hints, which is what every job
registered before this revision keeps); ``reports.next_eval_step`` the hint of the decision answered to the report
(NULL: none), so that a re-send of the step is answered the same decision. Both nullable: existing rows stay valid.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("cadence", sa.Text))
    op.add_column("reports", sa.Column("next_eval_step", sa.BigInteger))


def downgrade() -> None:
    op.drop_column("reports", "next_eval_step")
    op.drop_column("jobs", "cadence")
