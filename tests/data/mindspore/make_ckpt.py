"""Makes the MindSpore checkpoint fixture of tests/mindspore_ckpt.rs with MindSpore itself.

The data-parallel tutorial's `Network` (Flatten, then Dense/ReLU/Dense/ReLU/Dense in a
SequentialCell named `dense_relu_sequential`), narrowed to 64 -> 32 -> 32 -> 10 so that the
files stay small, with sparse softmax cross-entropy (mean) and Momentum(0.1, 0.9), trained
on CPU on a fixed numpy batch:

- steps 1-3 are trained, then the training cell (network and optimizer state) is saved as
  `tutorial.ckpt`;
- steps 4-6 continue from it on the same batch; their losses are in `losses.txt`, one per
  line, the reference shardc must print when it starts from `tutorial.ckpt`;
- the batch is `batch.npz` (`x` (16, 64) float32, `label` (16,) int32).

Run from this folder with a Python that has MindSpore 2.10 (`pip install mindspore==2.10.0`
into the venv `shardc bench` sets up): `python make_ckpt.py`. The versions it ran with are in
VERSIONS.
"""
import sys

import numpy as np
import mindspore as ms
from mindspore import nn

ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
ms.set_seed(7)


class Network(nn.Cell):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.dense_relu_sequential = nn.SequentialCell(
            nn.Dense(64, 32, weight_init="normal", bias_init="zeros"),
            nn.ReLU(),
            nn.Dense(32, 32, weight_init="normal", bias_init="zeros"),
            nn.ReLU(),
            nn.Dense(32, 10, weight_init="normal", bias_init="zeros"),
        )

    def construct(self, x):
        return self.dense_relu_sequential(self.flatten(x))


def main():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    label = rng.integers(0, 10, size=(16,)).astype(np.int32)
    np.savez("batch.npz", x=x, label=label)

    net = Network()
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    train = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), opt)
    train.set_train()

    xs, ys = ms.Tensor(x), ms.Tensor(label)
    for _ in range(3):
        train(xs, ys)
    ms.save_checkpoint(train, "tutorial.ckpt")
    losses = [float(train(xs, ys).asnumpy()) for _ in range(3)]
    with open("losses.txt", "w") as f:
        f.write("".join(f"{l!r}\n" for l in losses))
    with open("VERSIONS", "w") as f:
        f.write(f"python {sys.version.split()[0]}\nnumpy {np.__version__}\nmindspore {ms.__version__}\n")
    print(losses)


if __name__ == "__main__":
    main()
