"""Device memory: the cards a memory plan knows by name, and sizes such as '24GB'.

Nothing here imports TensorFlow, so `tfaccel plan` checks its --device_memory before
anything slow happens.

Example:

    from tfaccel.performance import devices

    devices.parse_device_memory("rtx4090") == devices.parse_device_memory("24GB")  # True
"""

import re

from tfaccel.errors import ConfigError

GB = 10**9
GiB = 2**30
DEVICES = {
    "rtx3060": 12, "rtx3080": 10, "rtx3090": 24, "rtx4080": 16, "rtx4090": 24, "rtx5090": 32,
    "t4": 16, "v100-16gb": 16, "v100-32gb": 32, "a10": 24, "l4": 24, "a6000": 48, "l40s": 48,
    "a100-40gb": 40, "a100-80gb": 80, "h100-80gb": 80, "h200": 141,
}
"""Memory of each card by name, in GiB as sold."""
_UNITS = {"": GiB, "b": 1, "kb": 2**10, "mb": 2**20, "gb": GiB, "tb": 2**40}


def parse_device_memory(text):
    """Bytes of '24GB', '24 GiB', '16000MB' or a card name from `DEVICES` ('rtx4090').

    Device memory is read the way cards are sold and `nvidia-smi` counts it: GB and GiB
    both mean 2**30 bytes (a "24 GB" RTX 4090 has 24,564 MiB), MB and MiB 2**20; a bare
    number is GB. Plans print sizes in GB of 10**9 bytes, as the ZeRO paper counts.

    Raises:
      ConfigError: an unknown card or a malformed size.
    """
    value = str(text).strip().lower()
    if value in DEVICES:
        return DEVICES[value] * GiB
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([kmgt])?i?(b)?", value)
    if not match or float(match.group(1)) <= 0:
        raise ConfigError(f"device memory {text!r} is neither a size (24GB, 24GiB, 16000MB) "
                          f"nor a card ({', '.join(DEVICES)})")
    unit = (match.group(2) or "") + ("b" if match.group(2) else (match.group(3) or ""))
    return int(float(match.group(1)) * _UNITS[unit])


def host_memory_available():
    """Bytes of RAM available to new allocations (Linux's MemAvailable), or None."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_device_memory():
    """(bytes, what) of the device a run trains on: the first GPU's memory (nvidia-smi), else
    the host's available RAM; (None, why) when neither is known."""
    from tfaccel import doctor

    gpus = [g for g in doctor.gpus() if g.get("memory_total_mb")]
    if gpus:
        return gpus[0]["memory_total_mb"] * 2**20, f"GPU 0 ({gpus[0]['name']})"
    available = host_memory_available()
    if available:
        return available, "the host's available RAM (no GPU)"
    return None, "no GPU and no /proc/meminfo"
