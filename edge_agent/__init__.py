"""edge_agent: run models on the device, decide per request where they run.

The public API is what ``__all__`` lists; everything else is internal.
"""

from edge_agent.profiles import DeviceProfile, ProfileStore, detect_profile
from edge_core.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigError,
    EdgeError,
    InferenceError,
    InputError,
    ModelLoadError,
    ModelNotFoundError,
    NoVariantError,
    PackageError,
    ProfileError,
)
from edge_core.package import ModelPackage, ModelRepository, Variant, load_package
from edge_core.runtime import RuntimeOptions, Session, open_best, open_model, open_variant
from edge_core.tensors import TensorSpec

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "BackendUnavailableError",
    "ConfigError",
    "DeviceProfile",
    "EdgeError",
    "InferenceError",
    "InputError",
    "ModelLoadError",
    "ModelNotFoundError",
    "ModelPackage",
    "ModelRepository",
    "NoVariantError",
    "PackageError",
    "ProfileError",
    "ProfileStore",
    "RuntimeOptions",
    "Session",
    "TensorSpec",
    "Variant",
    "__version__",
    "detect_profile",
    "load_package",
    "open_best",
    "open_model",
    "open_variant",
]
