"""Built-in CTR models, registered by name (importing this package registers them):
``dnn``, ``wide_deep``, ``deepfm``, ``dcn_v2``."""

from psfleet.rec.models.dcn_v2 import CrossNetwork, DCNv2
from psfleet.rec.models.deepfm import DeepFM, fm_second_order
from psfleet.rec.models.dnn import DNN
from psfleet.rec.models.mlp import mlp_tower, paddle_linear
from psfleet.rec.models.registry import build_model, list_models, register_model
from psfleet.rec.models.wide_deep import WideDeep

__all__ = ["DCNv2", "DNN", "CrossNetwork", "DeepFM", "WideDeep", "build_model",
           "fm_second_order", "list_models", "mlp_tower", "paddle_linear", "register_model"]
