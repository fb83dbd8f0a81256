"""tfaccel: make TensorFlow/Keras training faster and lighter, and trained models smaller.

Helpers, each usable alone in your own tf_keras code; the recipes in
`recipes/` drive the same helpers from flags.

Example:

    import tfaccel

    splits = tfaccel.load_dataset("digits")
    model = tfaccel.build_model("cnn", splits.info.input_shape, splits.info.num_classes)
"""

__version__ = "0.1.0"

from tfaccel.data import (  # noqa: E402
    DATASETS,
    DatasetInfo,
    Splits,
    batch_dataset,
    load_dataset,
)
from tfaccel.errors import (  # noqa: E402
    ConfigError,
    DataError,
    ModelError,
    TfaccelError,
    UnsupportedLayerError,
    WrongKerasError,
)
from tfaccel.keras import ensure_tf_keras, keras  # noqa: E402
from tfaccel.models import MODELS, build_model, load_model_file, resolve_model  # noqa: E402
from tfaccel.summaries import read_scalars, read_text  # noqa: E402
from tfaccel.training import (  # noqa: E402
    compile_classifier,
    evaluate,
    export_model,
    make_optimizer,
)
