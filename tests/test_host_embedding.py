"""HostEmbedding (speedlib/transfer/embedding.py) on its own terms: checkpoints and optimizer state,
one trainer per table, stepping through emb.optimizer, lookups that never reach a backward, the
padding row, from_pretrained, memory-mapped tables, .weight, and the misuses refused with what
to do. Its equivalence with nn.Embedding and torch.optim is in tests/test_transfer.py; its
ranks under torch.distributed in tests/test_embedding_ranks.py.
"""

from __future__ import annotations

import functools
import gc
import os
import warnings

import numpy as np
import pytest
import torch
from embedding_bits import DIM, ROWS, _batches, _host, _loss, _train_host, _train_reference, _with_padding
from torch import nn
from torch.nn import functional as F
from transfer_bits import ALL, _reference, needs_cuda

from speedlib.transfer import HostEmbedding, HostTable

# --- training, checkpoints and the optimizer ----------------------------------------------

def test_weight_decay_and_momentum_leave_untouched_rows_alone():
    w = _reference(ROWS, DIM)
    emb, _ = _train_host(w, functools.partial(torch.optim.AdamW, lr=0.05, weight_decay=0.5), _batches())
    assert torch.equal(emb.table.cpu()[ROWS // 2:], w[ROWS // 2:])
    for table in emb._state_tables.values():
        assert not table.cpu()[ROWS // 2:].any()


def test_embedding_state_dict_round_trip_continues_identically():
    w = _reference(ROWS, DIM)
    make = functools.partial(torch.optim.Adam, lr=0.05)
    batches = _batches(steps=4)
    first, _ = _train_host(w, make, batches[:2])
    saved = {k: v.clone() for k, v in nn.Sequential(first).state_dict().items()}
    assert set(saved) == {"0.weight"}  # loads strictly into a model with a plain nn.Embedding too
    optimizer_state = first.optimizer_state_dict()
    assert set(optimizer_state) == {"step", "exp_avg", "exp_avg_sq"}
    restored = nn.Sequential(HostEmbedding(ROWS, DIM, make, backend="pageable", device="cpu"))
    restored.load_state_dict(saved)
    restored[0].load_optimizer_state_dict(optimizer_state)
    for model in (first, restored[0]):
        for idx, target in batches[2:]:
            _loss(model(idx), target).backward()
            model.step()
    assert torch.equal(first.table.cpu(), restored[0].table.cpu())
    with pytest.raises(RuntimeError, match="Missing key"):
        nn.Sequential(HostEmbedding(ROWS, DIM, make, backend="pageable", device="cpu")).load_state_dict({})


_RESUMABLE = {
    "adam": functools.partial(torch.optim.Adam, lr=0.05),
    "adagrad": functools.partial(torch.optim.Adagrad, lr=0.05, initial_accumulator_value=0.1),
    "sgd_momentum": functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9, weight_decay=0.01),
}


def _resume_run(make, saver: str, table_weight: bool):
    """Two steps, save what `saver` says, rebuild and load in a fresh embedding, two more steps;
    against the same four steps uninterrupted. Returns both tables and optimizer states."""
    w, batches = _reference(ROWS, DIM), _batches(steps=4)
    build = (lambda: HostEmbedding(ROWS, DIM, make, weight=HostTable.from_tensor(w.clone(), backend="pageable"))) \
        if table_weight else (lambda: HostEmbedding(ROWS, DIM, make, weight=w.clone(), backend="pageable",
                                                    device="cpu"))
    straight, first = build(), build()
    for emb, part in ((straight, batches), (first, batches[:2])):
        for idx, target in part:
            _loss(emb(idx), target).backward()
            emb.step()
    model_state = {k: v.clone() for k, v in nn.Sequential(first).state_dict().items()}
    optimizer_state = (first.optimizer_state_dict() if saver == "optimizer_state_dict"
                       else first.optimizer.state_dict())
    optimizer_state = torch.utils._pytree.tree_map(lambda v: v.clone() if torch.is_tensor(v) else v, optimizer_state)
    del first
    resumed = build()
    if saver == "optimizer_state_dict":
        nn.Sequential(resumed).load_state_dict(model_state)
        resumed.load_optimizer_state_dict(optimizer_state)
    else:  # the loop every training script has, in the other order: optimizers first
        resumed.optimizer.load_state_dict(optimizer_state)
        nn.Sequential(resumed).load_state_dict(model_state)
    for idx, target in batches[2:]:
        _loss(resumed(idx), target).backward()
        resumed.step()
    return straight, resumed


@pytest.mark.parametrize("table_weight", [False, True], ids=["tensor_weight", "host_table_weight"])
@pytest.mark.parametrize("saver", ["optimizer_state_dict", "optimizer.state_dict"])
@pytest.mark.parametrize("name", list(_RESUMABLE))
def test_a_resumed_embedding_trains_on_bitwise_like_the_uninterrupted_run(name, saver, table_weight):
    straight, resumed = _resume_run(_RESUMABLE[name], saver, table_weight)
    assert torch.equal(straight.table.cpu(), resumed.table.cpu())
    want, got = straight.optimizer_state_dict(), resumed.optimizer_state_dict()
    assert want.keys() == got.keys() and want.keys()
    for key in want:
        assert torch.equal(torch.as_tensor(want[key]), torch.as_tensor(got[key])), key


@pytest.mark.parametrize("name", list(_RESUMABLE))
def test_a_weight_loaded_without_its_optimizer_state_stops_the_next_step_naming_what_is_missing(name):
    """state_dict() holds the weight alone (it loads into a plain nn.Embedding); training on
    without the optimizer state differed silently from the uninterrupted run (issue 53)."""
    make = _RESUMABLE[name]
    trained, _ = _train_host(_reference(ROWS, DIM), make, _batches(steps=2))
    emb = HostEmbedding(ROWS, DIM, make, backend="pageable", device="cpu")
    emb.load_state_dict(trained.state_dict())
    idx, target = _batches(steps=1)[0]
    _loss(emb(idx), target).backward()
    missing = {"adam": "exp_avg, exp_avg_sq, step", "adagrad": "step, sum", "sgd_momentum": "momentum_buffer"}[name]
    for stepping in (emb.step, emb.optimizer.step):
        with pytest.raises(RuntimeError, match=f"not its optimizer state \\({missing}\\).*reset_optimizer_state"):
            stepping()
    emb.reset_optimizer_state()  # a fine-tune from pretrained weights, on purpose
    emb.step()
    assert not torch.equal(emb.table.cpu(), trained.table.cpu())


def test_an_optimizer_without_state_resumes_from_the_weight_alone():
    make = functools.partial(torch.optim.SGD, lr=0.05)
    w, batches = _reference(ROWS, DIM), _batches(steps=4)
    straight, _ = _train_host(w, make, batches)
    first, _ = _train_host(w, make, batches[:2])
    resumed = HostEmbedding(ROWS, DIM, make, backend="pageable", device="cpu")
    resumed.load_state_dict(first.state_dict())
    _train_host(w, make, batches[2:], emb=resumed)
    assert torch.equal(straight.table.cpu(), resumed.table.cpu())


@pytest.mark.parametrize("backend", ALL)
def test_embedding_trains_on_int32_indices_as_on_int64(backend):
    """int32 lookups train like int64 ones (step() writes rows found from those indices)."""
    w, make = _reference(ROWS, DIM), functools.partial(torch.optim.Adam, lr=0.05)
    want, _ = _train_host(w, make, _batches(), backend=backend)
    got, _ = _train_host(w, make, [(idx.to(torch.int32), t) for idx, t in _batches()], backend=backend)
    assert torch.equal(got.table.cpu().cpu(), want.table.cpu().cpu())
    assert not torch.equal(got.table.cpu().cpu(), w)


def _assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]) if isinstance(a[key], torch.Tensor) else a[key] == b[key], key


@pytest.mark.parametrize("make", [
    functools.partial(torch.optim.Adam, lr=0.05),
    functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
    functools.partial(torch.optim.Adagrad, lr=0.1, initial_accumulator_value=0.3),  # has state before any step
], ids=["adam", "sgd-momentum", "adagrad"])
def test_a_weight_loaded_into_a_trained_embedding_needs_a_decision_on_its_optimizer_state(make):
    """A weight alone must not train on with the target's own optimizer state (Adam's step
    count, momentum): the next step raises, and reset_optimizer_state() starts afresh."""
    w, batches = _reference(ROWS, DIM), _batches(steps=6)
    source = HostEmbedding(ROWS, DIM, make, backend="pageable", device="cpu", weight=w)
    tables = []
    for saved in (source.state_dict(), {"weight": w.clone()}):
        target, _ = _train_host(_reference(ROWS, DIM, seed=3), make, batches[:3])
        target.load_state_dict(saved)
        _assert_same_state(target.state_dict(), source.state_dict())
        with pytest.raises(RuntimeError, match="not its optimizer state"):
            _train_host(None, None, batches[3:4], emb=target)
        target.zero_grad()
        target.reset_optimizer_state()
        tables.append(_train_host(None, None, batches[3:], emb=target)[0].table.cpu())
    _train_host(None, None, batches[3:], emb=source)
    assert all(torch.equal(t, source.table.cpu()) for t in tables)


def test_a_frozen_embedding_without_optimizer_loads_a_trained_checkpoint():
    """Inference loads a trained checkpoint, optimizer entries and all, as with nn.Embedding."""
    trained, _ = _train_host(_reference(ROWS, DIM), functools.partial(torch.optim.Adam, lr=0.05), _batches(steps=2))
    frozen = HostEmbedding.from_pretrained(torch.zeros(ROWS, DIM), backend="pageable", device="cpu")
    frozen.load_state_dict(trained.state_dict())  # strict
    assert torch.equal(frozen.table.cpu(), trained.table.cpu())
    with pytest.raises(RuntimeError, match='Unexpected key.*"bias"'):  # other keys are still unexpected
        frozen.load_state_dict({**trained.state_dict(), "bias": torch.zeros(1)})


@pytest.mark.parametrize("weight", ["x", 3, [[0.0] * DIM] * ROWS], ids=["str", "int", "list"])
def test_a_weight_that_is_not_a_tensor_is_refused_by_name(weight):
    """As nn.Embedding does: load_state_dict's RuntimeError, naming the key and what was wrong."""
    emb = HostEmbedding.from_pretrained(_reference(ROWS, DIM), backend="pageable", device="cpu")
    with pytest.raises(RuntimeError, match=f"weight: src must be a tensor, got {type(weight).__name__}"):
        emb.load_state_dict({"weight": weight})
    assert torch.equal(emb.table.cpu(), _reference(ROWS, DIM))


def test_a_table_has_one_trainer_at_a_time():
    """Two trainers would each write back rows gathered before the other's step(): refused."""
    make = functools.partial(torch.optim.SGD, lr=0.1)
    table = HostTable.from_tensor(_reference(ROWS, DIM), backend="pageable", device="cpu")
    trainer = HostEmbedding(ROWS, DIM, make, weight=table)
    with pytest.raises(ValueError, match="already trained by another HostEmbedding.*several times per step"):
        HostEmbedding(ROWS, DIM, make, weight=table)
    reader = HostEmbedding(ROWS, DIM, make, weight=table, freeze=True)  # frozen ones share the table
    _loss(trainer(torch.tensor([1, 2])), torch.zeros(2, DIM)).backward()
    trainer.step()
    assert torch.equal(reader(torch.tensor([1, 2])), table.cpu()[[1, 2]])  # and see the trainer's writes
    with pytest.raises(ValueError, match="already trained"):
        reader.freeze = False
    trainer.freeze = True  # training passes to another once the trainer is frozen...
    reader.freeze = False
    with pytest.raises(ValueError, match="already trained"):
        trainer.freeze = False
    del reader
    gc.collect()
    trainer.freeze = False  # ...or gone


def test_stepping_the_optimizer_directly_is_emb_step_and_lr_schedulers_still_work():
    """emb.optimizer.step() (a loop stepping every optimizer, GradScaler) is emb.step(): it
    writes the rows back; a following emb.step() raises instead of updating twice. LR
    schedulers, which wrap optimizer.step to count calls, keep working through emb.step()."""
    w, make = _reference(ROWS, DIM), functools.partial(torch.optim.SGD, lr=0.1)
    emb = HostEmbedding(ROWS, DIM, make, backend="pageable", device="cpu", weight=w)
    ref = nn.Embedding.from_pretrained(w.clone(), freeze=False)
    ref_opt = make(ref.parameters())
    scheds = [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5) for opt in (emb.optimizer, ref_opt)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step, (idx, target) in enumerate(_batches(steps=3)):
            _loss(emb(idx), target).backward()
            if step == 0:
                emb.optimizer.step()
                with pytest.raises(RuntimeError, match="needs a forward pass.*already stepped"):
                    emb.step()
            else:
                emb.step()
            ref_opt.zero_grad()
            _loss(ref(idx), target).backward()
            ref_opt.step()
            for sched in scheds:
                sched.step()
    assert not [c for c in caught if "lr_scheduler" in str(c.message)]  # the schedulers saw the optimizer steps
    assert emb.optimizer.param_groups[0]["lr"] == 0.1 * 0.5 ** 3
    assert torch.equal(emb.table.cpu(), ref.weight.detach())


def test_embedding_misuse_is_explained():
    make = functools.partial(torch.optim.SGD, lr=0.1)
    emb = HostEmbedding(ROWS, DIM, make, backend="pageable", device="cpu")
    with pytest.raises(RuntimeError, match="needs a forward pass"):
        emb.step()
    emb(torch.tensor([1]))
    emb(torch.tensor([2]))  # a second lookup in one step is fine (word2vec's positives and negatives)
    emb.step()  # no backward ran: nothing changes, and the next forward is allowed
    with torch.no_grad():
        assert torch.equal(emb(torch.tensor([[1, 2]])), emb.table.cpu()[torch.tensor([[1, 2]])])
    with pytest.raises(IndexError):
        emb(torch.tensor([ROWS]))
    with pytest.raises(TypeError, match="callable"):
        HostEmbedding(ROWS, DIM, torch.optim.SGD([torch.zeros(1, requires_grad=True)]), backend="pageable",
                      device="cpu")
    with pytest.raises(TypeError, match="must return a torch.optim.Optimizer"):
        HostEmbedding(ROWS, DIM, lambda params: params, backend="pageable", device="cpu")
    with pytest.raises(ValueError, match="weight must have shape"):
        HostEmbedding(ROWS, DIM, make, backend="pageable", device="cpu", weight=torch.zeros(3, 3))


def test_embedding_rows_are_not_model_parameters():
    """A model optimizer built from model.parameters() must not update the rows a second time."""
    model = nn.Sequential(HostEmbedding(ROWS, DIM, functools.partial(torch.optim.SGD, lr=0.1), backend="pageable",
                                        device="cpu"), nn.Linear(DIM, 1))
    assert [p.shape for p in model.parameters()] == [torch.Size([1, DIM]), torch.Size([1])]


def test_lr_scheduler_keys_do_not_break_new_state():
    emb = HostEmbedding(ROWS, DIM, functools.partial(torch.optim.Adam, lr=0.05), backend="pageable", device="cpu")
    torch.optim.lr_scheduler.StepLR(emb.optimizer, step_size=1)  # adds initial_lr to the group
    emb(torch.tensor([1, 2])).sum().backward()
    emb.step()
    assert set(emb._state_tables) == {"exp_avg", "exp_avg_sq"}


# --- lookups without backward -------------------------------------------------------------

def test_lookups_without_backward_touch_nothing():
    """Lookups whose outputs never reach a backward, before the training lookup, after it, or
    between backward and step(), leave the table and state as if they had not happened.
    AdamW's weight decay would move any row counted as touched, even with a zero gradient."""
    w = _reference(ROWS, DIM)
    make = functools.partial(torch.optim.AdamW, lr=0.05, weight_decay=0.5)
    plain, _ = _train_host(w, make, _batches())
    emb = HostEmbedding(ROWS, DIM, make, backend="pageable", device="cpu", weight=w)
    unused = torch.arange(ROWS // 2, ROWS).reshape(4, -1)  # rows no training batch uses
    emb(unused[0])
    emb.step()  # only lookups without backward since the last step: nothing changes, no error
    assert torch.equal(emb.table.cpu(), w)
    for idx, target in _batches():
        emb(unused[1])  # evaluation without torch.no_grad(), result dropped
        out = emb(idx)
        dropped = _loss(emb(unused[2]), torch.zeros(DIM))  # a loss never backpropagated
        _loss(out, target).backward()
        emb(unused[3])  # between backward and step
        emb.step()
        del dropped
    assert torch.equal(emb.table.cpu(), plain.table.cpu())
    assert torch.equal(emb.table.cpu()[ROWS // 2:], w[ROWS // 2:])
    for key, table in emb._state_tables.items():
        assert torch.equal(table.cpu(), plain._state_tables[key].cpu()), key


def test_a_gradient_arriving_after_step_updates_the_current_rows():
    """An output looked up before step() and backpropagated after it: its gradient is applied
    at the next step() to the rows as they are then, as nn.Embedding + SGD does."""
    w, a, b = _reference(ROWS, DIM), torch.tensor([1, 2, 3]), torch.tensor([3, 4])  # row 3 in both
    target = torch.randn(3, DIM, generator=torch.Generator().manual_seed(9))
    ref = nn.Embedding.from_pretrained(w.clone(), freeze=False)
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    emb = HostEmbedding(ROWS, DIM, functools.partial(torch.optim.SGD, lr=0.5), backend="pageable", device="cpu",
                        weight=w)
    for model, step in ((ref, opt.step), (emb, emb.step)):
        late = _loss(model(a), target)
        _loss(model(b), target[:2]).backward()
        step()
        opt.zero_grad()
        late.backward()
        step()
    assert torch.equal(emb.table.cpu(), ref.weight.detach())


def test_zero_grad_drops_gathered_gradients():
    w = _reference(ROWS, DIM)
    emb = HostEmbedding(ROWS, DIM, functools.partial(torch.optim.SGD, lr=0.5), backend="pageable", device="cpu",
                        weight=w)
    emb(torch.tensor([1, 2])).sum().backward()
    emb.zero_grad()
    emb.step()
    assert torch.equal(emb.table.cpu(), w)


# --- padding_idx, from_pretrained ---------------------------------------------------------

def test_padding_row_is_never_written_not_even_by_weight_decay_or_momentum():
    """The padding row is not a touched row: no update, no optimizer state, whatever the optimizer."""
    w, pad = _reference(ROWS, DIM), 3
    batches = _with_padding(_batches(), pad)
    for make in (functools.partial(torch.optim.AdamW, lr=0.05, weight_decay=0.5),
                 functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9, weight_decay=0.1)):
        emb, _ = _train_host(w, make, batches, padding_idx=pad)
        assert torch.equal(emb.table.cpu()[pad], w[pad])
        assert emb._state_tables and all(not t.cpu()[pad].any() for t in emb._state_tables.values())
    # ...and the other rows train as with SparseAdam on nn.Embedding(padding_idx=...).
    ref_w, _ = _train_reference(w, functools.partial(torch.optim.SparseAdam, lr=0.05), batches, sparse=True,
                                padding_idx=pad)
    emb, _ = _train_host(w, functools.partial(torch.optim.Adam, lr=0.05), batches, padding_idx=pad)
    torch.testing.assert_close(emb.table.cpu(), ref_w, rtol=1e-5, atol=1e-6)


def test_padding_row_starts_as_zeros_with_random_init_as_in_nn_embedding():
    torch.manual_seed(0)
    emb = HostEmbedding(ROWS, DIM, functools.partial(torch.optim.SGD, lr=0.1), backend="pageable", device="cpu",
                        padding_idx=-2)
    assert emb.padding_idx == ROWS - 2 == nn.Embedding(ROWS, DIM, padding_idx=-2).padding_idx
    table = emb.table.cpu()
    assert not table[ROWS - 2].any() and table[ROWS - 1].all()
    # A given weight keeps its padding row, as nn.Embedding's _weight and from_pretrained do.
    w = _reference(ROWS, DIM)
    kept = HostEmbedding(ROWS, DIM, None, freeze=True, backend="pageable", device="cpu", weight=w, padding_idx=0)
    assert torch.equal(kept.table.cpu()[0], w[0])


@pytest.mark.parametrize("pad,error,message", [
    (ROWS, ValueError, "padding_idx must be within num_embeddings"),
    (-ROWS - 1, ValueError, "padding_idx must be within num_embeddings"),
    (1.5, TypeError, "padding_idx must be an int"),
    (True, TypeError, "padding_idx must be an int"),
])
def test_bad_padding_idx_is_refused(pad, error, message):
    with pytest.raises(error, match=message):
        HostEmbedding(ROWS, DIM, functools.partial(torch.optim.SGD, lr=0.1), backend="pageable", device="cpu",
                      padding_idx=pad)


def test_from_pretrained_frozen_looks_up_only():
    w = _reference(ROWS, DIM, dtype=torch.float64)
    emb = HostEmbedding.from_pretrained(w, backend="pageable", device="cpu")  # frozen, no optimizer needed
    ref = nn.Embedding.from_pretrained(w)
    idx = torch.tensor([[1, 2], [2, 7]])
    out = emb(idx)
    assert emb.freeze and emb.table.dtype == torch.float64
    assert torch.equal(out, ref(idx)) and not out.requires_grad and not ref(idx).requires_grad
    emb.step()  # a frozen table's step() writes nothing
    w.add_(1.0)  # the table holds a copy
    assert torch.equal(emb.table.cpu(), w - 1.0)
    with pytest.raises(ValueError, match="without an optimizer"):
        emb.freeze = False


def test_from_pretrained_and_new_arguments_refuse_bad_input():
    make = functools.partial(torch.optim.SGD, lr=0.1)
    with pytest.raises(ValueError, match="must be 2-D"):
        HostEmbedding.from_pretrained(torch.zeros(5), backend="pageable", device="cpu")
    with pytest.raises(TypeError, match="embeddings must be a tensor"):
        HostEmbedding.from_pretrained([[1.0, 2.0]], backend="pageable", device="cpu")
    with pytest.raises(ValueError, match="optimizer=None is for frozen embeddings only"):
        HostEmbedding.from_pretrained(torch.zeros(5, 2), freeze=False, backend="pageable", device="cpu")
    table = HostTable(ROWS, DIM, backend="pageable", device="cpu")
    with pytest.raises(ValueError, match="brings its own backend"):
        HostEmbedding(ROWS, DIM, make, weight=table, backend="pageable")
    with pytest.raises(ValueError, match="weight must have shape"):
        HostEmbedding(ROWS + 1, DIM, make, weight=table)
    # A HostTable weight is trained in place.
    emb = HostEmbedding.from_pretrained(table, make, freeze=False)
    assert emb.table is table


# --- memory-mapped tables -------------------------------------------------------------------

def _in_file_mapping(address: int, path) -> bool:
    """Whether `address` lies in a mapping of `path` in this process (Linux's /proc/self/maps):
    true of a memory-mapped table, false of any copy of it in ordinary memory."""
    target = os.path.realpath(path)
    with open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() == target:
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                if lo <= address < hi:
                    return True
    return False


needs_proc_maps = pytest.mark.skipif(not os.path.exists("/proc/self/maps"),
                                     reason="tells a file mapping from a copy through Linux's /proc/self/maps")


@needs_proc_maps
@pytest.mark.parametrize("backend", ["pageable", pytest.param("pinned", marks=needs_cuda)])
def test_memory_mapped_table_trains_in_the_file(tmp_path, backend):
    """'pinned' indexes the mapped file on the CPU into its pinned staging buffers; its
    Adam runs on the GPU, so it matches the CPU reference to rounding, not bitwise."""
    tolerance = {"rtol": 0, "atol": 0} if backend == "pageable" else {"rtol": 1e-5, "atol": 1e-6}
    w, path = _reference(ROWS, DIM), tmp_path / "emb.npy"
    np.save(path, w.numpy())
    make = functools.partial(torch.optim.Adam, lr=0.05)
    in_ram, _ = _train_host(w, make, _batches())
    emb = HostEmbedding.from_pretrained(path, make, freeze=False, backend=backend,
                                        device="cpu" if backend == "pageable" else None)
    assert emb.table.file == str(path) and emb.table.writable
    assert _in_file_mapping(emb.table.cpu().data_ptr(), path)  # mapped, not read into RAM
    emb, _ = _train_host(None, None, _batches(), emb=emb)
    torch.testing.assert_close(emb.table.cpu(), in_ram.table.cpu(), **tolerance)
    assert _in_file_mapping(emb.table.cpu().data_ptr(), path)  # still the file after training
    emb.table.flush()
    on_disk = torch.from_numpy(np.load(path))  # read afresh, not mapped
    torch.testing.assert_close(on_disk, in_ram.table.cpu(), **tolerance)
    assert not torch.equal(on_disk, w)


def test_read_only_mapping_looks_up_but_never_writes(tmp_path):
    w, path = _reference(ROWS, DIM), tmp_path / "emb.npy"
    np.save(path, w.numpy())
    make = functools.partial(torch.optim.SGD, lr=0.1)
    frozen = HostEmbedding.from_pretrained(path, make, backend="pageable", device="cpu")  # frozen: opened read-only
    assert not frozen.table.writable and "read-only" in repr(frozen.table)
    assert torch.equal(frozen(torch.tensor([1, 5])), w[[1, 5]])
    frozen.step()  # nothing to write
    with pytest.raises(ValueError, match="read-only and cannot be trained"):
        frozen.freeze = False
    with pytest.raises(ValueError, match="read-only: open it with mode 'r\\+'"):
        frozen.table.scatter_(torch.tensor([1]), torch.zeros(1, DIM))
    with pytest.raises(ValueError, match="read-only"):
        frozen.table.copy_(torch.zeros(1, DIM))
    with pytest.raises(ValueError, match="read-only and cannot be trained"):
        HostEmbedding.from_pretrained(np.load(path, mmap_mode="r"), make, freeze=False, backend="pageable",
                                      device="cpu")
    with pytest.raises(ValueError, match="no writable weight"):  # a write through a view would crash, not raise
        frozen.weight.data.zero_()
    with pytest.raises(ValueError, match="max_norm renormalises .* read-only"):
        HostEmbedding.from_pretrained(path, max_norm=1.0, backend="pageable", device="cpu")
    assert torch.equal(torch.from_numpy(np.load(path)), w)


# --- drop-in gaps with nn.Embedding (issue 31): .weight, options, dtypes ------------------

def test_weight_written_between_backward_and_step_is_what_step_updates():
    """A write through .weight after the lookup reaches the update, as with nn.Embedding (whose
    optimizer steps the weight as it is at step time)."""
    w, (idx, target) = _reference(ROWS, DIM), _batches(steps=1)[0]
    ref = nn.Embedding.from_pretrained(w.clone(), freeze=False)
    emb = _host(w)
    for e in (ref, emb):
        _loss(e(idx), target).backward()
        with torch.no_grad():
            e.weight[idx[0, 0]] = 3.0
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    emb.step()
    assert torch.equal(emb.table.cpu(), ref.weight.detach())


def test_tying_the_table_to_another_layer_is_refused_with_what_to_do():
    """A layer computing with the table would get no gradient into it (only lookups train
    it): silently untied. Refused, naming the full-vocabulary lookup that ties correctly."""
    emb = _host(_reference(ROWS, DIM))
    h = torch.randn(3, DIM, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"emb\(torch.arange\(emb.num_embeddings\)\)"):
        F.linear(h, emb.weight)
    with pytest.raises(RuntimeError, match=r"emb\(torch.arange"):
        F.linear(h.detach(), nn.Parameter(emb.weight))
    with pytest.raises(AttributeError, match="cannot be replaced.*copy_"):
        emb.weight = nn.Parameter(torch.zeros(ROWS, DIM))
    # Reading the table under grad mode stays possible, and the tie that works trains as tying does.
    assert torch.equal(emb.weight.sum(0), emb.table.cpu().sum(0))
    ref = nn.Embedding.from_pretrained(_reference(ROWS, DIM), freeze=False)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for e in (ref, emb):
        logits = F.linear(e(torch.tensor([1, 2, 2])), e.weight if e is ref else e(torch.arange(e.num_embeddings)))
        F.cross_entropy(logits, torch.tensor([4, 5, 6])).backward()
    ref_opt.step()
    emb.step()
    torch.testing.assert_close(emb.table.cpu(), ref.weight.detach(), rtol=0, atol=1e-7)


def test_max_norm_renormalises_looked_up_rows_in_place_also_without_gradients():
    """nn.Embedding renormalises the rows a lookup uses in the weight itself, frozen or not."""
    w = _reference(ROWS, DIM) * 3
    ref = nn.Embedding.from_pretrained(w.clone(), max_norm=1.0)
    emb = HostEmbedding.from_pretrained(w, max_norm=1.0, backend="pageable", device="cpu")
    idx = torch.tensor([[1, 4], [4, 9]])
    with torch.no_grad():
        assert torch.equal(emb(idx), ref(idx))
    assert torch.equal(emb.table.cpu(), ref.weight.detach())
    assert not torch.equal(emb.table.cpu(), w)


def test_sparse_false_and_impossible_options_are_refused_by_name():
    with pytest.raises(ValueError, match="sparse=False.*only the rows a batch touched"):
        _host(sparse=False)
    with pytest.raises(ValueError, match="max_norm must be positive"):
        _host(max_norm=0.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'sprase'"):
        _host(sprase=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_weight_dtype_is_inferred_as_from_pretrained_does(dtype):
    w = _reference(ROWS, DIM, dtype=dtype)
    emb, ref = _host(w), nn.Embedding.from_pretrained(w, freeze=False)
    pre = HostEmbedding.from_pretrained(w, backend="pageable", device="cpu")
    idx = torch.tensor([1, 7])
    assert emb.table.dtype == pre.table.dtype == ref.weight.dtype == dtype
    assert torch.equal(emb(idx).detach(), ref(idx).detach()) and torch.equal(emb.weight, pre.weight)
    with pytest.raises(TypeError, match="cast explicitly"):  # an explicit dtype that disagrees is not a silent cast
        _host(w, dtype=torch.float32)
