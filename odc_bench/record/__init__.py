"""The record stage: a run's event trace summarised (metrics.py) into its results row (row.py),
whose columns schema.py holds."""
