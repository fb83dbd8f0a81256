"""tfaccel.data.augment: the ops agree with their TensorFlow references."""

import numpy as np
import pytest
import tensorflow as tf

from tfaccel.data import augment


@pytest.mark.parametrize("shape,high", [((4, 32, 24, 3), 1.0), ((4, 32, 24, 3), 255.0),
                                        ((40, 40, 1), 255.0)])
def test_standardize_matches_per_image_standardization(shape, high):
    x = np.random.default_rng(0).uniform(0, high, shape).astype("float32")
    got = augment.standardize(x).numpy()
    np.testing.assert_allclose(got, tf.image.per_image_standardization(x).numpy(), atol=1e-4)
    axes = tuple(range(got.ndim - 3, got.ndim))
    np.testing.assert_allclose(got.mean(axis=axes), 0.0, atol=1e-4)
    np.testing.assert_allclose(got.std(axis=axes), 1.0, atol=1e-4)


def test_standardize_flat_and_nearly_flat_images():
    flat = np.full((2, 16, 16, 3), 0.7, "float32")
    np.testing.assert_allclose(augment.standardize(flat).numpy(), 0.0, atol=1e-3)
    bright = 250.0 + np.random.default_rng(1).uniform(-0.5, 0.5, (16, 16, 3)).astype("float32")
    np.testing.assert_allclose(augment.standardize(bright).numpy(),
                               tf.image.per_image_standardization(bright).numpy(), atol=1e-3)


def test_standardize_casts_integer_images():
    x = np.random.default_rng(2).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    got = augment.standardize(x)
    assert got.dtype == tf.float32
    np.testing.assert_allclose(got.numpy(), tf.image.per_image_standardization(x).numpy(),
                               atol=1e-4)
