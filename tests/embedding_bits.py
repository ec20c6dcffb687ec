"""The small embedding and the training loops that the HostEmbedding tests share (test_transfer,
test_host_embedding, test_embedding_ranks, test_host_table): a ROWS x DIM table, batches that
touch few rows with repeats, and one loop training nn.Embedding, one a HostEmbedding."""

from __future__ import annotations

import functools

import torch
from torch import nn
from transfer_bits import _train_device

from speedlib.transfer import HostEmbedding

ROWS, DIM = 40, 6


def _batches(steps=5, coverage="partial", seed=0):
    """(indices, target) per step; partial coverage touches few rows, with repeats."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        if coverage == "full":
            idx = torch.cat([torch.randperm(ROWS, generator=gen),
                             torch.randint(0, ROWS, (8,), generator=gen)]).reshape(-1, 4)
        else:
            idx = torch.randint(0, ROWS // 2, (6, 4), generator=gen)  # rows >= 20 never touched
        out.append((idx, torch.randn(*idx.shape, DIM, generator=gen)))
    return out


def _loss(out, target):
    return ((out - target) ** 2).sum() / out.shape[0]


def _train_reference(weight, make_opt, batches, sparse=False, padding_idx=None):
    emb = nn.Embedding(ROWS, DIM, sparse=sparse, _weight=weight.clone(), padding_idx=padding_idx)
    opt = make_opt(emb.parameters())
    outs = []
    for idx, target in batches:
        opt.zero_grad()
        out = emb(idx)
        outs.append(out.detach().clone())
        _loss(out, target).backward()
        opt.step()
    return emb.weight.detach(), outs


def _train_host(weight, make_opt, batches, backend="pageable", emb=None, device=None, **kwargs):
    """Train a HostEmbedding built from `weight` (or `emb`, built by the caller) on `batches`."""
    if emb is None:
        emb = HostEmbedding(ROWS, DIM, make_opt, backend=backend, device=device or _train_device(backend),
                            weight=weight, **kwargs)
    outs = []
    for idx, target in batches:
        out = emb(idx)
        outs.append(out.detach().cpu().clone())
        _loss(out, target.to(out.device)).backward()
        emb.step()
    return emb, outs


def _with_padding(batches, pad):
    out = []
    for idx, target in batches:
        idx = idx.clone()
        idx[:, 0] = pad  # a padded position in every sample
        out.append((idx, target))
    return out


_SGD = functools.partial(torch.optim.SGD, lr=0.1)


def _host(weight=None, make=_SGD, backend="pageable", **kwargs):
    return HostEmbedding(ROWS, DIM, make, backend=backend, device=_train_device(backend), weight=weight, **kwargs)
