"""Training FLOPs and model FLOP utilization (tfaccel.performance.utilization), and the peaks
they are measured against (tfaccel.doctor)."""

import pytest

from tfaccel import doctor
from tfaccel.errors import ConfigError
from tfaccel.keras import keras, keras3
from tfaccel.performance import utilization
from tfaccel.train import gpt

AVX2 = {"avx2", "fma"}
ZEN4 = AVX2 | {"avx512f", "avx512_bf16"}
XEON_AMX = AVX2 | {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}


def test_a_dense_layer_costs_its_products_forward_and_for_its_weight_gradient():
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32)])
    flops = utilization.training_flops_per_example(model, batch_size=8)
    products = 2 * 64 * 32  # one example's forward matrix product
    # forward + the kernel's gradient (no input gradient: nothing before it trains), plus
    # the bias add and its gradient
    assert 2 * products <= flops <= 2 * products + 4 * 32


def test_the_traced_gpt_agrees_with_the_closed_form():
    config = gpt.gpt_config("tiny", vocab_size=96)
    model = gpt.build_gpt(config)
    traced = utilization.training_flops_per_example(model, sequence_length=config.context)
    position = sum(w.shape.num_elements() for w in model.weights if "position" in w.name)
    closed = utilization.transformer_flops_per_token(
        model.count_params(), config.layers, config.d_model, config.context, position)
    assert position == config.context * config.d_model
    assert traced / config.context == pytest.approx(closed, rel=0.03)


def test_a_keras3_model_with_a_custom_einsum_layer_is_counted():
    k3 = keras3()

    class Mixer(k3.layers.Layer):
        def build(self, shape):
            self.w = self.add_weight(shape=(shape[-1], 16))

        def call(self, x):
            return k3.ops.einsum("bi,io->bo", x, self.w)

    inputs = k3.Input((8,))
    model = k3.Model(inputs, Mixer()(inputs))
    flops = utilization.training_flops_per_example(model, batch_size=4)
    assert flops == pytest.approx(2 * (2 * 8 * 16), rel=0.05)  # forward and weight gradient


def test_a_variable_length_input_needs_a_length():
    model = gpt.build_gpt(gpt.gpt_config("tiny", vocab_size=96))
    with pytest.raises(ConfigError, match="variable length.*sequence_length="):
        utilization.training_flops_per_example(model)


def test_mfu_is_achieved_over_peak():
    assert utilization.mfu(100, 1e9, doctor.Peak(4e11, "x")) == pytest.approx(0.25)
    assert utilization.mfu(100, 1e9, 2e11) == pytest.approx(0.5)
    assert utilization.mfu(100, 1e9, doctor.Peak(0.0, "unknown")) is None


@pytest.mark.parametrize("flags, vendor, family, precision, expected", [
    (AVX2, "GenuineIntel", 6, "float32", 32),
    (AVX2, "AuthenticAMD", 25, "mixed_bfloat16", 32),  # no bf16 hardware: computed in fp32
    (ZEN4, "AuthenticAMD", 25, "float32", 32),  # AVX-512 on 256-bit units
    (ZEN4, "AuthenticAMD", 25, "mixed_bfloat16", 64),
    (ZEN4 - {"avx512_bf16"}, "AuthenticAMD", 26, "float32", 64),  # Zen 5: full width
    (XEON_AMX, "GenuineIntel", 6, "float32", 64),
    (XEON_AMX, "GenuineIntel", 6, "mixed_bfloat16", 1024),
    (XEON_AMX, "GenuineIntel", 6, "mixed_float16", 64),  # no fast float16 path in TF on CPU
    (set(), "GenuineIntel", 6, "float32", 8),
])
def test_flops_per_cycle_by_cpu_kind(flags, vendor, family, precision, expected):
    assert doctor.cpu_flops_per_cycle(flags, precision, vendor, family)[0] == expected


def test_cpu_peak_is_cores_times_clock_times_flops_per_cycle():
    result = doctor.cpu_peak("float32", cores=2, flags=AVX2, clock_ghz=2.45)
    assert result.flops_per_second == pytest.approx(2 * 2.45e9 * 32)
    assert "2 cores x 2.45 GHz" in result.how and "32 FLOP/cycle" in result.how


def test_a_measured_matmul_faster_than_the_base_clock_raises_the_peak():
    # 200 GFLOP/s on 2 AVX2 cores needs 3.125 GHz: the base 2.45 GHz understates the peak
    raised = doctor.cpu_peak("float32", cores=2, flags=AVX2, clock_ghz=2.45,
                             measured_float32=200e9)
    assert raised.flops_per_second == pytest.approx(200e9)
    assert "3.12 GHz (implied by a measured float32 matmul of 200 GFLOP/s; given: 2.45)" \
        in raised.how
    bf16 = doctor.cpu_peak("mixed_bfloat16", cores=2, flags=ZEN4, clock_ghz=2.45,
                           measured_float32=400e9)  # implies > 2.45 GHz at 32 or 64 FLOP/cycle
    assert bf16.flops_per_second == pytest.approx(2 * 400e9)  # AVX512_BF16: twice fp32's rate
    slower = doctor.cpu_peak("float32", cores=2, flags=AVX2, clock_ghz=2.45,
                             measured_float32=100e9)  # a loaded machine: the base clock stays
    assert slower.flops_per_second == pytest.approx(2 * 2.45e9 * 32)
    assert "implied" not in slower.how


def test_measured_matmul_rate_is_real_and_below_any_plausible_peak():
    rate = doctor.matmul_flops("float32", size=256, seconds=0.05)
    nominal = doctor.peak("float32", gpus=[]).flops_per_second
    assert 1e8 < rate < 3 * nominal  # a product timed before it finished would exceed this
    measured = doctor.peak("float32", gpus=[], measure=True)
    assert measured.flops_per_second >= nominal
    assert measured.flops_per_second >= doctor.matmul_flops("float32") * 0.999


def test_this_machine_has_a_clock_and_a_peak():
    ghz, source = doctor.cpu_clock_ghz()
    assert ghz and 0.5 < ghz < 6, source
    assert doctor.peak("float32", gpus=[]).flops_per_second > 1e9


def test_gpu_peaks_by_name():
    assert doctor.gpu_peak("NVIDIA GeForce RTX 4090").flops_per_second == pytest.approx(82.6e12)
    assert doctor.gpu_peak("NVIDIA GeForce RTX 4090", "mixed_bfloat16").flops_per_second == \
        pytest.approx(165.2e12)
    assert doctor.gpu_peak("NVIDIA H100 80GB HBM3", "mixed_bfloat16").flops_per_second \
        == pytest.approx(989.4e12)  # the key of most words wins over plain "h100"
    assert doctor.gpu_peak("NVIDIA H100 PCIe", "mixed_bfloat16").flops_per_second \
        == pytest.approx(756e12)
    assert doctor.gpu_peak("Some Unknown Card") is None
    two = doctor.peak("mixed_float16", gpus=["NVIDIA A100-SXM4-40GB"] * 2)
    assert two.flops_per_second == pytest.approx(2 * 312e12) and two.how.startswith("2 x")
    # a card the table does not know: the CPU's peak, not a guess
    assert "cores x" in doctor.peak("float32", gpus=["Mystery GPU"]).how
