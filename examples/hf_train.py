"""Train a Hugging Face causal LM with ODC or FSDP2, its minibatches planned by LB-Mini.

    torchrun --standalone --nproc-per-node 2 examples/hf_train.py --engine odc --out /tmp/hf
    python examples/hf_train.py --reference --out /tmp/hf      # the same training, one process

`--export` also saves each trained model as a folder that transformers' from_pretrained loads.

Needs `pip install 'odc-bench[hf]'` (transformers). The models are tiny Qwen2, Llama and
Qwen3 configurations built from their config classes (nothing is downloaded), with input and output
embeddings tied or not. Each run saves its parameters after the last step
(`<model>-<tied|untied>-<engine>.pt`, rank 0), so that a run on ranks can be compared with the
single process (tests/integration/test_hf_example.py does).

The minibatches are made so that LB-Mini gives the ranks different microbatch counts, one of
them none at all: ODC runs that plan as it is. FSDP2 runs the same plan, but every layer is a
collective there, so a rank with fewer microbatches runs zero-weight ones until the counts match.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig, PretrainedConfig, Qwen2Config, Qwen3Config

import odc_core
from odc_bench.balancers import balance

VOCAB = 512
MAX_TOKENS = 96  # a microbatch's token budget
# Sample lengths of each minibatch, repeated for EPOCHS. On 2 ranks LB-Mini gives the first
# minibatch 2 and 1 microbatches and the second (one sample) 1 and 0.
MINIBATCHES = [[96, 40, 40, 30], [50], [20, 70, 33, 64, 12, 45]]
EPOCHS = 2
# Clipping at 0.5 scales every step of this data (its gradient norms are 0.9 to 1.9).
LR, MAX_GRAD_NORM, WARMUP = 3e-3, 0.5, 2
# AdamW divides by sqrt(v) + eps: with the default 1e-8, a parameter whose gradient is near zero
# takes a step of about lr whatever its sign, so fp32 summation-order noise (ranks add gradients
# in another order than one process) flips steps of lr. 1e-4 keeps such steps small, so that a
# comparison with one process measures the engine rather than that noise.
EPS = 1e-4


def tiny_config(model: str, tied: bool) -> PretrainedConfig:
    shape = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                 tie_word_embeddings=tied)
    if model == "qwen2":
        return Qwen2Config(**shape)
    if model == "llama":
        return LlamaConfig(**shape, attention_bias=False)
    if model == "qwen3":  # heads of 24 channels on a width of 64, q and k normalised
        return Qwen3Config(**shape, head_dim=24)
    raise ValueError(f"unknown model {model!r}; choose qwen2, llama or qwen3")


def build(model: str, tied: bool) -> nn.Module:
    """The same initial weights on every rank and in the reference."""
    torch.manual_seed(0)
    config = tiny_config(model, tied)
    config._attn_implementation = "sdpa"
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def samples() -> list[list[torch.Tensor]]:
    """Each minibatch's samples: token ids, the same on every rank."""
    g = torch.Generator().manual_seed(1)
    return [[torch.randint(0, VOCAB, (n,), generator=g) for n in lengths] for lengths in MINIBATCHES]


def units(model: nn.Module) -> list[nn.Module]:
    """One unit per module the model calls in turn; the final norm is left to the root."""
    inner = model.model  # type: ignore[attr-defined]
    return [inner.embed_tokens, *inner.layers, model.lm_head]  # type: ignore[list-item]


def warmup(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / WARMUP))


def loss_of(model: nn.Module, docs: Sequence[torch.Tensor], labelled: int) -> torch.Tensor:
    """Summed next-token loss of the documents (padded into one batch), over the minibatch's
    labelled token count, so that the ranks' gradients add up to the minibatch's."""
    width = max(len(d) for d in docs)
    ids = torch.zeros(len(docs), width, dtype=torch.long)
    mask = torch.zeros(len(docs), width, dtype=torch.long)
    for i, d in enumerate(docs):
        ids[i, :len(d)], mask[i, :len(d)] = d, 1
    labels = ids.masked_fill(mask == 0, -100)
    logits = model(input_ids=ids, attention_mask=mask).logits
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100,
                           reduction="sum") / labelled


def train(engine_name: str, model_name: str, tied: bool) -> dict[str, torch.Tensor]:
    """Train on this rank's part of every minibatch; the engine owns the optimizer step."""
    rank, world = dist.get_rank(), dist.get_world_size()
    engine = odc_core.make_engine(engine_name)
    try:
        model = build(model_name, tied)
        model = engine.wrap(model, units(model))
        engine.configure_optimizer(partial(torch.optim.AdamW, lr=LR, eps=EPS, weight_decay=0.01),
                                   scheduler=warmup, max_grad_norm=MAX_GRAD_NORM)
        data = samples()
        for _ in range(EPOCHS):
            for lengths, docs in zip(MINIBATCHES, data, strict=True):
                plan = balance(lengths, world, MAX_TOKENS, "lb_mini")
                labelled = sum(n - 1 for n in lengths)
                mine = plan[rank]
                if engine_name == "collective":  # every rank at every layer: pad with zero-weight microbatches
                    mine = mine + [[]] * (max(len(p) for p in plan) - len(mine))
                engine.begin_minibatch()
                for micro in mine:
                    if micro:
                        loss = loss_of(model, [docs[i] for i in micro], labelled)
                    else:
                        loss = 0.0 * loss_of(model, [docs[0][:2]], 1)
                    (loss * engine.loss_scale).backward()
                engine.finish_minibatch()
        engine.drain()
        return engine.full_parameters()
    finally:
        engine.close()


def reference(model_name: str, tied: bool) -> dict[str, torch.Tensor]:
    """The same training in one process: every sample of a minibatch, then one step."""
    model = build(model_name, tied)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS, weight_decay=0.01)
    sched = warmup(opt)
    data = samples()
    for _ in range(EPOCHS):
        for lengths, docs in zip(MINIBATCHES, data, strict=True):
            labelled = sum(n - 1 for n in lengths)
            for d in docs:
                loss_of(model, [d], labelled).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
            opt.step()
            opt.zero_grad()
            sched.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def export(model_name: str, tied: bool, params: dict[str, torch.Tensor], folder: Path) -> None:
    """The trained parameters as a transformers folder (config and safetensors) that
    `AutoModelForCausalLM.from_pretrained(folder)` loads."""
    model = build(model_name, tied)
    missing, unexpected = model.load_state_dict(params, strict=False)
    tied_names = {"lm_head.weight"} if tied else set()
    if unexpected or set(missing) - tied_names:  # a tied head is the embedding, loaded under its name
        raise RuntimeError(f"parameters do not match the model: missing {missing}, unexpected {unexpected}")
    model.save_pretrained(folder)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", nargs="+", choices=["odc", "collective"], default=["odc"])
    ap.add_argument("--model", nargs="+", choices=["qwen2", "llama", "qwen3"], default=["qwen2"])
    ap.add_argument("--tied", nargs="+", choices=["tied", "untied"], default=["untied"])
    ap.add_argument("--reference", action="store_true", help="train in this one process instead")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--export", action="store_true",
                    help="also save each trained model as a from_pretrained folder, <model>-<tied>-<engine>-hf")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    variants = [(m, t) for m in args.model for t in args.tied]
    if args.reference:
        for m, t in variants:
            torch.save(reference(m, t == "tied"), args.out / f"{m}-{t}-reference.pt")
        return
    dist.init_process_group("gloo")
    try:
        for engine in args.engine:
            for m, t in variants:
                params = train(engine, m, t == "tied")
                if dist.get_rank() == 0:
                    torch.save(params, args.out / f"{m}-{t}-{engine}.pt")
                    if args.export:
                        export(m, t == "tied", params, args.out / f"{m}-{t}-{engine}-hf")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
