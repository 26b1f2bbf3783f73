"""The stop flag: first signal asks for a clean stop, a second one aborts at once."""

import os
import signal
import subprocess
import sys
import textwrap
import time

from cosmos_rl.dist.preempt import StopFlag


def test_first_signal_sets_the_flag_without_stopping_the_process():
    flag = StopFlag().install()
    try:
        assert not flag.should_stop()
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)
        assert flag.signalled == "SIGUSR1" and flag.should_stop()
    finally:
        flag.uninstall()


def test_second_signal_before_the_commit_aborts_with_exit_1():
    code = textwrap.dedent(
        """
        import os, signal, time
        from cosmos_rl.dist.preempt import StopFlag
        flag = StopFlag().install()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        print("still running", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        print("not reached", flush=True)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert "still running" in result.stdout and "not reached" not in result.stdout
    assert result.returncode == 1
    assert "second SIGTERM: aborting" in result.stderr


def test_second_signal_after_the_commit_changes_nothing():
    code = textwrap.dedent(
        """
        import os, signal, time
        from cosmos_rl.dist.preempt import StopFlag
        flag = StopFlag().install()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        flag.mark_committed()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        print("still running", flag.should_stop(), flush=True)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and "still running SIGTERM" in result.stdout
    assert "already committed" in result.stderr


def test_ctrl_c_is_a_stop_signal_not_a_keyboard_interrupt():
    """SIGINT (Ctrl-C, or a scheduler signalling the group) asks for the same clean stop, and the
    handler it replaced (Python's KeyboardInterrupt) is back after uninstall."""
    previous = signal.getsignal(signal.SIGINT)
    flag = StopFlag().install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # a KeyboardInterrupt would have been raised here
        assert flag.signalled == "SIGINT" and flag.should_stop() == "SIGINT"
    finally:
        flag.uninstall()
    assert signal.getsignal(signal.SIGINT) is previous
