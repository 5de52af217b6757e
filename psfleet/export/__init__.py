"""Export for serving: a trained model as plain files, scored with no server.

``save_inference_model`` writes the dense tower (``torch.export``) and every sparse
table's rows (``.npy``, sorted keys) with a versioned ``manifest.json`` (layout in
:mod:`psfleet.export.types`); ``load_inference_model`` reads it back as an
``nn.Module`` with the training model's signature. Every table is carried: pooled
(multi-valued), weighted and ``shared_ids`` tables of a ``FeatureEmbeddings`` read
inputs of their own (:mod:`psfleet.export.plan`). ``export_from_saves`` writes the
same export from a base save and its delta saves, with no server.
"""

from psfleet.export.from_saves import export_from_saves
from psfleet.export.load import InferenceModel, load_inference_model, read_manifest
from psfleet.export.lookup import SparseLookup
from psfleet.export.plan import TowerInputs, TowerPlan
from psfleet.export.save import save_inference_model
from psfleet.export.tower import export_dense_tower, model_embeddings, tower_input_names
from psfleet.export.types import (
    FORMAT,
    FORMAT_VERSION,
    FeaturesSpec,
    InferenceManifest,
    SparseTableSpec,
    TableInputSpec,
)

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "FeaturesSpec",
    "InferenceManifest",
    "InferenceModel",
    "SparseLookup",
    "SparseTableSpec",
    "TableInputSpec",
    "TowerInputs",
    "TowerPlan",
    "export_dense_tower",
    "export_from_saves",
    "load_inference_model",
    "model_embeddings",
    "read_manifest",
    "save_inference_model",
    "tower_input_names",
]
