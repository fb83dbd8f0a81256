"""Running and measuring `.tflite` files: accuracy, latency, sizes, sparsity, agreement.

Files run with LiteRT (`ai_edge_litert`), falling back to the deprecated
`tf.lite.Interpreter` when LiteRT is not installed: `evaluate_tflite`
(accuracy and predictions over a dataset, quantizing int8 inputs and
dequantizing outputs with the tensors' scales), `measure_latency` and
`compare_latency` (single-sample latency after warm-up), `tflite_sizes` (raw
and gzipped bytes), `weight_sparsity` (zeros in the stored weights) and
`prediction_agreement`. The files come from `tfaccel.compress.tflite`.

Example:

    from tfaccel.compress import tflite_eval

    print(tflite_eval.evaluate_tflite("out/model_int8.tflite", splits.test)["accuracy"])
    print(tflite_eval.measure_latency("out/model_int8.tflite")["mean_us"])
    print(tflite_eval.tflite_sizes("out/model_int8.tflite"))
"""

import numpy as np
import tensorflow as tf

from tfaccel import _compat
from tfaccel.compress import latency
from tfaccel.compress.tflite import is_batched
from tfaccel.errors import DataError, ModelError, first_line
from tfaccel.io import file_size, gzipped_size
from tfaccel.keras import keras


def make_interpreter(model, num_threads=None):
    """A LiteRT interpreter (tf.lite's if LiteRT is missing) for a path or flatbuffer bytes.

    When the default XNNPACK delegate cannot run the model (it rejects
    sparse-encoded int8 weights, for one), the builtin kernels run it instead.
    """
    try:
        # deferred: LiteRT (ai_edge_litert), only to run a file
        from ai_edge_litert.interpreter import Interpreter, OpResolverType
    except ImportError:  # LiteRT is an optional dependency
        Interpreter, OpResolverType = tf.lite.Interpreter, tf.lite.experimental.OpResolverType
    source = {"model_content": bytes(model)} if isinstance(model, (bytes, bytearray)) \
        else {"model_path": str(model)}
    try:
        interpreter = Interpreter(**source, num_threads=num_threads)
    except ValueError as e:
        raise ModelError(f"cannot load TFLite model {source.get('model_path', '<bytes>')!r}: "
                         f"{first_line(e)}; give a .tflite file written by "
                         "convert_to_tflite") from None
    try:
        interpreter.allocate_tensors()
    except RuntimeError:
        interpreter = Interpreter(
            **source, num_threads=num_threads,
            experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        interpreter.allocate_tensors()
    return interpreter


def _to_input(x, detail):
    """Quantizes float examples with the input's scale and zero point when it is quantized
    (an integer input without a scale, such as token ids, is fed as it is)."""
    dtype = detail["dtype"]
    scale, zero_point = detail["quantization"]
    if np.issubdtype(dtype, np.integer) and scale:
        info = np.iinfo(dtype)
        x = np.clip(np.round(x / scale + zero_point), info.min, info.max)
    return x.astype(dtype)


def _from_output(y, detail):
    if np.issubdtype(detail["dtype"], np.integer):
        scale, zero_point = detail["quantization"]
        return (y.astype(np.float32) - zero_point) * scale
    return y.astype(np.float32)


def _run(interpreter, x):
    inp = interpreter.get_input_details()[0]
    if tuple(inp["shape"]) != x.shape:
        interpreter.resize_tensor_input(inp["index"], list(x.shape))
        interpreter.allocate_tensors()
        inp = interpreter.get_input_details()[0]
    interpreter.set_tensor(inp["index"], _to_input(x, inp))
    interpreter.invoke()
    out = interpreter.get_output_details()[0]
    return _from_output(interpreter.get_tensor(out["index"]), out)


def _arrays(dataset):
    """(x, y) NumPy arrays of a dataset of (x, label), batched or not, or an (x, y) tuple."""
    if isinstance(dataset, tuple):
        return np.asarray(dataset[0], np.float32), np.asarray(dataset[1])
    if not isinstance(dataset.element_spec, tuple):
        raise DataError("evaluate_tflite needs a dataset of (example, label) pairs")
    if not is_batched(dataset.element_spec[0]):
        dataset = dataset.batch(1024)
    xs, ys = [], []
    for x, y in dataset.as_numpy_iterator():
        xs.append(x)
        ys.append(y.reshape(-1))
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys)


def predict_tflite(model, x, batch_size=256, num_threads=None, progress=False):
    """Float class scores of a `.tflite` model for examples `x` (int8 handled)."""
    interpreter = make_interpreter(model, num_threads)
    bar = keras.utils.Progbar(len(x), unit_name="example") if progress else None
    outputs = []
    for start in range(0, len(x), batch_size):
        batch = x[start:start + batch_size]
        outputs.append(_run(interpreter, batch))
        if bar is not None:
            bar.add(len(batch))
    return np.concatenate(outputs)


def evaluate_tflite(model, dataset, batch_size=256, num_threads=None, progress=True):
    """Accuracy and predicted classes of a `.tflite` model over a labelled dataset.

    Example:

        evaluate_tflite("model_int8.tflite", splits.test)   # {'accuracy': 0.97, ...}

    Args:
      model: a `.tflite` path or its bytes.
      dataset: `tf.data.Dataset` of (x, label), batched or not, or an (x, y) tuple.
      batch_size: examples per interpreter call.
      num_threads: interpreter threads (None: LiteRT's default).
      progress: show a progress bar.

    Returns:
      {'accuracy', 'num_examples', 'predictions' (class ids, NumPy)}.
    """
    x, y = _arrays(dataset)
    scores = predict_tflite(model, x, batch_size, num_threads, progress)
    predictions = scores.argmax(-1)
    return {"accuracy": float(np.mean(predictions == y.reshape(-1))),
            "num_examples": len(y), "predictions": predictions}


def _one_invocation(model, example, num_threads):
    """A function running one single-sample invocation of `model` (`example`: random if None)."""
    interpreter = make_interpreter(model, num_threads)
    inp = interpreter.get_input_details()[0]
    shape = [1, *inp["shape_signature"][1:]]
    if example is None:
        example = np.random.default_rng(0).random(shape, dtype=np.float32)
    example = np.asarray(example, np.float32).reshape(shape)
    if tuple(inp["shape"]) != tuple(shape):
        interpreter.resize_tensor_input(inp["index"], shape)
        interpreter.allocate_tensors()
        inp = interpreter.get_input_details()[0]
    quantized, index = _to_input(example, inp), inp["index"]

    def invoke():
        interpreter.set_tensor(index, quantized)
        interpreter.invoke()

    return invoke


def measure_latency(model, example=None, num_runs=200, warmup=20, num_threads=1):
    """Single-sample latency of a `.tflite` model after warm-up, in microseconds.

    Args:
      model: a `.tflite` path or its bytes.
      example: one input of shape (1, *input_shape) (random if None).
      num_runs: timed invocations.
      warmup: untimed invocations first.
      num_threads: interpreter threads.

    Returns:
      {'mean_us', 'p50_us', 'p90_us', 'num_runs', 'num_threads'}.
    """
    return compare_latency({"model": model}, example, num_runs, warmup, num_threads,
                           rounds=1)["model"]


def compare_latency(models, example=None, num_runs=200, warmup=20, num_threads=1, rounds=5):
    """Single-sample latencies of several `.tflite` models, measured interleaved.

    Each model runs `num_runs / rounds` timed invocations per round, in turn,
    so that load from other processes on a shared machine falls on all of them
    alike; their ratios are then fair even when the absolute times are noisy
    (`tfaccel.compress.latency`, the harness Keras models are timed with too).

    Example:

        lat = compare_latency({"float": "f.tflite", "int8": "q.tflite"})
        lat["float"]["p50_us"] / lat["int8"]["p50_us"]   # speed-up of int8

    Args:
      models: {name: `.tflite` path or bytes}.
      example: one input (random if None).
      num_runs: timed invocations per model in total.
      warmup: untimed invocations per model first.
      num_threads: interpreter threads.
      rounds: how many interleaved rounds `num_runs` is split into.

    Returns:
      {name: {'mean_us', 'p50_us', 'p90_us', 'num_runs', 'num_threads'}}.

    Raises:
      ConfigError: `num_runs` < 1, `warmup` < 0 or `rounds` < 1.
    """
    stats = latency.compare_latencies(
        models, lambda model: _one_invocation(model, example, num_threads), num_runs, warmup,
        rounds)
    return {name: dict(s, num_threads=num_threads) for name, s in stats.items()}


def tflite_sizes(path):
    """{'bytes': raw size, 'gzip_bytes': gzip -9 size} of a `.tflite` file."""
    return {"bytes": file_size(path), "gzip_bytes": gzipped_size(path)}


def _names_layer(tensor_name, layer_names):
    """The layer of `layer_names` a converted tensor belongs to, or None.

    The converter names a weight after its op's path, e.g.
    `resnet/quant_stage0_block0_a_conv/Conv2D;...` (QAT wraps layers as `quant_<name>`).
    """
    segments = tensor_name.split(";")[0].split("/")
    return next((name for name in layer_names
                 if name in segments or f"quant_{name}" in segments), None)


def weight_sparsity(model, min_weights=1024, layer_names=None):
    """Share of zeros in the weight tensors stored in a `.tflite` file.

    Reads the constant tensors themselves, so it shows whether pruning's zeros
    survived quantization and conversion (a sparse-encoded file is not read).
    An int8 weight counts as zero when it equals its zero point.

    Args:
      model: a `.tflite` path or its bytes.
      min_weights: without `layer_names`, count the >= 2-D weights of at least
        this many elements.
      layer_names: count only the weights of these Keras layers (e.g. the
        pruned ones, `PruningPlan.pruned`), whatever their size.

    Returns:
      {'weights': count, 'zeros': count, 'sparsity': share, 'tensors': {name: share}},
      and with `layer_names` also 'layers': {layer: share}.

    Raises:
      ModelError: a layer of `layer_names` has no weight tensor in the file.
    """
    interpreter = make_interpreter(model)
    # Activations are the outputs of ops; what no op produces and is no input is a constant.
    produced = _compat.tflite_op_outputs(interpreter)
    produced |= {d["index"] for d in interpreter.get_input_details()}
    weights = zeros = 0
    tensors, layers = {}, {}
    for detail in interpreter.get_tensor_details():
        if detail["index"] in produced or len(detail["shape"]) < 2 or detail["sparsity_parameters"]:
            continue
        layer = _names_layer(detail["name"], layer_names) if layer_names is not None else None
        if layer_names is not None and layer is None:
            continue
        if layer_names is None and int(np.prod(detail["shape"])) < min_weights:
            continue
        try:
            values = interpreter.get_tensor(detail["index"])
        except ValueError:
            continue
        zero = int(np.count_nonzero(values == detail["quantization"][1]
                                    if np.issubdtype(values.dtype, np.integer) else values == 0))
        weights += values.size
        zeros += zero
        tensors[detail["name"]] = zero / values.size
        if layer is not None:
            total = layers.get(layer, (0, 0))
            layers[layer] = (total[0] + zero, total[1] + values.size)
    result = {"weights": weights, "zeros": zeros,
              "sparsity": zeros / weights if weights else 0.0, "tensors": tensors}
    if layer_names is not None:
        missing = sorted(set(layer_names) - set(layers))
        if missing:
            raise ModelError(f"no weights of layers {', '.join(missing)} in the TFLite file: "
                             "pass the names of Keras layers the model was converted from")
        result["layers"] = {name: z / n for name, (z, n) in layers.items()}
    return result


def prediction_agreement(predictions_a, predictions_b):
    """Share of examples on which two models predict the same class (class ids or scores)."""
    a, b = np.asarray(predictions_a), np.asarray(predictions_b)
    a = a.argmax(-1) if a.ndim > 1 else a
    b = b.argmax(-1) if b.ndim > 1 else b
    if a.shape != b.shape:
        raise DataError(f"cannot compare predictions of shapes {a.shape} and {b.shape}: "
                        "score the same examples with both models")
    return float(np.mean(a == b))
