"""The run two fault modules start from (test_reliability_e2e, test_resume_fallback)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from fault_driver import HUNG_ONCE_REWARD, Driver

# The drivers these tests start get Ctrl-C as from a terminal. A shell that starts pytest in the background
# (`cmd &` without job control) leaves SIGINT ignored, the one disposition a child inherits across exec, and
# Python then installs no KeyboardInterrupt handler in the drivers: give them the default back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def four_steps(demo_dir, tmp_path_factory) -> Path:
    """The real driver, 4 steps saving steps 2 and 4, scored by ``HUNG_ONCE_REWARD`` (``hung_once_reward.py``
    in the demo dir) whose first call hangs until reward.timeout=3 cuts it (that sample scores 0). Its
    directory holds ``driver_0.log`` and ``ckpt/``: copy it before changing anything."""
    reward = demo_dir / "hung_once_reward.py"
    reward.write_text(HUNG_ONCE_REWARD)
    run = tmp_path_factory.mktemp("four_steps")
    driver = Driver(demo_dir, run, [
        f"custom_reward_function.path={reward}", "custom_reward_function.name=score",
        f"+custom_reward_function.reward_kwargs.hang_marker={run / 'hung_once'}",
        "trainer.total_training_steps=4", "trainer.save_freq=2", "reward.timeout=3"])
    assert driver.wait(timeout=900) == 0, driver.text()[-4000:]
    assert (run / "ckpt" / "global_step_2").is_dir() and (run / "ckpt" / "global_step_4").is_dir()
    return run
