"""Makes the MindIR fixtures for `shardc import` (issue 31, part 1) with MindSpore itself.

- `tutorial.mindir`: `mindspore.export` of the network of `make_ckpt.py` (the tutorial's
  `Network`, 64 -> 32 -> 32 -> 10) with the weights of `tutorial.ckpt`, for an input of
  shape (16, 64) float32;
- `tutorial_forward.npz`: that input (`x`, the `x` of `batch.npz`) and MindSpore's output
  of the exported network on it (`logits`), the reference an import must reproduce;
- `import/proto/mind_ir.fds`: the `FileDescriptorSet` of the `mind_ir.proto` this MindSpore version
  writes (from its own `mindspore/train/mind_ir_pb2.py`), so that `prost-build` compiles
  exactly that schema without `protoc`.

Run from this folder, after `make_ckpt.py`, with a Python that has MindSpore 2.10 (`pip
install mindspore==2.10.0` into the venv `shardc bench` sets up): `python make_mindir.py`.
"""
import numpy as np
import mindspore as ms
from google.protobuf import descriptor_pb2
from mindspore.train import mind_ir_pb2

from make_ckpt import Network

net = Network()
ms.load_param_into_net(net, ms.load_checkpoint("tutorial.ckpt"))
net.set_train(False)
x = np.load("batch.npz")["x"]
ms.export(net, ms.Tensor(x), file_name="tutorial", file_format="MINDIR")
logits = net(ms.Tensor(x)).asnumpy()
np.savez("tutorial_forward.npz", x=x, logits=logits)

fds = descriptor_pb2.FileDescriptorSet()
proto = descriptor_pb2.FileDescriptorProto()
mind_ir_pb2.DESCRIPTOR.CopyToProto(proto)
fds.file.append(proto)
with open("../../../import/proto/mind_ir.fds", "wb") as f:
    f.write(fds.SerializeToString())
print(logits.shape)
