-- An evalstop-server SQLite database at schema version 1 (before job cadences), as that version wrote it: made by
-- SQLiteStore of commit 687ecda (tenant "legacy", job "old-job" with the k=2 rule, reports at steps 0, 20, 40, 60,
-- the last one a first decline), dumped with sqlite3's iterdump. The tenant's token is the test token
-- "es_v1-fixture-token" and the times are fixed, so that the file is the same on every run.
-- tests/test_service_cadence.py loads it into a file and opens it with today's store (the migration to version 2).
BEGIN TRANSACTION;
CREATE TABLE jobs (
    tenant_id INTEGER NOT NULL,
    job_id TEXT NOT NULL,
    job_type TEXT NOT NULL,
    detector TEXT NOT NULL,
    detector_state TEXT NOT NULL,
    gpus INTEGER,
    planned_steps INTEGER,
    created_at REAL NOT NULL,
    n_reports INTEGER NOT NULL DEFAULT 0,
    first_step INTEGER,
    first_report_at REAL,
    last_step INTEGER,
    best_step INTEGER,
    best_score REAL,
    stopped_at INTEGER,
    stop_reason TEXT NOT NULL DEFAULT '',
    finished_at REAL,
    finish_reason TEXT,
    PRIMARY KEY (tenant_id, job_id),
    FOREIGN KEY (tenant_id) REFERENCES tenants(tenant_id)
) WITHOUT ROWID;
INSERT INTO "jobs" VALUES(1,'old-job','rlhf','{"name": "k-decline", "params": {"k": 2, "min_delta": 0.0}}','{"prev_score": 0.44, "declines": 1}',2,400,1764547200.0,4,0,1764547201.0,60,40,0.47,NULL,'',NULL,NULL);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO "meta" VALUES('schema_version','1');
CREATE TABLE reports (
    tenant_id INTEGER NOT NULL,
    job_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    eval_score REAL NOT NULL,
    eval_scores TEXT,
    action TEXT NOT NULL,
    reason TEXT NOT NULL,
    declines INTEGER NOT NULL,
    best_step INTEGER,
    best_score REAL,
    received_at REAL NOT NULL,
    PRIMARY KEY (tenant_id, job_id, step),
    FOREIGN KEY (tenant_id, job_id) REFERENCES jobs(tenant_id, job_id)
) WITHOUT ROWID;
INSERT INTO "reports" VALUES(1,'old-job',0,0.3,NULL,'continue','no stop signal',0,0,0.3,1764547201.0);
INSERT INTO "reports" VALUES(1,'old-job',20,0.42,NULL,'continue','no stop signal',0,20,0.42,1764547221.0);
INSERT INTO "reports" VALUES(1,'old-job',40,0.47,NULL,'continue','no stop signal',0,40,0.47,1764547241.0);
INSERT INTO "reports" VALUES(1,'old-job',60,0.44,NULL,'continue','no stop signal',1,40,0.47,1764547261.0);
CREATE TABLE tenants (
    tenant_id INTEGER NOT NULL PRIMARY KEY,
    name TEXT NOT NULL,
    token_hash TEXT NOT NULL,
    created_at REAL NOT NULL,
    revoked_at REAL,
    UNIQUE (name),
    UNIQUE (token_hash)
);
INSERT INTO "tenants" VALUES(1,'legacy','a474f104b5469924d0567d8092a7f63c7f943b4a11e14857cd3cd45e2c82271b',1764547200.0,NULL);
COMMIT;
