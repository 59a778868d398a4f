"""The table stage: runs.csv tables written atomically (table.py), merged (collect.py), and read
as series side by side (series.py, compare.py, pairs.py); `python -m odc_bench.results`."""
