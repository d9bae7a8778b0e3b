"""slmlab: build, train, evaluate, compare and serve small language models.

``import slmlab`` registers every family with transformers' ``AutoConfig`` and
``AutoModelForCausalLM``.
"""

from . import models
from .models import families, get_family

__version__ = "0.1.0"
__all__ = ["families", "get_family", "models", "__version__"]
