"""Pipeline stages: pure functions; Prefect wrappers live in flows/."""
