from odc_bench.models.qwen2 import Qwen2Config, Qwen2Model, count_parameters, packed_batch

__all__ = ["Qwen2Config", "Qwen2Model", "count_parameters", "packed_batch"]
