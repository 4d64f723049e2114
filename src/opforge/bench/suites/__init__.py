"""Built-in benchmark ops and suites; importing this package registers them."""

from opforge.bench.suites import norm, softmax_act, standard  # noqa: F401
from opforge.bench.suites import attention  # noqa: F401
from opforge.bench.suites import quant  # noqa: F401
from opforge.bench.suites import torch_path  # noqa: F401
