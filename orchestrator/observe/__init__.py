"""Observe: what a sweep leaves behind: the summary metrics of a trial, the outbox, MLflow tracking, and the report."""
