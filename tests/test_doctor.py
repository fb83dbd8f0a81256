"""tfaccel doctor: real facts here, advice logic on described machines."""

import json
import os
import re
import subprocess
import sys

import pytest

from tfaccel import doctor

CPU = {"type": "CPU", "name": "/physical_device:CPU:0"}
VERSIONS = {"tensorflow": "2.21.0", "tf_keras": "2.21.0", "tensorflow-model-optimization": "0.8.1"}
BUILD = {"is_cuda_build": True, "cuda_version": "12.5.1", "cudnn_version": "9",
         "cuda_compute_capabilities": ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"]}


def machine(*gpus, versions=VERSIONS, smi=None, features=("avx2", "fma"), growth=None):
    return {"versions": dict(versions), "build": BUILD, "devices": [CPU, *gpus],
            "gpus_seen_by_nvidia_smi": smi, "cpu": {"features": list(features)},
            "memory_growth_env": growth}


def gpu(cc, name="NVIDIA GeForce RTX 4090"):
    return {"type": "GPU", "name": name, "compute_capability": cc, "memory_total_mb": 24564}


def messages(facts, level=None):
    return [a["message"] for a in doctor.advise(facts) if level in (None, a["level"])]


def test_json_has_the_fields_and_says_cpu_only():
    out = subprocess.run([sys.executable, "-m", "tfaccel", "doctor", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    facts = json.loads(out.stdout)
    for key in ("python", "versions", "build", "devices", "driver_version", "xla", "onednn",
                "cpu", "advice"):
        assert key in facts
    assert facts["versions"]["tensorflow"].startswith("2.")
    assert {"cuda_version", "cudnn_version", "is_cuda_build"} <= set(facts["build"])
    assert "built_with_xla" in facts["xla"] and "enabled" in facts["onednn"]
    assert any(d["type"] == "CPU" for d in facts["devices"])
    rates = facts["matmul_flops_per_second"]
    assert set(rates) == {"float32", "bfloat16"} and all(v > 1e8 for v in rates.values())
    # the peak is never below what a matmul reached on this machine
    assert facts["peak"]["float32"]["flops_per_second"] >= rates["float32"] * 0.999
    if not any(d["type"] == "GPU" for d in facts["devices"]):
        assert any("No GPU visible" in a["message"] for a in facts["advice"])


def test_human_report_runs():
    out = subprocess.run([sys.executable, "-m", "tfaccel", "doctor"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0
    assert "TF build" in out.stdout and "Advice" in out.stdout
    assert re.search(r"^Matmul +float32 [\d,]+ GFLOP/s, bfloat16 [\d,]+ GFLOP/s", out.stdout, re.M)


AMX_XEON = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni",
            "amx_tile", "amx_bf16", "amx_int8")


def test_cpu_only_machine_without_matrix_instructions():
    said = messages(machine())
    assert any("No GPU visible" in m for m in said)
    assert any("no bfloat16 hardware" in m and "keep --precision=float32" in m for m in said)
    assert any("No float16 math on this CPU" in m for m in said)
    assert any("No int8 dot-product instructions" in m for m in said)
    assert not any("This CPU has AMX" in m or "This CPU has int8" in m for m in said)


def test_cpu_with_amx_is_advised_bfloat16_and_int8():
    said = messages(machine(features=AMX_XEON))
    bf16 = [m for m in said if "mixed_bfloat16" in m]
    assert len(bf16) == 1 and "This CPU has AMX-BF16: mixed_bfloat16 trains faster" in bf16[0]
    assert "--precision=mixed_bfloat16" in bf16[0]
    assert not any("no bfloat16 hardware" in m or "keep --precision=float32" in m for m in said)
    # AVX512_FP16 is float16 math, but TensorFlow's CPU kernels do not train with it.
    assert any("float16 math (AVX512_FP16), but TensorFlow's CPU training kernels do not use it"
               in m for m in said)
    assert any("int8 dot products (AMX-INT8/AVX512_VNNI/AVX-VNNI)" in m for m in said)
    # AVX512_BF16 without AMX: measured, not promised.
    avx512 = " ".join(messages(machine(features=("avx512f", "avx512_bf16"))))
    assert "AVX512_BF16 but no AMX" in avx512 and "--precision=auto measures it" in avx512
    assert "no bfloat16 hardware" not in avx512


def test_matrix_instructions_from_cpu_flags():
    assert doctor.matrix_instructions(set(AMX_XEON)) == {
        "bf16": ["amx_bf16", "avx512_bf16"], "fp16": ["avx512_fp16"],
        "int8": ["amx_int8", "avx512_vnni", "avx_vnni"]}
    assert doctor.matrix_instructions({"avx2", "amx_fp16"}) == {"bf16": [], "fp16": ["amx_fp16"],
                                                                "int8": []}
    assert [doctor.instruction_name(f) for f in ("amx_bf16", "avx512_fp16", "avx_vnni")] == [
        "AMX-BF16", "AVX512_FP16", "AVX-VNNI"]


def test_report_shows_this_machines_matrix_instructions():
    facts = doctor.collect()
    found = doctor.matrix_instructions(doctor.cpu_flags())
    assert facts["cpu"]["matrix_instructions"] == found
    report = doctor.format_report(facts, doctor.advise(facts))
    line = next(ln for ln in report.splitlines() if ln.startswith("Matrix math"))
    for kind, flags in found.items():
        names = "/".join(doctor.instruction_name(f) for f in flags) or "none"
        assert f"{kind} {names}" in line


@pytest.mark.parametrize("cc,expected", [
    ("8.9", "mixed_bfloat16"), ("7.5", "mixed_float16"), ("6.1", "keep float32")])
def test_precision_advice_follows_compute_capability(cc, expected):
    assert any(expected in m for m in messages(machine(gpu(cc))))


def test_several_gpus_suggest_mirrored_and_memory_growth():
    said = messages(machine(gpu("8.0", "A100"), gpu("8.0", "A100")))
    assert any("--strategy=mirrored" in m for m in said)
    assert any("--memory_growth" in m for m in said)
    assert not any("--memory_growth" in m for m in messages(machine(gpu("8.0"), growth="true")))


def test_driver_sees_gpu_tensorflow_does_not():
    smi = [{"name": "RTX 4090", "driver_version": "550.54", "memory_total_mb": 24564,
            "compute_capability": "8.9"}]
    warnings = messages(machine(smi=smi), "warning")
    assert any("TensorFlow sees none" in m and "tfaccel[gpu]" in m for m in warnings)


def test_version_mismatch_and_missing_packages():
    bad = dict(VERSIONS, tf_keras="2.19.0")
    assert any("does not match TensorFlow" in m for m in messages(machine(versions=bad), "warning"))
    missing = dict(VERSIONS, **{"tensorflow-model-optimization": None})
    assert any("pruning and QAT" in m for m in messages(machine(versions=missing), "warning"))
    assert not messages(machine(gpu("8.9"), growth="1"), "warning")


@pytest.mark.parametrize("flags, env, machine, system, on", [
    ({"avx2", "fma"}, "", "x86_64", "Linux", False),  # an AVX2-only CPU: Eigen's kernels
    ({"avx2", "avx512f", "avx512_vnni"}, "", "x86_64", "Linux", True),
    ({"avx2", "avx_vnni"}, "", "x86_64", "Linux", True),
    ({"avx2", "amx_tile", "amx_bf16"}, "", "x86_64", "Linux", True),
    ({"avx2", "avx512_bf16"}, "0", "x86_64", "Linux", False),
    ({"avx2", "fma"}, "1", "x86_64", "Linux", True),
    ({"avx2", "fma"}, "TRUE", "x86_64", "Linux", True),
    ({"avx2", "fma"}, "maybe", "x86_64", "Linux", False),  # not a boolean: the default
    ({"avx2"}, "", "AMD64", "Windows", True),
    (set(), "", "aarch64", "Linux", False),
])
def test_onednn_is_on_by_default_only_on_cpus_with_vnni_bf16_or_amx(flags, env, machine, system,
                                                                    on):
    assert doctor.onednn_enabled(flags, env=env, machine=machine, system=system) is on


@pytest.mark.parametrize("env", [None, "0", "1"])
def test_the_onednn_rule_agrees_with_tensorflows_own_answer(env):
    environment = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    if env is not None:
        environment["TF_ENABLE_ONEDNN_OPTS"] = env
    proc = subprocess.run(
        [sys.executable, "-c", "from tfaccel import _compat, doctor; "
         "print(doctor.onednn_enabled(), _compat.onednn_in_use())"],
        env=environment, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rule, tensorflow = proc.stdout.split()
    assert rule == tensorflow
    if env is not None:
        assert rule == str(env == "1")


@pytest.mark.parametrize("flags,expected", [
    ({"avx2", "fma"}, "vectors: AVX2, matrix instructions: none"),
    ({"avx2", "avx512f", "avx512_bf16"}, "vectors: AVX-512, matrix instructions: AVX512"),
    (set(), "vectors: unknown, matrix instructions: none"),
])
def test_the_machine_summary_names_the_vector_width_beside_the_matrix_instructions(
        monkeypatch, flags, expected):
    # measured tables must tell an AVX2-only CPU (oneDNN off by default) from an AVX-512 one
    monkeypatch.setattr(doctor, "_read_cpuinfo", lambda: ("Some CPU", flags))
    summary = doctor.machine_summary()
    assert summary.startswith("Some CPU, ") and expected in summary, summary
