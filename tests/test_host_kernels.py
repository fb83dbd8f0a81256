"""tfaccel.performance.host_kernels: the buffers TensorFlow's own CPU kernels keep (oneDNN off)."""

import json
import os
import subprocess
import sys

import pytest

from tfaccel.performance import host_kernels


def _zoo_cnn():
    from tfaccel.train import models

    return models.build_model("cnn", (8, 8, 1), 10)


def test_with_onednn_off_each_convolution_gradient_keeps_a_column_buffer_of_30_mib_of_work():
    from tfaccel.performance import utilization

    graph, _ = utilization.traced_step(_zoo_cnn(), 256, loss="square")
    found = host_kernels.kernel_buffers(graph, onednn=False, threads=2)
    # conv_1 (3x3x32 -> 64 on 8x8): one image's work is 64*64 + 288*64 + 64*288 = 40,960
    # values, so 192 images fill 30 MiB of float32; conv_0 (3x3x1 -> 32): 2,912, 2,701 images
    # (more than the batch: the buffer does not depend on it). The first convolution's input
    # gradient is pruned: nothing reads it. The pooling gradient finds its maxima again: an
    # int64 per pooled value.
    assert found == {"gradient_tape/cnn/conv_1/Conv2D/Conv2DBackpropInput": (192 * 64 * 288 * 4,),
                     "gradient_tape/cnn/conv_1/Conv2D/Conv2DBackpropFilter": (192 * 64 * 288 * 4,),
                     "gradient_tape/cnn/conv_0/Conv2D/Conv2DBackpropFilter": (2701 * 64 * 9 * 4,),
                     "gradient_tape/cnn/pool/MaxPool/MaxPoolGrad": (256 * 4 * 4 * 64 * 8,)}
    assert host_kernels.kernel_buffers(graph, onednn=True) == {}
    # one image at a time when a thread's share of an image's work passes 256 KiB
    single = host_kernels.kernel_buffers(graph, onednn=False, threads=1)
    assert single == found  # 40,960 values on one thread is still under 65,536
    graph_1, _ = utilization.traced_step(_zoo_cnn(), 1, loss="square")
    at_1 = host_kernels.kernel_buffers(graph_1, onednn=False, threads=2)
    assert at_1["gradient_tape/cnn/conv_1/Conv2D/Conv2DBackpropInput"] == (64 * 288 * 4,)


def test_a_bfloat16_matrix_product_on_eigen_asks_for_three_float32_copies():
    # a product and its two gradients compute in float32 copies of their first input, their
    # second and their result: three buffers, in that order (the pool fits each apart)
    from tfaccel.performance import utilization
    from tfaccel.train import precision

    with precision.precision_scope("mixed_bfloat16"):
        graph_bf16, _ = utilization.traced_step(_zoo_cnn(), 256, loss="square")
    copies = host_kernels.kernel_buffers(graph_bf16, onednn=False, threads=2)
    x, w, y = 4 * 256 * 128, 4 * 128 * 10, 4 * 256 * 10  # the logits layer: 128 -> 10
    assert (copies["cnn/logits/MatMul"], copies["gradient_tape/cnn/logits/MatMul/MatMul"],
            copies["gradient_tape/cnn/logits/MatMul/MatMul_1"]) == ((x, w, y), (y, w, x),
                                                                    (x, y, w)), copies


_REAL_WORKSPACES = """
import collections, json, sys
from tfaccel.performance import memory
memory.use_pooled_host_allocator()
import numpy as np, tensorflow as tf, tf_keras
from tfaccel.performance import host_kernels, step_profile, utilization
from tfaccel.train import models, training
tf_keras.mixed_precision.set_global_policy(sys.argv[2])
model = models.build_model(sys.argv[3], (8, 8, 1), 10)
training.compile_classifier(model, training.make_optimizer("sgd", 1e-3))
x = np.random.default_rng(0).random((64, 8, 8, 1), dtype=np.float32)
ds = tf.data.Dataset.from_tensors((x, np.arange(64) % 10)).repeat()
model.fit(ds, steps_per_epoch=1, epochs=1, verbose=0)
tf.profiler.experimental.start(sys.argv[1])
model.fit(ds, steps_per_epoch=1, epochs=1, verbose=0)
tf.profiler.experimental.stop()
graph, _ = utilization.traced_step(model, 64, loss="square")
kinds = {"Conv2DBackpropFilter", "Conv2DBackpropInput", "MatMul", "MaxPoolGrad",
         "FusedBatchNormGradV3"}
watched = {op.name for op in graph.get_operations() if op.type in kinds}
real = collections.defaultdict(list)
for e in step_profile.allocation_events(step_profile.last_trace(sys.argv[1])):
    if e["allocated"] and e["region"] == "temp" and e["op"] in watched:
        real[e["op"]].append(e["requested"])
print(json.dumps({"real": real, "planned": host_kernels.kernel_buffers(graph),
                  "watched": len(watched)}))
"""


@pytest.mark.parametrize("model,onednn", [("cnn", "0"), ("cnn", "1"), pytest.param(
    "resnet", "0", marks=pytest.mark.slow)])
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_the_planned_workspaces_are_the_buffers_tensorflow_allocates(tmp_path, model, onednn,
                                                                      policy):
    # a zoo model trained under the profiler: every temporary buffer its convolution
    # gradients, matrix products, pooling and batch-norm gradients ask for, in order,
    # against the plan's
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=onednn)
    proc = subprocess.run([sys.executable, "-c", _REAL_WORKSPACES, str(tmp_path), policy,
                           model], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["watched"] >= 7, got
    if onednn == "0":
        assert got["real"] == got["planned"], got
        if model == "cnn":
            assert len(got["planned"]) >= (4 if policy == "float32" else 7), got
        else:  # each batch norm's gradient: a float per channel, in bfloat16 its input too
            norms = [s for op, s in got["planned"].items() if "FusedBatchNorm" in op]
            assert norms and all(len(s) == (1 if policy == "float32" else 2) for s in norms)
    else:  # oneDNN's kernels ask for little beside their outputs
        assert got["planned"] == {} and sum(map(sum, got["real"].values())) < 2**20, got
