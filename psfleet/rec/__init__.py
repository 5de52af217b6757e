"""CTR layer: metrics and the built-in models (registered by name)."""

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
