"""tfaccel.errors: the typed hierarchy and the one line quoted from a foreign exception."""

import pytest

from tfaccel import errors


@pytest.mark.parametrize("error, expected", [
    (ValueError("\n  shapes differ\n  at layer dense\n"), "shapes differ"),
    (ValueError("Exception encountered when calling layer 'x'.\nbad rank 3"), "bad rank 3"),
    (KeyError(), "KeyError"),
    (RuntimeError("x" * 250), "x" * 200 + "..."),
])
def test_first_line_quotes_the_cause_in_one_short_line(error, expected):
    assert errors.first_line(error) == expected


def test_first_line_reads_a_tensorflow_style_message_attribute():
    class OpError(Exception):
        message = "record 3 is corrupt\ndetails follow"

    assert errors.first_line(OpError("ignored")) == "record 3 is corrupt"


def test_first_line_with_type_names_the_exception_once():
    assert errors.first_line(ValueError("bad rank 3\nmore"), with_type=True) == \
        "ValueError: bad rank 3"
    assert errors.first_line(KeyError(), with_type=True) == "KeyError"
    assert errors.first_line(RuntimeError("x" * 250), limit=10, with_type=True) == \
        "RuntimeError: " + "x" * 10 + "..."


def test_every_error_is_a_tfaccel_error_and_a_builtin_kind():
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.WrongKerasError, errors.ModelError)
    assert issubclass(errors.TrainingError, ArithmeticError)
    for cls in (errors.ConfigError, errors.DataError, errors.ModelError, errors.TrainingError,
                errors.UnsupportedLayerError, errors.WrongKerasError):
        assert issubclass(cls, errors.TfaccelError)
