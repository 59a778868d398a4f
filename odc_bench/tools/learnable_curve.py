"""How fast a model learns the learnable token source: one process, no engine, no balancer.

    python -m odc_bench.tools.learnable_curve [--steps 300] [--docs 4] [--min-len 100] [--max-len 300]

prints the loss per labelled token every 25 steps beside log(vocab) and the source's floor
(data/learnable.py), and the first step at which the loss fell below log(vocab) / 2. It
trains the `tiny` model's shape (conf/model/tiny.yaml) with AdamW at the harness's defaults.
"""

from __future__ import annotations

import math

import torch

from odc_bench.config.compose import compose_run
from odc_bench.config.model import ModelConfig
from odc_bench.data.batches import labelled_tokens, packed_batch
from odc_bench.data.chain import entropy_rate
from odc_bench.data.learnable import learnable_tokens
from odc_bench.errors import CommandParser, command_name, ends_cleanly, nonnegative_int, positive_int
from odc_bench.models.decoder import DecoderModel, init_weights
from odc_bench.models.memory import estimate
from odc_bench.sizes import host_available_bytes, size_label

TINY = compose_run(["model=tiny"]).model


def train_curve(steps: int, docs: int = 4, min_len: int = 100, max_len: int = 300, seed: int = 0,
                cfg: ModelConfig = TINY, lr: float = 1e-3) -> list[float]:
    """Loss per labelled token at each step; step k packs `docs` fresh documents into one microbatch."""
    torch.manual_seed(seed)
    model = DecoderModel(cfg)
    init_weights(model, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(steps):
        lens = torch.randint(min_len, max_len + 1, (docs,), generator=gen).tolist()
        batch = packed_batch([learnable_tokens(seed, step * docs + i, n, cfg.vocab_size)
                              for i, n in enumerate(lens)])
        loss = model(**batch) / labelled_tokens(lens)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def main() -> None:
    parser = CommandParser(command_name(__spec__.name), description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int, default=300, help="optimizer steps, one microbatch each")
    parser.add_argument("--docs", type=positive_int, default=4,
                        help="fresh documents packed into each step's microbatch")
    parser.add_argument("--min-len", type=positive_int, default=100, help="shortest document, in tokens")
    parser.add_argument("--max-len", type=positive_int, default=300, help="longest document, in tokens")
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="the weights' and the documents' seed")
    args = parser.parse_args()
    if args.min_len < 2:  # a step of such documents alone had a loss of nan
        parser.error(f"argument --min-len: must be at least 2, got {args.min_len}: a one-token document has no next "
                     f"token to predict")
    if args.min_len > args.max_len:
        parser.error(f"--min-len ({args.min_len}) must be at most --max-len ({args.max_len})")
    # One process on this host, the harness's model on CPU: the run's memory check, for a step's
    # longest microbatch (before, a torch allocation error deep in the first step).
    need = estimate(TINY, 1, "fp32", args.docs * args.max_len, cpu_longest=args.max_len).total
    if need > (have := host_available_bytes()):
        parser.error(f"a step of --docs {args.docs} documents of up to --max-len {args.max_len} tokens would need "
                     f"about {size_label(need)}, more than the {size_label(have)} this host has available; lower "
                     f"--docs or --max-len")
    torch.set_num_threads(1)
    losses = train_curve(args.steps, args.docs, args.min_len, args.max_len, args.seed)
    half = math.log(TINY.vocab_size) / 2
    print(f"log(vocab) {2 * half:.3f}  half {half:.3f}  floor {entropy_rate():.3f} nats/token")
    for k in range(0, args.steps, 25):
        window = losses[k:k + 25]
        print(f"steps {k:4d}-{k + len(window) - 1:4d}: mean {sum(window) / len(window):.3f}  last {window[-1]:.3f}")
    below = next((k for k, v in enumerate(losses) if v < half), None)
    print(f"first step below log(vocab)/2: {below}")
    print(f"mean of the last 25 steps: {sum(losses[-25:]) / len(losses[-25:]):.3f} "
          f"({sum(losses[-25:]) / len(losses[-25:]) - entropy_rate():.3f} above the floor)")


if __name__ == "__main__":
    with ends_cleanly(command_name(__spec__.name)):
        main()
