"""Fixtures of the op tests.

Under the interpreter, the general path launches ``launcher.kernel[grid](*args)``; plans exist
only where ``launcher.raw_launcher(key)`` gives a compiled launch, which the interpreter has not.
``record_launches`` wraps the first and fakes the second, logging both with tensors as pointers.
"""
import pytest
import torch


def record_launches(monkeypatch, launchers, log):
    """Log ("general" | "plan", grid_x, args-as-pointers) for every launch through ``launchers``."""

    class Recorder:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            run = self.kernel[grid]

            def launch(*args, **kwargs):
                log.append(("general", grid[0],
                            tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)))
                return run(*args, **kwargs)
            return launch

    def fake_raw_launcher(key):
        def go(grid_x, raw_args, index):
            log.append(("plan", grid_x, tuple(raw_args)))
            return True
        return go

    for launcher in launchers:
        monkeypatch.setattr(launcher, "kernel", Recorder(launcher.kernel))
        monkeypatch.setattr(launcher, "raw_launcher", fake_raw_launcher)


@pytest.fixture
def launch_log(monkeypatch):
    """``(log, record)``: ``record(launchers)`` logs the launches through them into ``log``
    (see ``record_launches``)."""
    log = []
    return log, lambda launchers: record_launches(monkeypatch, launchers, log)


#: Every backend a test can run here: the torch path and Triton (on the GPU, or in the interpreter
#: without one), and Metal in the MSL emulator (marked ``emulator``: scripts/gpu_test.sh leaves it out).
EVERY_BACKEND = [pytest.param("torch"), pytest.param("triton"),
                 pytest.param("metal", marks=pytest.mark.emulator)]


@pytest.fixture(params=EVERY_BACKEND)
def every_backend(request):
    """The backend name; for ``"metal"`` with the Metal emulator set up (the ``emulate`` fixture)."""
    if request.param == "metal":
        request.getfixturevalue("emulate")
    return request.param
