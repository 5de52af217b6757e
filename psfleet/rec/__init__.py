"""CTR layer: metrics and the built-in models (registered by name).

The names below are imported on first use (:mod:`psfleet._lazy`): a command that only
reads a config (``psfleet k8s render``, ``psfleet --help``) does not import torch.
"""

from typing import TYPE_CHECKING

from psfleet._lazy import lazy_exports

if TYPE_CHECKING:
    from psfleet.metrics import StreamingAuc, auc, log_loss
    from psfleet.rec.models import DNN, build_model, list_models, register_model

__all__ = [
    "DNN",
    "StreamingAuc",
    "auc",
    "build_model",
    "list_models",
    "log_loss",
    "register_model",
]

__getattr__ = lazy_exports(__name__, {
    "DNN": "psfleet.rec.models",
    "StreamingAuc": "psfleet.metrics",
    "auc": "psfleet.metrics",
    "build_model": "psfleet.rec.models",
    "list_models": "psfleet.rec.models",
    "log_loss": "psfleet.metrics",
    "register_model": "psfleet.rec.models",
})
