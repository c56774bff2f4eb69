"""Column names of the long format (Nixtla's convention): series id, timestamp, target."""

ID, TIME, TARGET = "unique_id", "ds", "y"
