"""runtime.triton.launch.c_launch: the C launch function is called directly only under a known wrapper."""
from opforge.runtime.triton.launch import c_launch


class _Known:
    """Shaped like Triton 3.4-3.6's CudaLauncher: a wrapper around the C ``launch``."""

    def __init__(self, scratch=0):
        self.calls = []
        self.launch = lambda *args: self.calls.append(args)
        self.global_scratch_size = scratch
        self.profile_scratch_size = 0
        self.launch_cooperative_grid = False
        self.launch_pdl = True

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        global_scratch = None
        profile_scratch = None
        self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl,
                    global_scratch, profile_scratch, *args)


class _Other(_Known):
    def __call__(self, gridX, gridY, gridZ, stream, function, kernel_metadata, *args):
        self.launch(gridX, gridY, gridZ, stream, function, kernel_metadata, *args)


def test_the_direct_call_passes_what_the_wrapper_passes():
    run = _Known()
    direct = c_launch(run)
    assert direct is not None
    args = (7, 1, 1, 1234, 99, ("warps", 4), None, None, None, 0x1000, 0x2000, 3, 1.5e-5)
    run(*args)
    direct(*args)
    assert len(run.calls) == 2 and run.calls[0] == run.calls[1]


def test_unknown_wrappers_and_scratch_buffers_keep_the_wrapper():
    assert c_launch(_Other()) is None
    assert c_launch(_Known(scratch=128)) is None
    assert c_launch(object()) is None
