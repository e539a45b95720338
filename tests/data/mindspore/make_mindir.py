"""Makes the MindIR fixtures of `shardc import` (issue 31, part 1) with MindSpore itself.

Each network is exported with `mindspore.export(net, x, file_format="MINDIR")` in inference
mode (`set_train(False)`), and its output on the exported input is recorded beside it as the
reference an import must reproduce (`NAME_forward.npz`: the input under the network's input
name, `x`, and the output as `logits`):

- `tutorial.mindir`: the network of `make_ckpt.py` (the tutorial's `Network`,
  64 -> 32 -> 32 -> 10) with the weights of `tutorial.ckpt`, input (16, 64), the `x` of
  `batch.npz`;
- `lenet.mindir`: LeNet-5 (Conv2d/ReLU/MaxPool2d twice, a BatchNorm2d with non-trivial
  moving statistics, Flatten, two Dense), input (8, 1, 32, 32);
- `block.mindir`: a pre-norm transformer block (LayerNorm, one Dense for q/k/v, reshape and
  transpose to heads, indexing q/k/v out (StridedSlice), BatchMatMul, scaling (Muls),
  Softmax, GELU MLP, residual Adds), input (8, 4, 16);
- `sharded.mindir`: a MatMul and a ReLU with `.shard(...)` strategies (kept by the export as
  the primitives' `in_strategy`), input (16, 64);
- `unmapped.mindir`: a Dense followed by `Sin` and `Erfinv`, two primitives shardc has no
  mapping for (the error must name both);
- `import/proto/mind_ir.fds`: the `FileDescriptorSet` of the `mind_ir.proto` this MindSpore
  version writes (from its own `mindspore/train/mind_ir_pb2.py`), so that `prost-build`
  compiles exactly that schema without `protoc`.

Run from this folder, after `make_ckpt.py`, with a Python that has MindSpore 2.10 (`pip
install mindspore==2.10.0` into the venv `shardc bench` sets up): `python make_mindir.py`.
"""
import os

import numpy as np
import mindspore as ms
from mindspore import nn, ops
from google.protobuf import descriptor_pb2
from mindspore.train import mind_ir_pb2

from make_ckpt import Network


class LeNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, pad_mode="valid")
        self.conv2 = nn.Conv2d(6, 16, 5, pad_mode="valid")
        self.bn = nn.BatchNorm2d(16)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(16 * 5 * 5, 32)
        self.fc2 = nn.Dense(32, 10)

    def construct(self, x):
        x = self.pool(self.relu(self.conv1(x)))
        x = self.pool(self.relu(self.bn(self.conv2(x))))
        x = self.flatten(x)
        return self.fc2(self.relu(self.fc1(x)))


class Block(nn.Cell):
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Dense(d, 3 * d)
        self.proj = nn.Dense(d, d)
        self.ln1 = nn.LayerNorm((d,))
        self.ln2 = nn.LayerNorm((d,))
        self.fc1 = nn.Dense(d, 4 * d)
        self.fc2 = nn.Dense(4 * d, d)
        self.gelu = nn.GELU()
        self.scores = ops.BatchMatMul(transpose_b=True)
        self.mix = ops.BatchMatMul()
        self.softmax = nn.Softmax(-1)

    def construct(self, x):
        b, s, d = x.shape
        dh = d // self.heads
        y = self.ln1(x)
        qkv = self.qkv(y.reshape(b * s, d)).reshape(b, s, 3, self.heads, dh)
        qkv = ops.transpose(qkv, (2, 0, 3, 1, 4))
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = self.softmax(self.scores(q, k) * (1.0 / dh ** 0.5))
        o = ops.transpose(self.mix(att, v), (0, 2, 1, 3)).reshape(b * s, d)
        x = x + self.proj(o).reshape(b, s, d)
        y = self.ln2(x).reshape(b * s, d)
        return x + self.fc2(self.gelu(self.fc1(y))).reshape(b, s, d)


class Sharded(nn.Cell):
    def __init__(self):
        super().__init__()
        w = np.random.default_rng(5).standard_normal((64, 32)).astype(np.float32) * 0.1
        self.w = ms.Parameter(ms.Tensor(w), name="w")
        self.matmul = ops.MatMul().shard(((2, 1), (1, 1)))
        self.relu = ops.ReLU().shard(((2, 1),))

    def construct(self, x):
        return self.relu(self.matmul(x, self.w))


class Unmapped(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(8, 8)

    def construct(self, x):
        return ops.erfinv(ops.sin(self.fc(x)) * 0.5)


def export(net, x, name, forward=True):
    net.set_train(False)
    ms.export(net, ms.Tensor(x), file_name=name, file_format="MINDIR")
    os.chmod(f"{name}.mindir", 0o644)
    if forward:
        logits = net(ms.Tensor(x)).asnumpy()
        np.savez(f"{name}_forward.npz", x=x, logits=logits)
        print(name, logits.shape)


def main():
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(11)
    rng = np.random.default_rng(13)

    net = Network()
    ms.load_param_into_net(net, ms.load_checkpoint("tutorial.ckpt"))
    export(net, np.load("batch.npz")["x"], "tutorial")

    lenet = LeNet()
    lenet.bn.moving_mean.set_data(ms.Tensor(rng.standard_normal(16).astype(np.float32) * 0.1))
    lenet.bn.moving_variance.set_data(ms.Tensor(rng.uniform(0.5, 1.5, 16).astype(np.float32)))
    lenet.bn.gamma.set_data(ms.Tensor(rng.uniform(0.5, 1.5, 16).astype(np.float32)))
    lenet.bn.beta.set_data(ms.Tensor(rng.standard_normal(16).astype(np.float32) * 0.1))
    export(lenet, rng.standard_normal((8, 1, 32, 32)).astype(np.float32), "lenet")

    block = Block()
    for p in block.get_parameters():
        if p.name.endswith("bias") or p.name.endswith("beta"):
            p.set_data(ms.Tensor(rng.standard_normal(p.shape).astype(np.float32) * 0.1))
    export(block, rng.standard_normal((8, 4, 16)).astype(np.float32), "block")

    export(Sharded(), rng.standard_normal((16, 64)).astype(np.float32), "sharded")
    export(Unmapped(), np.zeros((4, 8), np.float32), "unmapped", forward=False)

    fds = descriptor_pb2.FileDescriptorSet()
    proto = descriptor_pb2.FileDescriptorProto()
    mind_ir_pb2.DESCRIPTOR.CopyToProto(proto)
    fds.file.append(proto)
    with open("../../../import/proto/mind_ir.fds", "wb") as f:
        f.write(fds.SerializeToString())


if __name__ == "__main__":
    main()
