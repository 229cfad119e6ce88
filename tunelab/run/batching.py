"""Batches for tunelab's own training loop (:mod:`tunelab.run.loop`): litgpt's sample order dealt to the ranks, and the
fast path's switches (a strategy file's ``pretokenize``, ``length_grouping``, ``prefetch``).

:func:`litgpt_order` gives litgpt's one-device sample order, so that every optimizer step holds the same samples
whatever the number of ranks; :class:`Tokenized` tokenises every sample once with litgpt's own dataset code; the
epoch's micro batches (litgpt's order, or grouped by length within windows, every sample once) come from
:func:`tunelab.data.grouping.plan_epoch`; :class:`Prefetcher` copies the next batch to the device on a side stream
while the current one trains."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from tunelab.data.grouping import bucket, plan_epoch  # noqa: F401  (the loop's batches; the planner reads the same)
from tunelab.gpt import IGNORE_INDEX


def litgpt_order(n: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """The sample order of epoch ``epoch`` as litgpt's data modules produce it on one device.

    litgpt builds ``DataLoader(shuffle=True, generator=Generator().manual_seed(seed))``; each epoch's iterator first
    draws one base seed from that generator, then RandomSampler draws its permutation."""
    if not shuffle:
        return list(range(n))
    g = torch.Generator()
    g.manual_seed(seed)
    for _ in range(epoch + 1):  # one DataLoader iterator per epoch: base-seed draw, then randperm
        torch.empty((), dtype=torch.int64).random_(generator=g)
        order = torch.randperm(n, generator=g).tolist()
    return order


def rank_share(order: list[int], rank: int, world: int) -> list[int]:
    """Rank ``rank``'s samples of a global order, as DistributedSampler deals them: positions rank, rank + world, ...,
    the last round padded by wrapping around (every rank gets the same count)."""
    per_rank = math.ceil(len(order) / world)
    order = order + order[: per_rank * world - len(order)]
    return order[rank::world]


class LitgptOrderSampler(torch.utils.data.Sampler):
    """A DataLoader sampler giving this rank its share (:func:`rank_share`) of litgpt's order (:func:`litgpt_order`)."""

    def __init__(self, n: int, rank: int, world: int, seed: int, shuffle: bool = True):
        self.n, self.rank, self.world, self.seed, self.shuffle = n, rank, world, seed, shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order the next iteration gives."""
        self.epoch = epoch

    def __len__(self) -> int:
        return math.ceil(self.n / self.world)

    def __iter__(self):
        return iter(rank_share(litgpt_order(self.n, self.seed, self.epoch, self.shuffle), self.rank, self.world))


@dataclass
class Tokenized:
    """Every sample of a split, tokenised once by litgpt's dataset code."""

    samples: list[dict]
    """litgpt's items: ``input_ids`` and ``labels`` tensors (truncated, prompt masked) and ``token_counts``."""
    counted: list[int] = field(init=False)
    """Each sample's targets the loss counts (:func:`counted_targets`), read once here: collating sums them, so the
    loop reads no tensor for them."""

    def __post_init__(self) -> None:
        self.counted = [counted_targets(s["labels"]) for s in self.samples]

    @classmethod
    def of(cls, dataset) -> Tokenized:
        """Tokenise every item of a litgpt ``SFTDataset`` (its ``__getitem__``, the code litgpt's loader runs)."""
        return cls([dataset[i] for i in range(len(dataset))])

    @property
    def lengths(self) -> list[int]:
        """Tokens of each sample (prompt template included, after truncation)."""
        return [int(s["token_counts"]["raw_plus_prompt_template"]) for s in self.samples]

    def __len__(self) -> int:
        return len(self.samples)


def rank_batches(batches: list[list[int]], rank: int, world: int) -> list[list[int]]:
    """Rank ``rank``'s micro batches of a global plan (round robin, the last round padded by wrapping around so that
    every rank runs the same number of iterations: collectives must match)."""
    per_rank = math.ceil(len(batches) / world)
    batches = batches + batches[: per_rank * world - len(batches)]
    return batches[rank::world]


def padding_fraction(batches: list[list[int]], lengths: list[int]) -> float:
    """Padding tokens / padded tokens over a plan (each micro batch padded to its longest sample)."""
    padded = sum(max(lengths[i] for i in b) * len(b) for b in batches)
    real = sum(lengths[i] for b in batches for i in b)
    return 1 - real / padded if padded else 0.0


def collate(
    tokenized: Tokenized,
    indices: list[int],
    collate_fn,
    *,
    rows: int | None = None,
    multiple: int | None = None,
    cap: int = 0,
) -> dict:
    """One micro batch: litgpt's ``collate_fn`` over the samples, plus ``padded``, ``real`` and ``raw`` token counts as
    ints (padded = rows x padded length, as computed; real = prompt template + text; raw = text) and the loss's
    ``counted`` targets (:attr:`Tokenized.counted`: litgpt's dataset truncates a sample, not the collate).

    Static shapes for compiled code (``rows`` and ``multiple``): the length padded on to :func:`bucket`'s multiple,
    and a short last micro batch filled up to ``rows`` with rows of padding. Padding is litgpt's own (input id
    ``pad_id``, label ``ignore_index``), placed after every real token: causal attention never lets a real token
    see it and the loss (a mean over labels that are not ignored) does not count it, so the loss and its gradient
    are litgpt's; only the work done grows."""
    items = [tokenized.samples[i] for i in indices]
    batch = collate_fn(items)
    if rows or multiple:
        keywords = getattr(collate_fn, "keywords", {})
        pads = {"input_ids": keywords.get("pad_id", 0), "labels": keywords.get("ignore_index", -100)}
        n, length = batch["input_ids"].shape
        target = (max(rows or 0, n), bucket(length, multiple, cap))
        if target != (n, length):
            for key, value in pads.items():
                padded = batch[key].new_full(target, value)
                padded[:n, :length] = batch[key]
                batch[key] = padded
    batch["padded"] = int(batch["input_ids"].numel())
    batch["real"] = sum(int(s["token_counts"]["raw_plus_prompt_template"]) for s in items)
    batch["raw"] = sum(int(s["token_counts"]["raw"]) for s in items)
    batch["counted"] = sum(tokenized.counted[i] for i in indices)  # filler rows hold none
    return batch


def counted_targets(labels) -> int:
    """The targets litgpt's loss counts in a batch's labels (shifted by one position, not ``IGNORE_INDEX``): read
    from the host copy, before the batch goes to the GPU, so that the fused loss needs no read back."""
    return int((labels[..., 1:] != IGNORE_INDEX).sum())


class Prefetcher:
    """Iterate batches with the next one already on ``device``: pinned host memory and a non-blocking copy on a side
    CUDA stream while the current batch trains. On a CPU device the batches pass through unchanged."""

    def __init__(self, batches, device: torch.device):
        self.batches, self.device = iter(batches), device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.next = self._load()

    def _load(self):
        batch = next(self.batches, None)
        if batch is None or self.stream is None:
            return batch
        with torch.cuda.stream(self.stream):
            for key in ("input_ids", "labels"):
                batch[key] = batch[key].pin_memory().to(self.device, non_blocking=True)
        return batch

    def __iter__(self):
        return self

    def __next__(self):
        batch = self.next
        if batch is None:
            raise StopIteration
        if self.stream is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self.stream)
            for key in ("input_ids", "labels"):
                batch[key].record_stream(current)
        self.next = self._load()
        return batch
