"""recipes/optimize_lm.py end to end: bad flags are one line before TensorFlow; a run on a
folder like train_lm.py's writes the report, the files and TensorBoard, and exits 0."""

import json

import numpy as np
import pytest
from conftest import check_flag_error, run_recipe

from tfaccel import summaries
from tfaccel.data import text
from tfaccel.keras import keras
from tfaccel.train import generate, gpt

L = 16


def test_an_unknown_variant_is_one_line_before_tensorflow(tmp_path):
    out = tmp_path / "report"
    check_flag_error("optimize_lm", f"--output_dir={out}", "--variants=float,int5",
                     line="--variants=float,int5: unknown language-model variant 'int5': use "
                     "one of float, keras3_int8, keras3_int4, tflite_float, tflite_dynamic, "
                     "int8, pruned_<NN> (NN% zeros, 1-99) or pruned_<NN>_<one of keras3_int8, "
                     "keras3_int4, tflite_float, tflite_dynamic, int8>")
    check_flag_error("optimize_lm", f"--output_dir={out}", "--finetune_steps=0",
                     line="--finetune_steps=0 is out of range: give an integer >= 1, e.g. "
                     "--finetune_steps=200")
    assert not out.exists()


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
    """A folder as train_lm.py leaves it: a small GPT trained 30 steps on the default text,
    model.keras, vocabulary.json, metrics.json (its window) and flags.cfg."""
    folder = tmp_path_factory.mktemp("lm")
    splits = text.load_text_dataset(None, "char", sequence_length=L)
    keras.utils.set_random_seed(0)
    model = gpt.build_gpt(gpt.gpt_config("tiny", vocab_size=splits.vocab.size, layers=1,
                                         heads=2, d_model=32, context=2 * L))
    model.compile(keras.optimizers.Adam(3e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    starts = np.random.default_rng(0).integers(0, 40_000, 480)[:, None] + np.arange(L)
    model.fit(splits.train[starts], splits.train[starts + 1], batch_size=16, verbose=0)
    generate.export_language_model(model, splits.vocab, str(folder))
    (folder / "metrics.json").write_text(json.dumps({"sequence_length": L,
                                                     "validation_loss": 3.0}))
    (folder / "flags.cfg").write_text("--tokenizer=char\n--sequence_length=16\n")
    return folder


@pytest.mark.slow
def test_a_run_writes_the_report_files_and_tensorboard(trained_dir, tmp_path):
    out = tmp_path / "report"
    result = run_recipe("optimize_lm", f"--model_dir={trained_dir}", f"--output_dir={out}",
                        "--variants=keras3_int8,tflite_dynamic,pruned_50,pruned_50_int8",
                        "--finetune_steps=6", "--batch_size=4", "--max_windows=20",
                        "--new_tokens=4", "--timing_rounds=1")
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((out / "report.json").read_text())
    rows = {r["variant"]: r for r in saved["variants"]}
    assert list(rows) == ["float", "keras3_int8", "tflite_dynamic", "pruned_50",
                          "pruned_50_int8"]
    assert saved["sequence_length"] == L and saved["tokenizer"] == "char"
    assert saved["train_lm_validation_loss"] == 3.0  # read from the run's metrics.json
    assert "tflite_dynamic" in rows["keras3_int8"]["refused"]
    assert rows["pruned_50"]["pruned_sparsity"] == pytest.approx(0.5, abs=1e-3)
    for name in ("tflite_dynamic", "pruned_50_int8"):
        assert rows[name]["path"] == str(out / "tflite" / f"{name}.tflite")
        assert (out / "tflite" / f"{name}.tflite").stat().st_size == rows[name]["bytes"]
    markdown = (out / "report.md").read_text()
    assert all(f"| {name} |" in markdown for name in rows)
    assert "| pruned_50 | keras |" in markdown
    for png in ("report.png", "report_tokens_per_sec.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert not (out / ".partial").exists()
    logdir = str(out / "logs" / "report")
    assert "pruned_50_int8" in summaries.read_text_summaries(logdir)["report/table"]
    assert set(summaries.read_scalars(logdir)) >= {"loss/float", "tokens_per_sec/pruned_50"}
    assert "pruned_50_int8" in result.stdout  # the table is printed too


@pytest.mark.slow
def test_a_text_that_gives_another_vocabulary_is_one_line(trained_dir, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text("abc " * 5000)
    result = run_recipe("optimize_lm", f"--model_dir={trained_dir}", f"--data_dir={other}",
                        f"--output_dir={tmp_path / 'report'}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "another char vocabulary" in lines[0]
    assert "--data_dir=" in lines[0]
    assert not (tmp_path / "report").exists()
