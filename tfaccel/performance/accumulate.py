"""Gradient accumulation: the update of a big batch with the memory of a small one.

`enable_gradient_accumulation(model, steps=N)` makes each training step split
its batch into N micro-batches, run forward and backward on them one after
another (a `tf.while_loop`, so only one micro-batch's activations are alive at
a time), add up their gradients and apply them once. The batch the dataset
yields is the batch the optimizer sees, so with `--batch_size=256
--grad_accum_steps=4` the update is that of a 256 batch computed 64 at a time.
This is the "microbatching" of T5X/big_vision rather than applying every N
`fit` steps, which keeps the rest of Keras exact: `optimizer.iterations`,
learning-rate schedules, callbacks and `steps_per_epoch` all count real
optimizer steps.

Each micro-batch's mean loss is weighted by its share of the batch, so the sum
is the batch's mean loss and the gradient equals the one-batch gradient.
Under a distribution strategy each replica splits its own part of the batch,
and the optimizer's usual all-reduce sums the replicas' accumulated
gradients once per step. Under mixed_float16 each micro-batch's loss is
scaled by the LossScaleOptimizer and its gradients unscaled before they are
added, so an overflow anywhere makes the step skip, as it would without
accumulation. BatchNormalization sees micro-batches, as it would with any
accumulation.

Example:

    from tfaccel.performance import accumulate
    from tfaccel.train import training

    training.compile_classifier(model, training.make_optimizer("sgd", 0.1))
    accumulate.enable_gradient_accumulation(model, steps=4)
    model.fit(train_ds.batch(256), epochs=5)   # 4 micro-batches of 64 per update
"""

import types

import tensorflow as tf

from tfaccel.choices import check_accumulation_steps as check_accumulation_steps
from tfaccel.errors import ModelError
from tfaccel.keras import keras, keras_of
from tfaccel.train.precision import scaled_gradients


def _micro_bounds(n, steps):
    """Start and end row of each of `steps` nearly equal micro-batches of `n` rows."""
    count = tf.minimum(tf.cast(steps, n.dtype), n)  # never an empty micro-batch
    i = tf.range(count + 1)
    return (i * n) // count, count


def accumulating_train_step(model, data, steps):
    """One optimizer step on `data` computed as `steps` micro-batches (see module doc).

    Usable as a custom `train_step` body: `enable_gradient_accumulation`
    installs it on a model.
    """
    keras3 = keras_of(model) is not keras  # Keras 3 tracks the loss in its own metric
    x, y, sample_weight = keras_of(model).utils.unpack_x_y_sample_weight(data)
    variables = model.trainable_variables
    loss_metric = next((m for m in model.metrics if m.name == "loss"), None) if keras3 else None
    replicas = tf.distribute.get_strategy().num_replicas_in_sync  # Keras 3 divides the loss
    n = tf.shape(tf.nest.flatten(x)[0])[0]
    bounds, count = _micro_bounds(n, steps)

    def take(struct, start, end):
        return tf.nest.map_structure(lambda t: t[start:end], struct) if struct is not None else None

    def body(k, accumulated):
        start, end = bounds[k], bounds[k + 1]
        xk, yk, wk = take(x, start, end), take(y, start, end), take(sample_weight, start, end)
        share = tf.cast(end - start, tf.float32) / tf.cast(n, tf.float32)
        with tf.GradientTape() as tape:
            y_pred = model(xk, training=True)
            loss = model.compute_loss(xk, yk, y_pred, wk)
            weighted = loss * tf.cast(share, loss.dtype)
        grads = scaled_gradients(tape, weighted, variables, model.optimizer)
        if keras3:
            model.compute_metrics(xk, yk, y_pred, wk)
            if loss_metric is not None:
                loss_metric.update_state(loss * replicas, sample_weight=end - start)
        else:
            model.compiled_metrics.update_state(yk, y_pred, wk)
        accumulated = [a if g is None else a + tf.cast(tf.convert_to_tensor(g), a.dtype)
                       for a, g in zip(accumulated, grads)]
        return k + 1, accumulated

    zeros = [tf.zeros(v.shape, v.dtype) for v in variables]
    # parallel_iterations=1: one micro-batch at a time, which is the memory saving.
    _, total = tf.while_loop(lambda k, _: k < count, body, (tf.constant(0), zeros),
                             parallel_iterations=1)
    model.optimizer.apply_gradients(zip(total, variables))
    return model.get_metrics_result()


def enable_gradient_accumulation(model, steps):
    """Makes `model.fit` accumulate gradients over `steps` micro-batches per batch.

    Call after `compile` (calling `compile` again keeps accumulation). With
    `steps=1` the model is left unchanged.

    Args:
      model: a built model of either Keras (a Keras 3 model may instead take Keras 3's
        own optimizer argument, `training.make_optimizer(accumulation_steps=N)`, on one
        replica: under a `tf.distribute` strategy, Keras 3.15's fails).
      steps: micro-batches per optimizer step (>= 1).

    Returns:
      `model`.

    Raises:
      ConfigError: `steps` < 1.
      ModelError: the model is not built (its variables must exist before
        the accumulation loop is traced).
    """
    check_accumulation_steps(steps)
    if not model.built:
        raise ModelError(f"model {model.name!r} is not built: build it (call it on data or give "
                         "it an Input) before enabling gradient accumulation")
    if steps == 1:
        return model

    def train_step(self, data):
        return accumulating_train_step(self, data, steps)

    model.train_step = types.MethodType(train_step, model)
    model.grad_accum_steps = steps
    model.train_function = None  # make fit retrace with the new step
    return model
