"""meshplan: plan distributed training of large language models.

Given a model, a cluster and a training plan, meshplan says whether the plan fits in GPU memory
(per pipeline stage), how long a step takes and where the time goes, the MFU, and what a token
budget costs, and it can show the derivation of every figure.
"""

from meshplan.errors import InputError

__all__ = ["InputError", "__version__"]
__version__ = "0.1.0"
