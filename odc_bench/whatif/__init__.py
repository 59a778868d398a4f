"""`python -m odc_bench.whatif` (`odc-whatif`): will ODC pay off for my data, my model and my cluster?

The question: sample lengths (a profile, a lengths or JSONL file, a Hugging Face dataset on
disk), a model (a config name, shape overrides), a cluster (a hardware profile, nodes x
devices per node) and minibatch sizes. The answer: the simulator's run of every series the
registries name for it (question.py), side by side (answer.py), with the simulator's validated
error (accuracy.py), printed as a verdict table and drawn as one figure (report.py).

Every row is a `backend=sim` run of `python -m odc_bench` with the overrides the verdict prints,
planned and simulated by the same code, so its numbers are that run's.
"""

PROG = "python -m odc_bench.whatif"
