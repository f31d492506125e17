"""A process killed with SIGKILL while it writes a checkpoint leaves the previous checkpoint loadable."""

import signal
import subprocess
import sys
import textwrap

import torch

from rz_agents.trainer.checkpoint import load_checkpoint, save_checkpoint

# Saves checkpoint 1, then dies by SIGKILL in the middle of writing checkpoint 2: half of checkpoint 2's
# real bytes reach the disk (flushed and fsynced), then the process is killed, as by the OOM killer.
_CHILD = textwrap.dedent(
    """
    import io, os, signal, sys
    import torch
    from rz_agents.trainer import checkpoint

    path = sys.argv[1]
    checkpoint.save_checkpoint(path, {"w": torch.zeros(50_000)}, {"steps": 1})
    real_save = torch.save

    def killed_midway(obj, f, *args, **kwargs):
        buf = io.BytesIO()
        real_save(obj, buf, *args, **kwargs)
        data = buf.getvalue()
        f.write(data[: len(data) // 2])
        f.flush()
        os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)

    checkpoint.torch.save = killed_midway
    checkpoint.save_checkpoint(path, {"w": torch.ones(50_000)}, {"steps": 2})
    """
)


def test_sigkill_inside_the_checkpoint_write_leaves_the_previous_checkpoint(tmp_path):
    path = tmp_path / "checkpoint.pt"
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    torn = list(tmp_path.glob(".checkpoint.pt.*.tmp"))
    assert len(torn) == 1 and torn[0].stat().st_size > 0  # the kill really happened inside the write
    payload = load_checkpoint(path, restore_rng=False)
    assert payload["runtime"] == {"steps": 1} and torch.equal(payload["learner"]["w"], torch.zeros(50_000))
    # The next save replaces the checkpoint and removes the torn temporary file.
    save_checkpoint(path, {"w": torch.ones(3)}, {"steps": 3})
    assert not list(tmp_path.glob("*.tmp"))
    assert load_checkpoint(path, restore_rng=False)["runtime"] == {"steps": 3}
