"""Stand-alone commands around the harness, each `python -m odc_bench.tools.NAME`: the cost-model
calibration (calibrate), plan quality (balancer_report), the simulator's CPU calibration,
validation, paper tables and timing (sim_calibrate, sim_validate, sim_paper, sim_bench)."""
