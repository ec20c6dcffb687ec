"""HostEmbedding for SpeedTorch's users (issue 43): what docs/speedtorch-migration.md maps, checked
against the plain-PyTorch training it replaces; dtype conversions; state_dict into nn.Embedding."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from torch import nn

from speedlib.transfer import HostEmbedding, HostTable

ROWS, DIM = 50, 8


def _weight(seed: int = 0) -> torch.Tensor:
    return torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(seed))


def _batches(steps: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [(torch.randint(0, ROWS, (6,), generator=gen), torch.randn(6, DIM, generator=gen)) for _ in range(steps)]


class _Model(nn.Module):
    """A model whose embedding is called `emb`: a plain nn.Embedding or a HostEmbedding."""

    def __init__(self, emb: nn.Module):
        super().__init__()
        self.emb, self.head = emb, nn.Linear(DIM, DIM)
        torch.manual_seed(2)
        self.head.reset_parameters()

    def forward(self, idx):
        return self.head(self.emb(idx))


def test_the_speedtorch_loop_is_a_host_embedding_with_a_dense_optimizer():
    """SpeedTorch: ModelFactory + OptimizerFactory switchers around each step
    (beforeForwardPass(idx) ... optimizer.step(); afterOptimizerStep(idx)) to train host rows
    with a dense optimizer. speedlib: one HostEmbedding, no switchers. Reference: nn.Embedding
    with the same dense Adam over the rows a batch touched (what the switchers did by hand)."""
    adam = functools.partial(torch.optim.Adam, lr=0.05)
    ours = _Model(HostEmbedding(ROWS, DIM, adam, backend="pageable", device="cpu", weight=_weight()))
    head_opt = torch.optim.Adam(ours.head.parameters(), lr=0.05)

    table = _weight().clone()
    state = {"m": torch.zeros(ROWS, DIM), "v": torch.zeros(ROWS, DIM), "step": torch.zeros(ROWS)}
    reference = _Model(nn.Embedding(ROWS, DIM))
    ref_head_opt = torch.optim.Adam(reference.head.parameters(), lr=0.05)
    for idx, target in _batches():
        rows = idx.unique()  # beforeForwardPass: the batch's rows and their optimizer state onto the device
        batch_weight = table[rows].clone().requires_grad_()
        batch_opt = torch.optim.Adam([batch_weight], lr=0.05)
        if state["step"][rows].max() > 0:  # SpeedTorch kept one step count; rows here all share it
            batch_opt.state[batch_weight] = {"step": state["step"][rows[0]].clone(),
                                             "exp_avg": state["m"][rows].clone(),
                                             "exp_avg_sq": state["v"][rows].clone()}
        out = reference.head(nn.functional.embedding(torch.searchsorted(rows, idx), batch_weight))
        nn.functional.mse_loss(out, target).backward()
        batch_opt.step()
        ref_head_opt.step()
        ref_head_opt.zero_grad()
        table[rows] = batch_weight.detach()  # afterOptimizerStep: rows and state back to the host
        s = batch_opt.state[batch_weight]
        state["m"][rows], state["v"][rows], state["step"][:] = s["exp_avg"], s["exp_avg_sq"], s["step"]

        nn.functional.mse_loss(ours(idx), target).backward()
        ours.emb.step()
        head_opt.step()
        head_opt.zero_grad()
    torch.testing.assert_close(ours.emb.table.cpu(), table)
    torch.testing.assert_close(ours.emb.optimizer_state_dict()["exp_avg"], state["m"])
    assert all(torch.equal(a, b) for a, b in zip(ours.head.parameters(), reference.head.parameters(), strict=True))


def test_the_data_gadget_is_a_host_table_from_a_npy_file(tmp_path):
    """SpeedTorch's DataGadget(file.npy).getData(idx) / insertData(values, idx)."""
    data = np.arange(ROWS * DIM, dtype=np.float32).reshape(ROWS, DIM)
    np.save(tmp_path / "data.npy", data)
    table = HostTable.from_file(tmp_path / "data.npy", backend="pageable", device="cpu")
    idx = torch.tensor([3, 0, 7])
    assert torch.equal(table.gather(idx), torch.from_numpy(data[[3, 0, 7]]))
    table.scatter_(torch.tensor([1, 2]), torch.full((2, DIM), -1.0))
    table.flush()
    assert (np.load(tmp_path / "data.npy")[[1, 2]] == -1).all()


@pytest.mark.parametrize("convert", ["double", "half", "to_bfloat16"])
def test_model_dtype_conversions_reach_the_lookups(convert):
    model = _Model(HostEmbedding(ROWS, DIM, functools.partial(torch.optim.SGD, lr=0.1), backend="pageable",
                                 device="cpu", weight=_weight()))
    plain = _Model(nn.Embedding.from_pretrained(_weight(), freeze=False))
    for m in (model, plain):
        if convert == "to_bfloat16":
            m.to(torch.bfloat16)
        else:
            getattr(m, convert)()
    idx, target = _batches(1)[0]
    out = model(idx)
    assert out.dtype == plain(idx).dtype == model.head.weight.dtype  # no "mat1 and mat2 must have the same dtype"
    torch.testing.assert_close(out, plain(idx))
    before = model.emb.table.cpu().clone()
    nn.functional.mse_loss(out.float(), target).backward()
    model.emb.step()
    assert model.emb.table.dtype == torch.float32  # the table keeps its dtype; its rows still train
    assert not torch.equal(model.emb.table.cpu()[idx], before[idx])
    model.float()
    assert model(idx).dtype == torch.float32


def test_state_dict_loads_strictly_into_a_plain_nn_embedding_and_back():
    adam = functools.partial(torch.optim.Adam, lr=0.05)
    ours = _Model(HostEmbedding(ROWS, DIM, adam, backend="pageable", device="cpu", weight=_weight()))
    for idx, target in _batches(2):
        nn.functional.mse_loss(ours(idx), target).backward()
        ours.emb.step()
    saved = ours.state_dict()
    assert set(saved) == {"emb.weight", "head.weight", "head.bias"}
    plain = _Model(nn.Embedding(ROWS, DIM))
    plain.load_state_dict(saved)  # strict
    idx = torch.arange(ROWS)
    assert torch.equal(plain(idx), ours(idx))

    # Back, with the optimizer state kept apart: training goes on as it would have.
    optimizer_state = ours.emb.optimizer_state_dict()
    assert set(optimizer_state) == {"step", "exp_avg", "exp_avg_sq"}
    resumed = _Model(HostEmbedding(ROWS, DIM, adam, backend="pageable", device="cpu"))
    resumed.load_state_dict(plain.state_dict())
    resumed.emb.load_optimizer_state_dict(optimizer_state)
    for model in (ours, resumed):
        for idx, target in _batches(4)[2:]:
            nn.functional.mse_loss(model(idx), target).backward()
            model.emb.step()
    assert torch.equal(ours.emb.table.cpu(), resumed.emb.table.cpu())


def test_an_older_state_dict_with_optimizer_entries_still_resumes():
    adam = functools.partial(torch.optim.Adam, lr=0.05)
    source = HostEmbedding(ROWS, DIM, adam, backend="pageable", device="cpu", weight=_weight())
    idx, target = _batches(1)[0]
    nn.functional.mse_loss(source(idx), target).backward()
    source.step()
    old_format = {"weight": source.table.cpu(),
                  **{f"optimizer.{k}": v for k, v in source.optimizer_state_dict().items()}}
    target_emb = HostEmbedding(ROWS, DIM, adam, backend="pageable", device="cpu")
    target_emb.load_state_dict(old_format)
    for k, v in source.optimizer_state_dict().items():
        assert torch.equal(target_emb.optimizer_state_dict()[k], v)
    with pytest.raises(ValueError, match="no optimizer"):
        HostEmbedding.from_pretrained(_weight(), backend="pageable", device="cpu").load_optimizer_state_dict({})
