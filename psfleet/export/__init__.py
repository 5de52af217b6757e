"""Export for serving: a trained model as plain files, scored with no server.

``save_inference_model`` writes the dense tower (``torch.export``) and every sparse
table's rows (``.npy``, sorted keys) with a versioned ``manifest.json`` (layout in
:mod:`psfleet.export.types`); ``load_inference_model`` reads it back as an
``nn.Module`` with the training model's signature.
"""

from psfleet.export.load import InferenceModel, load_inference_model, read_manifest
from psfleet.export.lookup import SparseLookup
from psfleet.export.save import save_inference_model
from psfleet.export.tower import export_dense_tower, model_embeddings
from psfleet.export.types import FORMAT, FORMAT_VERSION, InferenceManifest, SparseTableSpec

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "InferenceManifest",
    "InferenceModel",
    "SparseLookup",
    "SparseTableSpec",
    "export_dense_tower",
    "load_inference_model",
    "model_embeddings",
    "read_manifest",
    "save_inference_model",
]
