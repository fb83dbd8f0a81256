"""tfaccel's learning-rate schedules on Keras 3 optimizers.

The schedules of `tfaccel.train.schedules` are tf_keras `LearningRateSchedule`s.
A Keras 3 optimizer calls a rate with its step only if it is a *Keras 3*
`LearningRateSchedule` (any other callable it calls with no argument), so
`for_keras(schedule, "keras3")` wraps one in `Keras3Schedule`: the same rate
at every step, saved with a Keras 3 model's optimizer to ``.keras`` and loaded
back (registered as ``tfaccel>Keras3Schedule``; `keras3_schedule_class()`
registers it, which `tfaccel.train.models.load_model_file` does before loading).

Example:

    from tfaccel.keras import keras3
    from tfaccel.train import schedule_bridge, schedules

    lr = schedules.make_schedule("cosine", 1e-3, steps_per_epoch=20, epochs=30, warmup_epochs=2)
    optimizer = keras3().optimizers.Adam(schedule_bridge.for_keras(lr, "keras3"))
"""

from tfaccel.keras import keras, keras3

_CLASS = []


def keras3_schedule_class():
    """The Keras 3 `LearningRateSchedule` that runs a tf_keras one (made, and registered with
    Keras 3's serialization, on first call: importing this module imports no Keras 3)."""
    if _CLASS:
        return _CLASS[0]
    keras_3 = keras3()

    @keras_3.saving.register_keras_serializable(package="tfaccel")
    class Keras3Schedule(keras_3.optimizers.schedules.LearningRateSchedule):
        """A tf_keras `LearningRateSchedule` (`schedule`) as a Keras 3 one: same rate, same step."""

        def __init__(self, schedule, steps_per_update=1):
            super().__init__()
            if isinstance(schedule, dict):  # from_config: the tf_keras schedule's serialization
                import tfaccel.train.schedules  # noqa: F401 -- registers tfaccel's schedules

                schedule = keras.optimizers.schedules.deserialize(schedule)
            self.schedule = schedule
            self.steps_per_update = int(steps_per_update)

        def __call__(self, step):
            if self.steps_per_update > 1:  # Keras 3 gives the step counting accumulated batches
                step = step // self.steps_per_update
            return self.schedule(step)

        def get_config(self):
            return {"schedule": keras.optimizers.schedules.serialize(self.schedule),
                    "steps_per_update": self.steps_per_update}

    _CLASS.append(Keras3Schedule)
    return Keras3Schedule


def for_keras(learning_rate, flavour, steps_per_update=1):
    """`learning_rate` (a float or a tf_keras schedule) as an optimizer of `flavour` takes it.

    A float, and anything already of that Keras, is returned unchanged; a tf_keras
    `LearningRateSchedule` given for 'keras3' comes back wrapped in `Keras3Schedule`.
    `steps_per_update` is the optimizer's `gradient_accumulation_steps`: Keras 3 then
    calls a schedule with the batches seen, and the wrapper gives it the updates made,
    which is what tfaccel's schedules count (as with tfaccel's own accumulation).
    """
    if flavour == "keras3" and isinstance(learning_rate,
                                          keras.optimizers.schedules.LearningRateSchedule):
        return keras3_schedule_class()(learning_rate, steps_per_update)
    return learning_rate
