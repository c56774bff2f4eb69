-- Run by the postgres image once, when its data volume is new (see docker-compose.yml):
-- the service's batch-job store gets its own database beside MLflow's (POSTGRES_DB).
CREATE DATABASE jobs;
