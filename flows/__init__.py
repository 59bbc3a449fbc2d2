"""Prefect flows: thin wiring of the stages in tasks/."""
