"""What the paper reports, as the project's notes on it record them (the same relative results,
with their P/R marks and sections, are in results/published/paper_relative.csv): the numbers that
tables, figures and studies set beside ours.

Speedups are keyed by (model, dataset, minibatch size per device, comparison); a comparison is
"engine+balancer vs engine+balancer" as results tables name series. Most of these come from
second-hand summaries of the paper's appendix ([R] in the notes), not checked against the paper.
"""

from __future__ import annotations

from odc_bench.results.series import HEADLINE_BASELINE, HEADLINE_ODC, ODC_LB_MICRO, comparison_key, series_key

_MINI, _MICRO = comparison_key(HEADLINE_ODC, HEADLINE_BASELINE), comparison_key(ODC_LB_MICRO, HEADLINE_BASELINE)
SFT_SPEEDUP: dict[tuple[str, str, int, str], str] = {
    ("qwen2_14b", "longalign", 4, _MINI): "+36% (45.1 -> 61.4)",
    ("qwen2_14b", "longalign", 4, _MICRO): "+28%",
    ("qwen2_1p5b", "longalign", 4, _MINI): "+34%",
    ("qwen2_1p5b", "longalign", 4, _MICRO): "+16%",
    ("qwen2_32b", "longalign", 2, _MINI): "-2% (17.3 -> 17.0)",
}
SFT_BUBBLE: dict[tuple[str, str, int], str] = {
    ("qwen2_14b", "longalign", 4): f"{series_key(HEADLINE_BASELINE)} 57%, {series_key(HEADLINE_ODC)} 14%"}

# The 14B LongAlign cell (16 devices, 4 samples per device, packing ratio 1) as numbers: the
# bubble rates "predicted by the packing algorithm" and ODC+LB-Mini's and ODC+LB-Micro's
# speedups over Collective+LB-Micro.
CELL_14B = {"bubble_collective_lb_micro": 0.57, "bubble_odc_lb_mini": 0.14, "speedup_odc_lb_mini": 0.36,
            "speedup_odc_lb_micro": 0.28}

# Fig. 10's trends, in words.
FIG10_TRENDS = {
    "minibatch_size": "peaks at a moderate minibatch size; about equal at 1",
    "dataset.length_scale": "about +25% at 8K rising to about +35% at 128K",
    "packing_ratio": "falls with packing ratio, about +15% at ratio 8",
    "world_size": "rises with the device count (up to 32)",
}

# Fig. 9 (RL, GRPO in verl, training time only, up to 14B on 16 GPUs): ODC's speedup ranges
# over the settings from RL_SPEEDUP_RANGE[0] to RL_SPEEDUP_RANGE[1], "up to" RL_SPEEDUP_UP_TO.
# Which collective series it is measured against is not in the notes.
RL_SPEEDUP_RANGE = (-0.05, 0.11)
RL_SPEEDUP_UP_TO = 0.10
RL_RANGE_TEXT = (f"{RL_SPEEDUP_RANGE[0]:+.0%} to {RL_SPEEDUP_RANGE[1]:+.0%} across settings "
                 f"(up to {RL_SPEEDUP_UP_TO:.0%})")
