"""sigma_moe/framework/checkpoint.py on its own: atomic writes (fsync order, file mode), checksums,
pruning, and checkpoints that do not load moved aside with their checksums (the faults of
whole runs: tests/test_faults.py)."""
import os

import pytest

from sigma_moe.framework.checkpoint import list_checkpoints, load_latest, save_checkpoint


def test_a_checkpoint_without_its_checksum_is_used(tmp_path):
    """Killed between the checkpoint's rename and its checksum's, or copied without it: the
    file is whole (fsynced before the rename), so it is resumed from, not moved aside."""
    save_checkpoint(tmp_path, 10, {"step": 10})
    (tmp_path / "checkpoint_00000010.pt.sha256").unlink()
    assert load_latest(tmp_path, repair=True) == {"step": 10}
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint_00000010.pt"]


@pytest.mark.parametrize("keep", [1, 2, 4, 5])
def test_pruning_keeps_the_newest(tmp_path, keep):
    for step in range(1, 9):
        save_checkpoint(tmp_path, step, {"step": step}, keep=keep)
        kept = [int(p.stem.split("_")[1]) for p in list_checkpoints(tmp_path)]
        assert kept == list(range(max(1, step - keep + 1), step + 1))


def test_a_broken_newer_checkpoint_is_moved_aside_not_counted_when_pruning(tmp_path):
    """A newer checkpoint that does not load (garbage, no sidecar). Resuming moves it aside;
    left in place it was the "newest" when pruning and, with keep=1, the next save deleted
    both the checkpoint resumed from and itself."""
    save_checkpoint(tmp_path, 10, {"step": 10}, keep=1)
    (tmp_path / "checkpoint_00000020.pt").write_bytes(b"renamed, checksum never written")
    (tmp_path / ".checkpoint_00000030.pt.x.tmp").write_bytes(b"a write in progress")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert load_latest(tmp_path, warn=lambda m: None) == {"step": 10}
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # a reader changes nothing
    assert load_latest(tmp_path, warn=lambda m: None, repair=True) == {"step": 10}
    assert (tmp_path / "checkpoint_00000020.pt.bad").exists()
    assert not list(tmp_path.glob("*.tmp"))
    save_checkpoint(tmp_path, 15, {"step": 15}, keep=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint_00000015.pt"]
    assert load_latest(tmp_path) == {"step": 15}


@pytest.mark.parametrize("sidecar,error", [(True, RuntimeError("a torch bug")),
                                           (True, MemoryError()),
                                           (False, ModuleNotFoundError("No module 'numpy._core'")),
                                           (False, OSError(5, "Input/output error"))])
def test_a_whole_checkpoint_that_does_not_load_here_stops_the_run(tmp_path, monkeypatch,
                                                                   sidecar, error):
    """Its sha256 matches, or the failure is the machine's (memory, a package version, a
    network file system): moved aside, it cost the steps since the checkpoint before (and,
    both kept ones failing alike, the run). It stays, and the run stops in one line."""
    import torch

    from sigma_moe.framework.checkpoint import CheckpointUnloadable

    save_checkpoint(tmp_path, 10, {"step": 10})
    save_checkpoint(tmp_path, 20, {"step": 20})
    if not sidecar:
        (tmp_path / "checkpoint_00000020.pt.sha256").unlink()
    before = sorted(p.name for p in tmp_path.iterdir())

    def load(*args, **kwargs):
        raise error

    monkeypatch.setattr(torch, "load", load)
    with pytest.raises(CheckpointUnloadable) as e:
        load_latest(tmp_path, warn=pytest.fail, repair=True)
    assert str(e.value).startswith(f"{tmp_path / 'checkpoint_00000020.pt'} cannot be loaded "
                                   f"here ({type(error).__name__}")
    assert "\n" not in str(e.value) and "fix the cause" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_atomic_write_fsyncs_the_file_then_renames_then_fsyncs_the_directory(tmp_path,
                                                                              monkeypatch):
    """Mutants: the temp file's fsync dropped (a power loss after the rename could leave an
    empty checkpoint under the final name), and the directory's fsync dropped (the rename
    itself could be undone)."""
    import stat

    import sigma_moe.framework.checkpoint as ck

    events, fsync, replace = [], os.fsync, os.replace

    def record_fsync(fd):
        events.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        fsync(fd)

    monkeypatch.setattr(ck.os, "fsync", record_fsync)
    monkeypatch.setattr(ck.os, "replace", lambda a, b: events.append("rename") or replace(a, b))
    ck.atomic_write_bytes(tmp_path / "f.txt", b"data")
    assert events == ["fsync file", "rename", "fsync dir"]
    assert (tmp_path / "f.txt").read_bytes() == b"data" and len(list(tmp_path.iterdir())) == 1


def test_atomic_writes_get_the_usual_permissions(tmp_path):
    """Mutant: the mode left at mkstemp's 0600 (a checkpoint others in the group could not
    read to evaluate)."""
    from sigma_moe.framework.checkpoint import atomic_write_bytes

    old = os.umask(0o027)
    try:
        atomic_write_bytes(tmp_path / "f.txt", b"x")
        save_checkpoint(tmp_path, 1, {"step": 1})
    finally:
        os.umask(old)
    for name in ("f.txt", "checkpoint_00000001.pt", "checkpoint_00000001.pt.sha256"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o640, name


def test_keep_checkpoints_zero_keeps_them_all(tmp_path):
    """Mutant `if keep > 0` -> `if keep >= 0`: keep_checkpoints=0 deleted every older one."""
    for step in range(1, 5):
        save_checkpoint(tmp_path, step, {"step": step}, keep=0)
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        f"checkpoint_0000000{s}.pt" for s in range(1, 5)]


def test_a_checkpoint_moved_aside_takes_its_checksum_along(tmp_path):
    """Mutant: the sidecar of a checkpoint moved to *.pt.bad stayed. The step's next
    checkpoint, if killed before its own sidecar was written, was then checked against the
    old file's checksum and thrown away."""
    save_checkpoint(tmp_path, 2, {"step": 2})
    newest = save_checkpoint(tmp_path, 4, {"step": 4})
    newest.write_bytes(newest.read_bytes()[:50])
    assert load_latest(tmp_path, warn=lambda m: None, repair=True) == {"step": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint_00000002.pt", "checkpoint_00000002.pt.sha256", "checkpoint_00000004.pt.bad"]


class _Payload:
    """Pickles as a call of `open`: what a crafted checkpoint could run on loading."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


@pytest.mark.parametrize("sidecar", [True, False])
def test_a_checkpoint_that_would_run_code_is_not_loaded_and_stays(tmp_path, sidecar):
    """weights_only: a shared run's checkpoint (load_trained) runs nothing on loading. The
    file is whole, so it is neither moved aside nor passed over: the run stops in one line."""
    from sigma_moe.framework.checkpoint import CheckpointUnloadable

    marker = tmp_path / "ran"
    save_checkpoint(tmp_path, 10, {"step": 10})
    save_checkpoint(tmp_path, 20, {"step": 20, "x": _Payload(marker)})
    if not sidecar:
        (tmp_path / "checkpoint_00000020.pt.sha256").unlink()
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(CheckpointUnloadable) as e:
        load_latest(tmp_path, warn=pytest.fail, repair=True)
    assert not marker.exists()
    assert str(e.value) == (
        # pickle names open by its module: io.open up to Python 3.11, _io.open from 3.12
        f"{tmp_path / 'checkpoint_00000020.pt'} holds a pickled {open.__module__}.open, which "
        f"loading would call: not loaded (this framework's checkpoints hold tensors and plain "
        f"values only); if you trust the file, load it with torch.load(weights_only=False)")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_numpy_rng_state_loads_with_weights_only(tmp_path):
    import numpy as np
    import torch

    from sigma_moe.framework.runtime import rng_state

    save_checkpoint(tmp_path, 1, {"rng": [rng_state()]})
    got = load_latest(tmp_path)["rng"][0]
    want = np.random.get_state()
    assert got["numpy"][0] == want[0] and np.array_equal(got["numpy"][1], want[1])
    assert torch.equal(got["torch"], torch.get_rng_state())
