"""The spread of each report: ``reports.eval_std`` and ``reports.eval_n``.

The sample standard deviation and count of an eval's example scores, when a job reports its mean with its spread
(NULL: the report carried none, which is what every report stored before this revision keeps). Both nullable:
existing rows stay valid.

Revision ID: 0005_spread
Revises: 0004_actuators
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_spread"
down_revision = "0004_actuators"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("reports", sa.Column("eval_std", sa.Float(53)))
    op.add_column("reports", sa.Column("eval_n", sa.BigInteger))


def downgrade() -> None:
    op.drop_column("reports", "eval_n")
    op.drop_column("reports", "eval_std")
