"""Continue a prompt with a language model that recipes/train_lm.py exported.

    python recipes/generate.py --model_dir=runs/lm-text-gpt --prompt="The "
    python recipes/generate.py --model_dir=runs/lm-text-gpt --prompt="def " \\
        --max_new_tokens=400 --temperature=0.7 --top_k=20 --seed=3

Loads model.keras and vocabulary.json from --model_dir (tfaccel's GPT, or a Keras 3 model
such as KerasHub's GPT-2 from train_lm.py --model=gpt2, with its own cache) and prints the
prompt and its continuation. The same --seed gives the same text; --temperature=0 always
picks the most likely token. A prompt with characters a character-level vocabulary lacks
is one error line (a byte-level model takes any text).
"""

import common
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", "runs/lm-text-gpt", "Folder with model.keras and "
                    "vocabulary.json (what recipes/train_lm.py writes).")
flags.DEFINE_string("prompt", "The ", "Text to continue.")
flags.DEFINE_integer("max_new_tokens", 200, "Tokens to generate.", lower_bound=1)
flags.DEFINE_float("temperature", 0.8, "Sampling temperature (0: greedy).", lower_bound=0.0)
flags.DEFINE_integer("top_k", 0, "Sample among the k most likely tokens only (0: all).",
                     lower_bound=0)
flags.DEFINE_integer("seed", 0, "Seed of the sampling.")
flags.DEFINE_bool("use_cache", True, "Decode with the model's key/value cache (--nouse_cache: "
                  "the whole window for every token, the same text, to compare).")
flags.DEFINE_integer("slide", 1, "Tokens a full window drops at once past the model's context "
                     "(1: always the last context tokens; larger: fewer rebuilds of the cache).",
                     lower_bound=1)


def main(argv):
    common.reject_extra_args(argv)
    import os

    from tfaccel.data import text
    from tfaccel.train import generate

    path = os.path.join(FLAGS.model_dir, generate.VOCABULARY_FILE)
    if os.path.exists(path):  # a prompt the vocabulary cannot spell: one line, no model loaded
        text.load_vocabulary(path).encode(FLAGS.prompt)
    model, vocab = generate.load_language_model(FLAGS.model_dir)
    text = generate.generate(model, vocab, FLAGS.prompt, FLAGS.max_new_tokens,
                             temperature=FLAGS.temperature, top_k=FLAGS.top_k or None,
                             seed=FLAGS.seed, use_cache=FLAGS.use_cache, slide=FLAGS.slide)
    print(FLAGS.prompt + text)


if __name__ == "__main__":
    common.flagkit.run(main)
