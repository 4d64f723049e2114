"""The Metal backend's shared machinery: compiled MSL libraries, from ``torch.mps.compile_shader``
on MPS or from the CPU emulator of the tests (``library``). The kernels live in each op family's
``<family>.metal``, dispatched by its ``metal.py``."""
