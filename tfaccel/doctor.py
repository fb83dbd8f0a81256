"""`tfaccel doctor`: what this machine can do for training, and what to change.

`collect()` reads the facts (versions, TensorFlow's build, devices, driver,
XLA, oneDNN, CPU features); `advise(facts)` turns any such description into
advice, so the advice logic can be checked with made-up machines (a GPU
description needs no GPU). `format_report` prints both for people.

Example:

    from tfaccel import doctor

    facts = doctor.collect()
    for item in doctor.advise(facts):
        print(item["level"], item["message"])
"""

import dataclasses
import functools
import importlib.metadata
import os
import platform
import shutil
import subprocess
import time

PACKAGES = ("tensorflow", "tf_keras", "tensorflow-model-optimization", "tensorboard", "numpy",
            "ai-edge-litert")
_CPU_FEATURES = ("avx2", "fma", "avx512f", "avx_vnni", "avx512_vnni", "avx512_bf16",
                 "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16", "amx_int8")
MATRIX_INSTRUCTIONS = {
    "bf16": ("amx_bf16", "avx512_bf16"),
    "fp16": ("amx_fp16", "avx512_fp16"),
    "int8": ("amx_int8", "avx512_vnni", "avx_vnni"),
}
"""The CPU's matrix and dot-product instructions by number type, as /proc/cpuinfo names them."""


def _version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _read_cpuinfo():
    """(model name, set of feature flags) from /proc/cpuinfo (empty where it cannot be read)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name") and ":" in line:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and ":" in line:
                    flags.update(line.split(":", 1)[1].split())
    except OSError:
        pass
    return model, flags


def cpu_flags():
    """This CPU's feature flags (/proc/cpuinfo; an empty set where there is none)."""
    return _read_cpuinfo()[1]


def matrix_instructions(flags):
    """{'bf16': [...], 'fp16': [...], 'int8': [...]}: which of `MATRIX_INSTRUCTIONS` `flags` has."""
    flags = set(flags)
    return {kind: [f for f in names if f in flags] for kind, names in MATRIX_INSTRUCTIONS.items()}


ONEDNN_BY_DEFAULT = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")
"""The CPU features with which TensorFlow on x86-64 Linux runs oneDNN's kernels by default."""


def onednn_enabled(flags=None, env=None, machine=None, system=None):
    """Whether TensorFlow runs oneDNN's kernels (its `IsMklEnabled`), decided as it decides.

    On x86-64 Linux TensorFlow turns oneDNN on by default only on a CPU with one of
    `ONEDNN_BY_DEFAULT` (`DefaultOneDnnPolicy` in tensorflow/core/util/port.cc): a CPU
    with AVX2 alone runs TensorFlow's own (Eigen) kernels, whose convolution gradients
    keep workspaces of tens of MB (`tfaccel.performance.host_kernels.kernel_buffers`).
    On x86-64 Windows it is on; elsewhere off. ``TF_ENABLE_ONEDNN_OPTS`` (0/1/false/true)
    overrides the default. Arguments default to this machine and environment.

        onednn_enabled({"avx2", "fma"}, env=None, machine="x86_64", system="Linux")  # False
    """
    flags = cpu_flags() if flags is None else set(flags)
    env = os.environ.get("TF_ENABLE_ONEDNN_OPTS") if env is None else env
    machine = (machine or platform.machine()).lower()
    system = system or platform.system()
    x86 = machine in ("x86_64", "amd64")
    default = x86 and (system == "Windows"
                       or (system == "Linux" and any(f in flags for f in ONEDNN_BY_DEFAULT)))
    value = (env or "").strip().lower()
    return {"0": False, "false": False, "1": True, "true": True}.get(value, default)


def instruction_name(flag):
    """How Intel writes a /proc/cpuinfo flag: 'amx_bf16' -> 'AMX-BF16', 'avx_vnni' -> 'AVX-VNNI'."""
    head, _, rest = flag.partition("_")
    if head in ("amx", "avx"):
        return f"{head.upper()}-{rest.upper()}"
    return flag.upper()


def machine_summary():
    """One line naming this CPU, its cores and its matrix instructions, for measured tables.

    Measured speed-ups depend on these (bf16 wins on AMX-BF16, loses without it), so
    every benchmark report says which kind of machine it was measured on.

    Example:

        >>> tfaccel.doctor.machine_summary()  # doctest: +SKIP
        'Intel(R) Xeon(R) Processor, 2 cores, vectors: AVX-512, matrix instructions: AMX-BF16, ...'
    """
    model, flags = _read_cpuinfo()
    names = [instruction_name(f) for kind in matrix_instructions(flags).values() for f in kind]
    vector = ("AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags
              else "no AVX2" if flags else "unknown")
    return (f"{model}, {os.cpu_count()} cores, vectors: {vector}, matrix instructions: "
            f"{', '.join(names) or 'none'}")


# --- Peak arithmetic rate: what a training step's FLOP/s are measured against (MFU).

GPU_PEAK_TFLOPS = {
    # name fragment: (fp32, bf16/fp16 tensor-core dense with fp32 accumulation), vendor sheets
    "h100 sxm": (67.0, 989.4), "h100 hbm3": (67.0, 989.4), "h100": (51.2, 756.0),
    "a100": (19.5, 312.0), "a10g": (31.2, 70.0), "a10": (31.2, 125.0), "l40s": (91.6, 362.1),
    "l4": (30.3, 121.0), "rtx 4090": (82.6, 165.2), "rtx 4080": (48.7, 97.5),
    "rtx 3090": (35.6, 71.0), "rtx a6000": (38.7, 154.8), "v100": (15.7, 125.0),
    "t4": (8.1, 65.0),
}
"""Dense peak TFLOP/s of common cards by a fragment of their name (no sparsity): fp32 on the
CUDA cores, bf16/fp16 on the tensor cores (V100 and T4: fp16 only). A key matches a device
name holding each of its words; the key of most words wins (nvidia-smi calls an H100 SXM
"NVIDIA H100 80GB HBM3", a PCIe one "NVIDIA H100 PCIe")."""


@dataclasses.dataclass(frozen=True)
class Peak:
    """A device's peak FLOP/s for a precision, and how it was worked out."""

    flops_per_second: float
    how: str


def cpu_clock_ghz(fields=None):
    """(GHz, where it was read) of this CPU's base clock, or (None, why not).

    The cpufreq base (or maximum) frequency when the kernel exposes it, else the
    'cpu MHz' of /proc/cpuinfo, else its 'bogomips' / 2 (x86 Linux counts bogomips as twice
    the time-stamp counter's rate, which runs at the base clock): virtual machines often
    show only the last.
    """
    for name in ("base_frequency", "cpuinfo_max_freq"):
        try:
            with open(f"/sys/devices/system/cpu/cpu0/cpufreq/{name}", encoding="utf-8") as f:
                return int(f.read().strip()) / 1e6, f"cpufreq {name}"
        except (OSError, ValueError):
            pass
    fields = _cpuinfo_fields() if fields is None else fields
    for key, scale, what in (("cpu MHz", 1e-3, "/proc/cpuinfo cpu MHz"),
                             ("bogomips", 0.5e-3, "/proc/cpuinfo bogomips / 2")):
        value = _number(fields.get(key, ""))
        if value:
            return value * scale, what
    return None, "no clock in cpufreq or /proc/cpuinfo"


def _cpuinfo_fields():
    """The first processor's 'key: value' lines of /proc/cpuinfo."""
    fields = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_flops_per_cycle(flags, precision="float32", vendor=None, family=None):
    """(FLOP per cycle per core, what it assumes) for `precision`'s matrix math on this CPU.

    fp32 FMA: two FMA units of the widest vector (AVX-512: 2 x 16 lanes x 2 = 64 on Intel;
    AMD Zen 4 runs AVX-512 on 256-bit units, 32), AVX2+FMA 32, else 8 (SSE). bfloat16:
    AMX-BF16 1,024 (the tile unit), AVX512_BF16 twice the fp32 rate, else the fp32 rate
    (TensorFlow then computes in fp32). float16 has no fast TensorFlow CPU path: fp32 rate.
    """
    amd = (vendor or "").lower().startswith("authenticamd") or vendor == "amd"
    if "avx512f" in flags:
        fp32, what = (32, "AVX-512 on 2 x 256-bit FMA units (AMD Zen 4)") \
            if amd and (family or 0) < 26 else (64, "AVX-512, 2 FMA units")
    elif "avx2" in flags and "fma" in flags:
        fp32, what = 32, "AVX2, 2 FMA units"
    else:
        fp32, what = 8, "SSE, no FMA"
    if precision == "mixed_bfloat16":
        if "amx_bf16" in flags:
            return 1024, "AMX-BF16 tiles"
        if "avx512_bf16" in flags:
            return 2 * fp32, f"AVX512_BF16 (2x the fp32 rate of {what})"
    return fp32, what


@functools.lru_cache(maxsize=None)
def matmul_flops(dtype="float32", size=2048, seconds=0.25, device="CPU:0"):
    """FLOP/s that one `size` x `size` matrix product in `dtype` reaches on `device`: the
    fastest of the products timed within about `seconds` (after one untimed). A lower bound
    on the device's peak, whatever the spec sheet or the kernel says of the clock; cached
    per process.

    Example:

        tfaccel.doctor.matmul_flops("float32") / 1e9  # e.g. 459 on a 2-core Zen 5 EPYC
    """
    import tensorflow as tf  # deferred: TensorFlow (doctor reports the machine without it)

    with tf.device(device):
        a = tf.cast(tf.random.stateless_normal((size, size), (1, 2)), dtype)
        b = tf.cast(tf.random.stateless_normal((size, size), (3, 4)), dtype)
        product = tf.function(lambda a, b: tf.cast(tf.linalg.matmul(a, b)[0, 0], tf.float32))
        product(a, b).numpy()
        best, start = float("inf"), time.perf_counter()
        while time.perf_counter() - start < seconds or best == float("inf"):
            began = time.perf_counter()
            product(a, b).numpy()
            best = min(best, time.perf_counter() - began)
    return 2 * size**3 / best


def cpu_peak(precision="float32", cores=None, flags=None, clock_ghz=None,
             measured_float32=None):
    """This CPU's `Peak` for `precision`: cores x clock x FLOP per cycle, each said.

    The clock is the base clock the kernel reports, which cores running above it (turbo,
    boost) exceed: given `measured_float32` (a `matmul_flops` rate) that implies a faster
    clock at the float32 FLOP per cycle, the implied clock is used, so that no measured
    rate exceeds its peak and MFU is not overstated.
    """
    fields = _cpuinfo_fields()
    flags = cpu_flags() if flags is None else set(flags)
    cores = cores or os.cpu_count() or 1
    if clock_ghz is None:
        clock_ghz, source = cpu_clock_ghz(fields)
    else:
        source = "given"
    if not clock_ghz:
        return Peak(0.0, f"unknown: {source}")
    vendor, family = fields.get("vendor_id"), int(_number(fields.get("cpu family", "")) or 0)
    per_cycle, what = cpu_flops_per_cycle(flags, precision, vendor, family)
    if measured_float32:
        implied = measured_float32 / (cores * cpu_flops_per_cycle(flags, "float32", vendor,
                                                                   family)[0]) / 1e9
        if implied > clock_ghz:
            clock_ghz, source = implied, (
                f"implied by a measured float32 matmul of {measured_float32 / 1e9:,.0f} "
                f"GFLOP/s; {source}: {clock_ghz:.2f}")
    return Peak(cores * clock_ghz * 1e9 * per_cycle,
                f"{cores} cores x {clock_ghz:.2f} GHz ({source}) x {per_cycle} FLOP/cycle "
                f"({what})")


def gpu_peak(name, precision="float32"):
    """A `Peak` for a GPU named `name` (e.g. 'NVIDIA GeForce RTX 4090') from
    `GPU_PEAK_TFLOPS`, or None for a card not in the table."""
    words = set(name.lower().replace("-", " ").split())
    match = max((k for k in GPU_PEAK_TFLOPS if set(k.split()) <= words),
                key=lambda k: (len(k.split()), len(k)), default=None)
    if match is None:
        return None
    fp32, half = GPU_PEAK_TFLOPS[match]
    tflops = fp32 if precision == "float32" else half
    kind = "fp32" if precision == "float32" else "16-bit tensor cores, dense"
    return Peak(tflops * 1e12, f"{match} {kind}: {tflops} TFLOP/s (vendor sheet)")


def peak(precision="float32", gpus=None, measure=False):
    """The `Peak` a run in `precision` is measured against: every visible GPU's (summed) when
    the table knows them, else this CPU's; with `measure`, the CPU's clock is raised to what a
    float32 matmul shows it runs at (`matmul_flops`, under a second, once per process), when
    that is above the reported base clock.

    Example:

        tfaccel.doctor.peak("mixed_bfloat16", measure=True).how
        # '2 cores x 3.58 GHz (implied by a measured float32 matmul of 459 GFLOP/s; ...'
    """
    gpus = [g["name"] for g in _nvidia_smi() or []] if gpus is None else list(gpus)
    peaks = [gpu_peak(name, precision) for name in gpus]
    if peaks and all(peaks):
        return Peak(sum(p.flops_per_second for p in peaks),
                    f"{len(peaks)} x " + peaks[0].how if len(peaks) > 1 else peaks[0].how)
    return cpu_peak(precision, measured_float32=matmul_flops("float32") if measure else None)


def _cpu_facts():
    model, flags = _read_cpuinfo()
    return {"model": model, "cores": os.cpu_count(), "machine": platform.machine(),
            "features": sorted(f for f in _CPU_FEATURES if f in flags),
            "matrix_instructions": matrix_instructions(flags)}


def _nvidia_smi():
    """Rows from nvidia-smi, or None when it is not installed or fails."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,driver_version,memory.total,compute_cap",
             "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4:
            rows.append({"name": parts[0], "driver_version": parts[1],
                         "memory_total_mb": _number(parts[2]), "compute_capability": parts[3]})
    return rows


def gpus():
    """The GPUs nvidia-smi lists (name, driver_version, memory_total_mb, compute_capability);
    an empty list without nvidia-smi."""
    return _nvidia_smi() or []


def _number(text):
    try:
        return int(float(text))
    except ValueError:
        return None


def collect():
    """Facts about this machine and its TensorFlow, as a JSON-ready dict."""
    import tensorflow as tf  # deferred: TensorFlow: doctor reports the machine without it

    build = dict(tf.sysconfig.get_build_info())
    smi = _nvidia_smi()
    devices = [{"type": "CPU", "name": d.name} for d in tf.config.list_physical_devices("CPU")]
    for i, gpu in enumerate(tf.config.list_physical_devices("GPU")):
        details = tf.config.experimental.get_device_details(gpu)
        cc = details.get("compute_capability")
        entry = {"type": "GPU", "name": details.get("device_name", gpu.name),
                 "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
                 "memory_total_mb": None}
        if smi and i < len(smi):
            entry["memory_total_mb"] = smi[i]["memory_total_mb"]
        devices.append(entry)
    onednn_env = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {p: _version(p) for p in PACKAGES},
        "build": {
            "is_cuda_build": bool(build.get("is_cuda_build")),
            "cuda_version": build.get("cuda_version"),
            "cudnn_version": build.get("cudnn_version"),
            "cuda_compute_capabilities": list(build.get("cuda_compute_capabilities") or []),
        },
        "devices": devices,
        "gpus_seen_by_nvidia_smi": smi,
        "driver_version": smi[0]["driver_version"] if smi else None,
        "cpu": _cpu_facts(),
        "xla": {"built_with_xla": bool(tf.test.is_built_with_xla()),
                "tf_xla_flags": os.environ.get("TF_XLA_FLAGS")},
        "onednn": {"enabled": onednn_enabled(env=onednn_env or ""),
                   "TF_ENABLE_ONEDNN_OPTS": onednn_env},
        "memory_growth_env": os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH"),
        "matmul_flops_per_second": {d: matmul_flops(d) for d in ("float32", "bfloat16")},
        "peak": {p: dataclasses.asdict(peak(p, [g["name"] for g in smi or []], measure=True))
                 for p in ("float32", "mixed_bfloat16")},
    }


def _minor(version):
    return ".".join((version or "").split(".")[:2])


def _advice(level, message):
    return {"level": level, "message": message}


def _cc_value(cc):
    try:
        major, minor = str(cc).split(".")
        return int(major) + int(minor) / 10
    except (ValueError, AttributeError):
        return None


def _names(flags):
    return "/".join(instruction_name(f) for f in flags)


def _info_if_found(found, present, absent):
    """Info advice: `present` (its {names}: the instructions `found`) when any were, else
    `absent`."""
    return _advice("info", present.format(names=_names(found)) if found else absent)


def _cpu_precision_advice(matrix):
    """Advice on mixed precision for CPU training, from `matrix_instructions`."""
    out = []
    if "amx_bf16" in matrix["bf16"]:
        out.append(_advice("info", "This CPU has AMX-BF16: mixed_bfloat16 trains faster than "
                           "float32 here (about 2x for the zoo CNN at 32x32x3, batch 256, on a "
                           "Xeon with AMX): use --precision=mixed_bfloat16, or --precision=auto "
                           "to measure it on your model."))
    elif matrix["bf16"]:
        out.append(_advice("info", "This CPU has AVX512_BF16 but no AMX: bfloat16 dot products "
                           "run in hardware, and whether mixed_bfloat16 beats float32 depends "
                           "on the model: --precision=auto measures it."))
    else:
        out.append(_advice("info", "This CPU has no bfloat16 hardware (no AMX-BF16/AVX512_BF16): "
                           "keep --precision=float32; mixed_bfloat16 would run slower than "
                           "float32 here (0.5x down to 0.07x float32's speed for small CNNs "
                           "measured on such a CPU)."))
    out.append(_info_if_found(
        matrix["fp16"],
        "This CPU has float16 math ({names}), but TensorFlow's CPU training kernels do not use "
        "it: mixed_float16 trains ~200x slower than float32 (zoo CNN on a Xeon with "
        "AVX512_FP16); keep mixed_float16 for GPUs.",
        "No float16 math on this CPU (no AVX512_FP16/AMX-FP16): mixed_float16 is for GPUs; "
        "here it trains far slower than float32."))
    out.append(_info_if_found(
        matrix["int8"],
        "This CPU has int8 dot products ({names}): int8 TFLite models (recipes/optimize.py) "
        "run several times faster than float ones here (2.3-3.4x for the digits CNN on a Xeon "
        "with AMX-INT8).",
        "No int8 dot-product instructions (AVX512_VNNI/AVX-VNNI/AMX-INT8): int8 TFLite models "
        "mostly save size here, not time (1.02x float's speed measured on such a CPU)."))
    return out


def advise(facts):
    """Advice from a `collect()`-style dict: a list of {'level', 'message'}.

    Levels: 'ok', 'info', 'warning'. Only the keys `versions`, `build`, `devices`,
    `gpus_seen_by_nvidia_smi`, `cpu` and `memory_growth_env` are read, so tests and
    users can describe any machine.
    """
    out = []
    versions = facts.get("versions", {})
    tf_v, keras_v, mot_v = (versions.get("tensorflow"), versions.get("tf_keras"),
                            versions.get("tensorflow-model-optimization"))
    if tf_v and keras_v and _minor(tf_v) != _minor(keras_v):
        out.append(_advice("warning", f"tf_keras {keras_v} does not match TensorFlow {tf_v}: "
                           f"pip install 'tf_keras=={_minor(tf_v)}.*'"))
    if not keras_v:
        out.append(_advice("warning", "tf_keras is not installed: pip install tf_keras "
                           "(tfaccel and TF-MOT need Keras 2)"))
    if not mot_v:
        out.append(_advice("warning", "tensorflow-model-optimization is not installed: pruning and "
                           "QAT will not work "
                           "(pip install 'tensorflow-model-optimization>=0.8,<0.9')"))

    gpus = [d for d in facts.get("devices", []) if d.get("type") == "GPU"]
    smi = facts.get("gpus_seen_by_nvidia_smi")
    build = facts.get("build", {})
    features = set(facts.get("cpu", {}).get("features", []))
    if not gpus:
        if smi:
            fix = ("install the CUDA libraries: pip install 'tfaccel[gpu]'"
                   if build.get("is_cuda_build") else
                   "this TensorFlow was built without CUDA: pip install 'tensorflow[and-cuda]'")
            out.append(_advice("warning", f"nvidia-smi sees {len(smi)} GPU(s) but TensorFlow sees "
                               f"none: {fix}"))
        out.append(_advice("info", "No GPU visible: training runs on the CPU; GPU memory "
                           "settings do not apply. Keep --jit_compile=false (or 'auto' to "
                           "measure)."))
        out += _cpu_precision_advice(matrix_instructions(features))
        return out

    out.append(_advice("ok", f"{len(gpus)} GPU(s): " + ", ".join(
        f"{g.get('name')} (compute capability {g.get('compute_capability')})" for g in gpus)))
    ccs = [_cc_value(g.get("compute_capability")) for g in gpus]
    lowest = min((c for c in ccs if c is not None), default=None)
    if lowest is not None:
        if lowest >= 8.0:
            out.append(_advice("info", "Tensor cores with bfloat16 and float16: use "
                               "--precision=mixed_bfloat16 (no loss scaling) or mixed_float16."))
        elif lowest >= 7.0:
            out.append(_advice("info", "Tensor cores with float16: use --precision=mixed_float16 "
                               "(loss scaling is automatic); "
                               "bfloat16 needs compute capability 8.0."))
        else:
            out.append(_advice("warning", f"Compute capability {lowest} < 7.0: mixed precision "
                               "will not speed training up here; keep float32."))
    built_for = {c.replace("sm_", "").replace("compute_", "")
                 for c in build.get("cuda_compute_capabilities", [])}
    for g in gpus:
        cc = (g.get("compute_capability") or "").replace(".", "")
        if built_for and cc and cc not in built_for and not any(
                b.isdigit() and int(b) <= int(cc) for b in built_for if b.isdigit()):
            out.append(_advice("warning", f"TensorFlow was built for {sorted(built_for)} but "
                               f"{g.get('name')} is {g.get('compute_capability')}: kernels are "
                               "JIT-compiled at start (slow start-up)."))
    if len(gpus) > 1:
        out.append(_advice("info", f"{len(gpus)} GPUs: train on all of them "
                           "with --strategy=mirrored "
                           "(--batch_size is global)."))
    if not facts.get("memory_growth_env"):
        out.append(_advice("info", "TensorFlow reserves all GPU memory at start: pass "
                           "--memory_growth if other processes share the GPU, and try "
                           "--gpu_allocator=cuda_malloc_async against fragmentation."))
    return out


def format_report(facts, advice):
    """A human-readable report of `facts` and `advice`."""
    v = facts["versions"]
    b = facts["build"]
    lines = [
        f"Python       {facts['python']} on {facts['platform']}",
        "Packages     " + ", ".join(f"{k} {v[k] or 'missing'}" for k in v),
        f"TF build     CUDA {b['cuda_version'] or '-'}, cuDNN {b['cudnn_version'] or '-'}"
        f" (CUDA build: {'yes' if b['is_cuda_build'] else 'no'})",
        f"CPU          {facts['cpu']['model']}, {facts['cpu']['cores']} cores, "
        f"features: {', '.join(facts['cpu']['features']) or 'none of note'}",
        "Matrix math  " + "; ".join(
            f"{kind} {_names(flags) or 'none'}"
            for kind, flags in facts["cpu"].get("matrix_instructions", {}).items()),
        f"Driver       {facts['driver_version'] or 'none (no nvidia-smi)'}",
        f"XLA          {'built in' if facts['xla']['built_with_xla'] else 'not built'}; "
        f"oneDNN {'on' if facts['onednn']['enabled'] else 'off'}",
        *(f"Peak {p.split('_')[-1]:7} {facts['peak'][p]['flops_per_second'] / 1e9:,.0f} GFLOP/s: "
          f"{facts['peak'][p]['how']}" for p in facts.get("peak", {})),
        *([("Matmul       " + ", ".join(f"{d} {v / 1e9:,.0f} GFLOP/s" for d, v in
                                       facts["matmul_flops_per_second"].items())
            + " (2048 x 2048 on the CPU, measured now)")]
          if facts.get("matmul_flops_per_second") else []),
        "Devices",
    ]
    for d in facts["devices"]:
        extra = ""
        if d["type"] == "GPU":
            extra = (f" compute capability {d['compute_capability']}, "
                     f"{d['memory_total_mb'] or '?'} MB")
        lines.append(f"  {d['type']:4} {d['name']}{extra}")
    if not any(d["type"] == "GPU" for d in facts["devices"]):
        lines.append("  (no GPU: this is a CPU-only machine)")
    lines.append("Advice")
    lines += [f"  [{a['level']}] {a['message']}" for a in advice]
    return "\n".join(lines)
