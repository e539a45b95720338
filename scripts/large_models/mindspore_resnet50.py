"""Exports a full-size ResNet-50 (bottleneck blocks [3, 4, 6, 3], 25.6 M parameters) from
MindSpore 2.10 as MindIR, with its output on a fixed input, for `scripts/import-large-models.sh`
(issue 31: larger models than the CI fixtures, imported and checked outside CI).

    python mindspore_resnet50.py OUT_DIR [BATCH] [SIZE]

writes OUT_DIR/resnet50.mindir and OUT_DIR/resnet50_forward.npz (`x`: the input, `logits`:
MindSpore's output on it). The weights are MindSpore's default initializers under a fixed
seed, the BatchNorm statistics set to non-trivial values; the network is exported in
inference mode. Needs a Python with MindSpore 2.10 (`pip install mindspore==2.10.0`).
"""
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import nn, ops


def conv(cin, cout, k, stride=1):
    return nn.Conv2d(cin, cout, k, stride=stride, pad_mode="pad", padding=k // 2, has_bias=False)


class Bottleneck(nn.Cell):
    expansion = 4

    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = conv(cin, width, 1)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = conv(width, width, 3, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = conv(width, cout, 1)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.SequentialCell(conv(cin, cout, 1, stride), nn.BatchNorm2d(cout))

    def construct(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        skip = x if self.down is None else self.down(x)
        return self.relu(y + skip)


class ResNet50(nn.Cell):
    def __init__(self, classes=1000):
        super().__init__()
        self.conv1 = conv(3, 64, 7, 2)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="same")
        layers, cin = [], 64
        for width, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
            cells = []
            for b in range(blocks):
                cells.append(Bottleneck(cin, width, stride if b == 0 else 1))
                cin = width * 4
            layers.append(nn.SequentialCell(cells))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.mean = ops.ReduceMean(keep_dims=False)
        self.fc = nn.Dense(2048, classes)

    def construct(self, x):
        x = self.pool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.mean(x, (2, 3)))


def main():
    out = sys.argv[1]
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    size = int(sys.argv[3]) if len(sys.argv) > 3 else 224
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    ms.set_seed(50)
    rng = np.random.default_rng(50)
    net = ResNet50()
    for p in net.get_parameters():
        if p.name.endswith("moving_mean") or p.name.endswith("beta"):
            p.set_data(ms.Tensor(rng.standard_normal(p.shape).astype(np.float32) * 0.1))
        elif p.name.endswith("moving_variance") or p.name.endswith("gamma"):
            p.set_data(ms.Tensor(rng.uniform(0.5, 1.5, p.shape).astype(np.float32)))
    net.set_train(False)
    x = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "resnet50")
    ms.export(net, ms.Tensor(x), file_name=path, file_format="MINDIR")
    logits = net(ms.Tensor(x)).asnumpy()
    np.savez(path + "_forward.npz", x=x, logits=logits)
    params = sum(int(np.prod(p.shape)) for p in net.get_parameters())
    print(f"resnet50: {params} parameters, input {x.shape}, logits {logits.shape}")


if __name__ == "__main__":
    main()
