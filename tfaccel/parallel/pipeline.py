"""Model and pipeline parallelism: a model's stages on their own devices, fed micro-batches.

TensorFlow has no Keras API for either (`keras.distribution` runs on JAX and
PyTorch only), so tfaccel runs the model's layer graph itself. `pipeline_parallel`
splits a Sequential or functional tf_keras model (or a Keras 3 one of standard layers,
as its verified tf_keras translation) into consecutive stages
(`tfaccel.parallel.stages`), makes each stage's variables on its own device and
returns a `PipelineModel`, a Keras model to `compile` and `fit` as before:

- each training step splits the batch into `micro_batches` (M) parts; stage k runs
  micro-batch i on its device and hands its output to stage k+1; nothing makes stage
  k wait for stage k+1, so TensorFlow's executor may run stage k on micro-batch i
  while stage k+1 runs micro-batch i-1 (GPipe's schedule, Huang et al. 2019);
- the backward pass runs stage by stage on the same devices; the gradients of the M
  micro-batches are summed, weighted by their share of the batch, and applied once,
  with the loss scaled once per batch under mixed_float16: the update is the one the
  unsplit model makes on the whole batch (BatchNormalization excepted: it normalizes
  each micro-batch by its own statistics, as in GPipe);
- M = 1 is plain model parallelism (the stages take turns); `recompute=True` keeps only
  each stage's inputs and recomputes its activations in the backward pass
  (`tf.recompute_grad`).

`PipelineModel.placed` is the functional model itself (the same variables, placed):
save, evaluate or convert that.

Example:

    import tfaccel
    from tfaccel.parallel import pipeline

    tfaccel.split_cpu(2)                      # two logical CPUs, before TensorFlow starts
    model = tfaccel.build_model("cnn", (8, 8, 1), 10)
    staged = pipeline.pipeline_parallel(model, num_stages=2, micro_batches=4)
    tfaccel.compile_classifier(staged, tfaccel.make_optimizer("sgd", 0.05))
    print(staged.plan.table())
"""

import contextlib

import tensorflow as tf

from tfaccel import _compat, choices
from tfaccel.errors import ConfigError, ModelError
from tfaccel.keras import clone_with_weights, keras
from tfaccel.parallel import stages as stages_lib

__all__ = ["PARALLEL_MODES", "PipelineModel", "pipeline_parallel", "model_parallel",
           "parallel_devices"]
PARALLEL_MODES = choices.PARALLEL_MODES
_RANDOM = ("Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D",
           "GaussianNoise", "GaussianDropout", "AlphaDropout")


def parallel_devices(count=None):
    """The devices stages go on: the visible GPUs, else the (logical) CPUs."""
    devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
    names = [d.name for d in devices]
    return names if count is None else names[:count]


def _check_recompute(model):
    bad = [layer.name for layer in model.layers
           if type(layer).__name__ in _RANDOM and getattr(layer, "rate", None) != 0
           or isinstance(layer, keras.layers.BatchNormalization)]
    if bad:
        raise ConfigError(
            f"recompute with layer(s) {', '.join(bad)}: recomputing them in the backward pass "
            "would draw new dropout masks or update BatchNorm statistics twice; train without "
            "recompute, or without those layers")


def _placed_clone(model, plan):
    """A copy of `model` (same config and weights) with each stage's variables on its device."""
    device_of = {name: s.device for s in plan.stages for name in s.layers}
    with contextlib.ExitStack() as stack:
        def clone(layer):
            new = layer.__class__.from_config(layer.get_config())
            if layer.name in device_of:
                stack.enter_context(_compat.builds_on(new, device_of[layer.name]))
            return new

        return clone_with_weights(model, clone, nested=False)


def pipeline_parallel(model, num_stages=None, boundaries=None, devices=None, micro_batches=1,
                      recompute=False, balance="parameters", batch_size=None):
    """`model` split into stages on `devices`, trained with `micro_batches` per step.

    Args:
      model: a built Sequential or functional tf_keras model (not compiled yet: compile the
        returned model), or a Keras 3 one of standard layers (its verified tf_keras
        translation is split: `stages.splittable_model`). Its weights are copied; train the
        returned model.
      num_stages / boundaries: how to split (see `stages.plan_stages`).
      devices: one per stage; default `parallel_devices()` (GPUs, else logical CPUs).
      micro_batches: M parts per batch (1: model parallelism).
      recompute: recompute each stage's activations in the backward pass.
      balance, batch_size: see `stages.plan_stages` (batch_size also checks M divides it).

    Raises:
      ConfigError / ModelError: one line naming the problem and the fix.
    """
    if not isinstance(micro_batches, int) or micro_batches < 1:
        raise ConfigError(f"micro_batches={micro_batches!r}: must be a positive integer")
    if batch_size and batch_size % micro_batches:
        raise ConfigError(f"micro_batches={micro_batches} does not divide the batch of "
                          f"{batch_size}: use a divisor of it (or another batch size)")
    if tf.distribute.has_strategy():
        raise ConfigError("pipeline/model parallelism inside a tf.distribute strategy is not "
                          "supported: build the model outside strategy.scope()")
    model = stages_lib.splittable_model(model)
    stages_lib.check_splittable(model)
    regularized = [layer.name for layer in model.layers
                   if getattr(layer, "activity_regularizer", None) is not None]
    if regularized:
        raise ModelError(f"layer(s) {', '.join(regularized)} have an activity regularizer, "
                         "which a stage split cannot sum per micro-batch: remove it")
    if recompute:
        _check_recompute(model)
    devices = list(devices) if devices else parallel_devices()
    plan = stages_lib.plan_stages(model, num_stages, boundaries, devices, balance=balance,
                                  batch_size=batch_size, micro_batches=micro_batches)
    return PipelineModel(_placed_clone(model, plan), plan, recompute=recompute)


def model_parallel(model, num_stages=None, boundaries=None, devices=None, balance="parameters",
                   batch_size=None):
    """`model`'s stages on their own devices, one whole batch at a time (M = 1)."""
    return pipeline_parallel(model, num_stages, boundaries, devices, 1, False, balance,
                             batch_size)


def _split_sizes(n, parts):
    """`parts` sizes that sum to `n`, as equal as possible (the first ones one larger)."""
    base, extra = n // parts, n % parts
    return tf.stack([base + tf.cast(i < extra, n.dtype) for i in range(parts)])


def _parts(structure, sizes, parts):
    """`structure` (tensors, or None) split along the batch: a list of `parts` structures."""
    flat = tf.nest.flatten(structure)
    pieces = [None if t is None else tf.split(t, sizes, num=parts) for t in flat]
    return [tf.nest.pack_sequence_as(structure, [None if p is None else p[i] for p in pieces])
            for i in range(parts)]


class PipelineModel(keras.Model):
    """A functional model run as stages on devices; see the module docstring."""

    def __init__(self, placed, plan, recompute=False, **kwargs):
        super().__init__(name=f"{placed.name}_pipeline", **kwargs)
        self.placed, self.plan, self.recompute = placed, plan, bool(recompute)
        calls, self._input_ids, self._output_ids = _compat.graph_calls(placed)
        stage_of = {name: s.index for s in plan.stages for name in s.layers}
        k_max = len(plan.stages)
        self._live = [stages_lib.live_tensors(calls, self._input_ids, self._output_ids,
                                              stage_of, k) for k in range(k_max)]
        self._live.append(list(self._output_ids))
        self._calls = [[node for layer, _, _, node in calls if stage_of[layer.name] == k]
                       for k in range(k_max)]
        self.built = True

    def compile(self, *args, **kwargs):
        """Compiles the pipeline, and `placed` with the same optimizer, loss and metrics (so
        that it evaluates, and saves with the optimizer's state, as the unsplit model would)."""
        super().compile(*args, **kwargs)
        self.placed.compile(*args, **kwargs)

    @property
    def devices(self):
        return [s.device for s in self.plan.stages]

    def _stage(self, k, training):
        live_in, live_out = self._live[k], self._live[k + 1]

        def run(*tensors):
            values = dict(zip(live_in, tensors))
            for node in self._calls[k]:
                values.update(_compat.run_call(node, values, training))
            # Each output a new tensor (an identity, free), so that the next stage's inputs do
            # not depend on each other: a tape's gradient with respect to a source is the total
            # derivative, through any other source downstream of it, and the previous stage's
            # backward would count that path twice (measured: a residual stem's gradient).
            return [tf.identity(values[i]) for i in live_out]

        return tf.recompute_grad(run) if self.recompute else run

    def _flat_inputs(self, x):
        if isinstance(x, dict):
            return [x[name] for name in self.placed.input_names]
        return list(tf.nest.flatten(x))

    def _pack(self, outputs):
        return outputs[0] if len(outputs) == 1 else list(outputs)

    def _forward(self, inputs, training=None, tag="", tape=None):
        """[(stage k's inputs, its outputs)] for one (micro-)batch; the last outputs are the
        model's.

        Under `tape`, each later stage starts from a `stop_gradient` of what it receives,
        watched: the tape's backward from a stage's outputs then ends at that stage's
        inputs, and each stage's backward is computed once, on its own device (without the
        cut, the last stage's gradient call would run the whole backward on its device).
        """
        values, runs = list(inputs), []
        for k, device in enumerate(self.devices):
            with tf.device(device), tf.name_scope(f"stage_{k}{tag}"):
                if tape is not None and k:
                    values = [tf.stop_gradient(v) for v in values]
                    tape.watch([v for v in values if v.dtype.is_floating])
                outputs = list(self._stage(k, training)(*values))
            runs.append((values, outputs))
            values = outputs
        return runs

    def call(self, inputs, training=None):
        return self._pack(self._forward(self._flat_inputs(inputs), training)[-1][1])

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        xs = self._flat_inputs(x)
        m = self.plan.micro_batches
        n = tf.shape(xs[0])[0]
        sizes = _split_sizes(n, m)

        x_parts, y_parts, w_parts = (_parts(v, sizes, m) for v in (xs, y, sample_weight))
        variables = self.placed.trainable_variables
        with tf.GradientTape(persistent=True) as tape:
            regularization = tf.add_n(self.placed.losses) if self.placed.losses else None
            runs, predictions = [], []
            for i in range(m):
                stages = self._forward(x_parts[i], True, f"/micro_batch_{i}", tape)
                with tf.device(self.devices[-1]):
                    prediction = self._pack(stages[-1][1])
                    loss = self.compiled_loss(
                        y_parts[i], prediction, w_parts[i],
                        regularization_losses=None if regularization is None
                        else [tf.stop_gradient(regularization)])
                runs.append((stages, loss))
                predictions.append(prediction)
        gradients = self._backward(tape, runs, sizes, n)
        if regularization is not None:
            extra = tape.gradient(regularization, variables,
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO)
            gradients = [g + e for g, e in zip(gradients, extra)]
        del tape
        self.optimizer.apply_gradients(zip(gradients, variables))
        y_pred = tf.nest.map_structure(lambda *p: tf.concat(p, axis=0), *predictions)
        return self.compute_metrics(x, y, y_pred, sample_weight)

    def _stage_variables(self, k):
        return [v for name in self.plan.stages[k].layers
                for v in self.placed.get_layer(name).trainable_variables]

    def _backward(self, tape, runs, sizes, n):
        """The batch's gradients, stage by stage on each stage's device, summed over the
        micro-batches (each weighted by its share of the batch), unscaled."""
        scaled = isinstance(self.optimizer, keras.mixed_precision.LossScaleOptimizer)
        scale = tf.cast(self.optimizer.loss_scale, tf.float32) if scaled else 1.0
        order = {v.ref(): j for j, v in enumerate(self.placed.trainable_variables)}
        total = [[] for _ in order]
        for i, (stages, loss) in enumerate(runs):
            share = tf.cast(sizes[i], tf.float32) / tf.cast(tf.maximum(n, 1), tf.float32)
            targets, seeds = [loss], [tf.cast(scale * share, loss.dtype)]
            for k in reversed(range(len(self.devices))):
                floating = [j for j, t in enumerate(stages[k][0]) if t.dtype.is_floating]
                ins = [stages[k][0][j] for j in floating] if k else []
                own = self._stage_variables(k)
                with tf.device(self.devices[k]):
                    grads = tape.gradient(targets, ins + own, output_gradients=seeds,
                                          unconnected_gradients=tf.UnconnectedGradients.ZERO)
                for v, g in zip(own, grads[len(ins):]):
                    total[order[v.ref()]].append(g)
                if not ins:
                    break
                # the previous stage's outputs these inputs were cut from, with their gradients
                targets = [stages[k - 1][1][j] for j in floating]
                seeds = grads[:len(ins)]
        grads = []
        for g, v in zip(total, self.placed.trainable_variables):
            with tf.device(v.device):  # summed where the variable (and its update) lives
                grads.append(tf.add_n(g) if g else tf.zeros_like(v))
        return self.optimizer.get_unscaled_gradients(grads) if scaled else grads

    def get_config(self):
        return {"name": self.name, "recompute": self.recompute, "plan": self.plan.to_json()}

    def save(self, *args, **kwargs):
        """Saves the functional model itself (`placed`): the stages are how it runs."""
        return self.placed.save(*args, **kwargs)
