"""Training a next-token language model: its loss, its epoch metrics, and text samples.

A language model here is any model from token ids `[batch, T]` to float32 logits
`[batch, T, vocabulary]`: tfaccel's GPT (`tfaccel.train.gpt.build_gpt`, tf_keras), or a
Keras 3 / KerasHub causal LM (`tfaccel.train.causal_lm`). It compiles with the
mean next-token cross-entropy in nats (what "validation loss 1.37" means in nanoGPT's
reports too), and two callbacks turn that loss into the numbers people compare:
`LanguageModelMetrics` adds bits per character (or byte) and perplexity, for training and
validation, and tokens per second to each epoch's logs (so `summaries.TensorBoard` writes
them beside the loss), and `SampleLogger` writes a continuation of a fixed prompt to
TensorBoard's Text tab after every epoch.

Example:

    from tfaccel.train import gpt, language_model, training

    model = gpt.build_gpt(gpt.gpt_config("tiny", vocab_size=splits.vocab.size))
    language_model.compile_language_model(model, training.make_optimizer("adamw", 1e-3))
    model.fit(train, validation_data=val, epochs=8, steps_per_epoch=250, callbacks=[
        summaries.ThroughputLogger("runs/lm/logs/train", 12),
        language_model.LanguageModelMetrics(sequence_length=64, unit="char"),
        summaries.TensorBoard("runs/lm/logs")])
"""

import math

from tfaccel import summaries
from tfaccel.errors import ConfigError
from tfaccel.keras import is_keras3_object, keras, keras_of
from tfaccel.train.generate import generate, model_context

UNITS = {"char": "char", "byte": "byte"}  # tokenizer -> what one token is


def compile_language_model(model, optimizer, jit_compile=False, steps_per_execution=1):
    """Compiles `model` (logits out, either Keras: tfaccel's GPT or a Keras 3 / KerasHub
    causal LM) for next-token targets: cross-entropy from logits, in nats per token, and
    next-token accuracy. The optimizer must be of the model's Keras
    (`make_optimizer(flavour=...)`)."""
    keras = keras_of(model)
    if keras_of(optimizer) is not keras:
        raise ConfigError(f"the optimizer is a {keras_of(optimizer).__name__} one but model "
                          f"{model.name!r} is a {keras.__name__} model: make it with "
                          "make_optimizer(..., flavour=tfaccel.keras.flavour_of(model))")
    extra = {"weighted_metrics": None} if is_keras3_object(model) else {}  # not KerasHub's own
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")], **extra,
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return model


def language_model_metrics(loss, unit="char"):
    """{'bits_per_<unit>', 'perplexity'} of a mean cross-entropy `loss` in nats per token."""
    return {f"bits_per_{unit}": loss / math.log(2.0),
            "perplexity": math.exp(min(loss, 700.0))}


class LanguageModelMetrics(keras.callbacks.Callback):
    """Adds bits per token, perplexity (training and validation) and tokens/s to epoch logs.

    Put it after `summaries.ThroughputLogger` (whose `examples_per_sec` it turns into
    tokens: one example is `sequence_length` tokens) and before `summaries.TensorBoard`,
    which then writes `epoch_bits_per_char`, `epoch_perplexity`, `epoch_tokens_per_sec` in
    train/ and the validation ones in validation/. It reads only the epoch's logs.
    """

    def __init__(self, sequence_length, unit="char"):
        super().__init__()
        self.sequence_length = int(sequence_length)
        self.unit = UNITS.get(unit, unit)
        self.history = []

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        values = {}
        for prefix in ("", "val_"):
            if f"{prefix}loss" in logs:
                for name, v in language_model_metrics(float(logs[f"{prefix}loss"]),
                                                      self.unit).items():
                    values[prefix + name] = v
        if "examples_per_sec" in logs:
            values["tokens_per_sec"] = float(logs["examples_per_sec"]) * self.sequence_length
        logs.update(values)
        self.history.append(values)


class SampleLogger(keras.callbacks.Callback):
    """Writes a continuation of `prompt` as TensorBoard text (`samples/generated`) and
    prints it, after every epoch, with a fixed seed (so epochs differ only by the model).

    The sample is generated with the model's key/value cache (`generate`'s default), and
    once it fills the model's context the window drops half of it at once (`slide`), so
    that the cache serves all but one token in context/2 instead of none: the default
    run's 200-token sample at context 64 took 0.35 s, against 1.03 s before the cache
    and 0.80 s with the cache but a window sliding by one (docs/language-models.md). The
    text after the first `context` tokens therefore differs from `generate`'s default
    (`slide=1`).

    Args:
      logdir: TensorBoard log directory (the train run's).
      vocab: the `tfaccel.data.text.Vocabulary` the model was trained with.
      prompt: text the samples start from; checked against `vocab` when made.
      max_new_tokens, temperature, top_k, seed: as `tfaccel.train.generate.generate`.
      printer: where each sample is printed (None: not printed).
      slide: as `generate` (None: half the model's context).
      use_cache: as `generate`.
    """

    def __init__(self, logdir, vocab, prompt, max_new_tokens=200, temperature=0.8, top_k=None,
                 seed=0, printer=print, slide=None, use_cache=True):
        super().__init__()
        vocab.encode(prompt)  # a prompt the vocabulary cannot spell fails before training
        self.logdir, self.vocab, self.prompt = str(logdir), vocab, prompt
        self.max_new_tokens, self.temperature, self.top_k = max_new_tokens, temperature, top_k
        self.seed, self.printer = seed, printer
        self.slide, self.use_cache = slide, use_cache
        self.samples = []

    def on_epoch_end(self, epoch, logs=None):
        model = getattr(self.model, "placed", self.model)  # a PipelineModel's own layers
        slide = self.slide or max(model_context(model) // 2, 1)
        text = generate(model, self.vocab, self.prompt, self.max_new_tokens,
                        temperature=self.temperature, top_k=self.top_k, seed=self.seed,
                        use_cache=self.use_cache, slide=slide)
        self.samples.append({"epoch": epoch + 1, "text": text})
        summaries.write_text(self.logdir, "samples/generated",
                             f"epoch {epoch + 1}, prompt {self.prompt!r}:\n\n"
                             + _as_markdown_code(self.prompt + text), step=epoch + 1)
        if self.printer is not None:
            self.printer(f"sample after epoch {epoch + 1}: {self.prompt + text!r}")


def _as_markdown_code(text):
    """`text` as a Markdown code block (TensorBoard renders text summaries as Markdown)."""
    return "\n".join("    " + line for line in text.splitlines() or [""])
