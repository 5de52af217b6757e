"""Built-in CTR models, registered by name (importing this package registers them)."""

from psfleet.rec.models.dnn import DNN
from psfleet.rec.models.registry import build_model, list_models, register_model

__all__ = ["DNN", "build_model", "list_models", "register_model"]
