"""Makes the ONNX fixtures of tests/import_onnx.rs with the real exporters.

Every model is exported by `torch.onnx.export(..., dynamo=False, opset_version=17)` (the
TorchScript exporter) from a seeded, randomly initialised PyTorch model, and run once by
onnxruntime on a fixed input. For each model `NAME.onnx` there is `NAME.npz` beside it, keyed
by the ONNX graph's input names (the fixed input) and `expected` (onnxruntime's output for
it; `torch_expected` is PyTorch's own output, for reference):

- `mlp.onnx`: the MindSpore data-parallel tutorial's network (Flatten, then
  Linear/ReLU/Linear/ReLU/Linear, 64 -> 32 -> 32 -> 10; see ../mindspore/make_ckpt.py),
  input `x` (16, 64);
- `resnet18_narrow.onnx`: ResNet-18's topology (conv 7x7/2 + BatchNorm + ReLU, max pool
  3x3/2, BasicBlock x [2, 2, 2, 2] with downsampling 1x1 convolutions, global average pool,
  fc) at REDUCED WIDTH (4/8/16/32 channels instead of 64/128/256/512) and on a small input
  `x` (2, 3, 32, 32), 10 classes, in inference mode (BatchNorm with randomised running
  statistics; exported without constant folding, so that BatchNormalization stays a node);
- `gpt2_tiny.onnx`: a randomly initialised Hugging Face GPT-2
  (`GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)`, eager
  attention, GeLU `gelu_pytorch_tanh` so that the exporter writes the tanh approximation),
  input `input_ids` (2, 8) int64, output the logits (2, 8, 64);
  `gpt2_tiny_opset13.onnx` and `gpt2_tiny_opset20.onnx` are the same model (same seed)
  exported at opsets 13 (LayerNorm written out as ReduceMean/Sub/Pow/Sqrt/Div) and 20 (one
  Gelu node with approximate="tanh");
- `masked_softmax.onnx`: attention-like scores of a computed tensor masked by a constant
  causal mask with `torch.where` (fills float32's min and -inf), then softmax: the
  `Where` with a constant condition on a computed tensor, input `x` (2, 6, 8);
- `gelu_exact_opset17.onnx`, `gelu_exact_opset20.onnx`: a BERT feed-forward block (LayerNorm,
  Linear 16 -> 32, `nn.GELU()` — the exact GeLU, x/2 (1 + erf(x/sqrt 2)) —, Linear 32 -> 16),
  input `x` (8, 16): opset 17 writes the GeLU with an `Erf` node, opset 20 as one `Gelu` node
  with approximate="none";
- `unmapped.onnx`: a tiny graph with two ops shardc has no mapping for (Sin, Cos), for the
  error test; `truncated.onnx`: the first half of `mlp.onnx`'s bytes, for the decode error;
  `opset9.onnx`: the MLP declared as opset 9; `symbolic.onnx`: the MLP with a symbolic batch
  dimension (`batch`).

Run from this folder with a Python that has torch 2.15, torchvision 0.29, transformers 5.24,
onnx 1.23, onnxruntime 1.32 and numpy 2.4 (`pip install torch torchvision transformers onnx
onnxruntime numpy`): `python make_onnx.py`. The versions it ran with are written to VERSIONS.
`python make_onnx.py --fds` also rewrites `../../../import/proto/onnx.fds`, the schema the
importer is compiled from (a FileDescriptorSet of the installed onnx's `onnx-ml.proto`).
"""
import sys

import numpy as np
import torch
from torch import nn

OPSET = 17


def export(model, args, name, input_names, output_name="expected", fold=True, opset=OPSET):
    import onnxruntime as ort

    model.eval()
    path = f"{name}.onnx"
    with torch.no_grad():
        torch_out = model(*args)
        if not isinstance(torch_out, torch.Tensor):
            torch_out = torch_out[0]
        torch.onnx.export(
            model,
            args,
            path,
            dynamo=False,
            opset_version=opset,
            input_names=input_names,
            output_names=[output_name],
            do_constant_folding=fold,
        )
    feeds = {n: a.numpy() for n, a in zip(input_names, args)}
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (out,) = sess.run([output_name], feeds)
    np.savez(f"{name}.npz", **feeds, expected=out, torch_expected=torch_out.numpy())
    diff = np.abs(out - torch_out.numpy()).max() / np.abs(out).max()
    print(f"{path}: output {out.shape}, onnxruntime vs torch rel {diff:.2e}")


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.dense_relu_sequential = nn.Sequential(
            nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10)
        )

    def forward(self, x):
        return self.dense_relu_sequential(self.flatten(x))


def narrow_resnet18():
    from torchvision.models.resnet import BasicBlock, ResNet

    net = ResNet(BasicBlock, [2, 2, 2, 2], num_classes=10, width_per_group=64)
    # torchvision's ResNet has fixed widths 64/128/256/512; rebuild the layers narrower.
    widths = [4, 8, 16, 32]
    net.inplanes = widths[0]
    net.conv1 = nn.Conv2d(3, widths[0], kernel_size=7, stride=2, padding=3, bias=False)
    net.bn1 = nn.BatchNorm2d(widths[0])
    net.layer1 = net._make_layer(BasicBlock, widths[0], 2)
    net.layer2 = net._make_layer(BasicBlock, widths[1], 2, stride=2)
    net.layer3 = net._make_layer(BasicBlock, widths[2], 2, stride=2)
    net.layer4 = net._make_layer(BasicBlock, widths[3], 2, stride=2)
    net.fc = nn.Linear(widths[3], 10)
    g = torch.Generator().manual_seed(5)
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return net


class Gpt2Logits(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        # An explicit all-ones attention mask: without one, transformers looks for packed
        # sequences with `torch.diff`, which the exporter cannot write.
        mask = torch.ones_like(input_ids)
        return self.model(input_ids=input_ids, attention_mask=mask, use_cache=False).logits


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_layer=1,
        n_embd=32,
        n_head=2,
        vocab_size=64,
        n_positions=16,
        activation_function="gelu_pytorch_tanh",
        attn_implementation="eager",
    )
    return Gpt2Logits(GPT2LMHeadModel(cfg))


class MaskedSoftmax(nn.Module):
    """Causal attention scores of a computed tensor, masked with `torch.where` by a constant
    causal mask, once with float32's min and once with -inf as the fill, then softmax: the
    exporter writes `Where(constant condition, computed scores, constant fill)`."""

    def __init__(self):
        super().__init__()
        self.register_buffer("causal", torch.tril(torch.ones(6, 6, dtype=torch.bool)))
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        h = self.proj(x)
        scores = h @ h.transpose(-1, -2)
        lo = torch.where(self.causal, scores, torch.finfo(torch.float32).min)
        inf = torch.where(self.causal, scores, float("-inf"))
        return torch.cat([lo.softmax(-1), inf.softmax(-1)], dim=-1)


class TwoUnmapped(nn.Module):
    def forward(self, x):
        return torch.sin(x) + torch.cos(x)


class ExactGeluFfn(nn.Module):
    """A BERT feed-forward block: LayerNorm, Linear, the exact GeLU (`nn.GELU()`), Linear."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.up = nn.Linear(16, 32)
        self.act = nn.GELU()
        self.down = nn.Linear(32, 16)

    def forward(self, x):
        return self.down(self.act(self.up(self.norm(x))))


def main():
    torch.manual_seed(0)
    rng = np.random.default_rng(3)

    x = torch.from_numpy(rng.standard_normal((16, 64)).astype(np.float32))
    export(Mlp(), (x,), "mlp", ["x"])

    x = torch.from_numpy(rng.standard_normal((2, 3, 32, 32)).astype(np.float32))
    # Without constant folding, so that BatchNormalization stays a node of its own
    # instead of being folded into the convolution before it.
    export(narrow_resnet18(), (x,), "resnet18_narrow", ["x"], fold=False)

    ids = torch.from_numpy(rng.integers(0, 64, size=(2, 8)).astype(np.int64))
    export(tiny_gpt2(), (ids,), "gpt2_tiny", ["input_ids"], "logits")
    # The same model at the ends of the opset range: opset 13 writes LayerNorm as
    # ReduceMean/Sub/Pow/Sqrt/Div, opset 20 writes the tanh GeLU as one Gelu node.
    for opset in (13, 20):
        torch.manual_seed(0)
        export(tiny_gpt2(), (ids,), f"gpt2_tiny_opset{opset}", ["input_ids"], "logits", opset=opset)

    x = torch.from_numpy(rng.standard_normal((2, 6, 8)).astype(np.float32))
    export(MaskedSoftmax(), (x,), "masked_softmax", ["x"])

    # The exact GeLU: opset 17 writes it as Div/Erf/Add/Mul/Mul, opset 20 as one Gelu node
    # with approximate="none". Its own seeds, so the fixtures above stay as they were.
    x = torch.from_numpy(np.random.default_rng(17).standard_normal((8, 16)).astype(np.float32))
    for opset in (17, 20):
        torch.manual_seed(1)
        export(ExactGeluFfn(), (x,), f"gelu_exact_opset{opset}", ["x"], opset=opset)

    with torch.no_grad():
        torch.onnx.export(
            TwoUnmapped(), (torch.ones(4, 8),), "unmapped.onnx", dynamo=False,
            opset_version=OPSET, input_names=["x"], output_names=["y"],
        )
    with open("mlp.onnx", "rb") as f:
        data = f.read()
    with open("truncated.onnx", "wb") as f:
        f.write(data[: len(data) // 2])

    import onnx

    m = onnx.load("mlp.onnx")
    m.opset_import[0].version = 9
    onnx.save(m, "opset9.onnx")
    m = onnx.load("mlp.onnx")
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(m, "symbolic.onnx")

    if "--fds" in sys.argv:
        from google.protobuf import descriptor_pb2
        from onnx import onnx_ml_pb2

        fds = descriptor_pb2.FileDescriptorSet()
        onnx_ml_pb2.DESCRIPTOR.CopyToProto(fds.file.add())
        with open("../../../import/proto/onnx.fds", "wb") as f:
            f.write(fds.SerializeToString())

    import onnxruntime
    import torchvision
    import transformers

    with open("VERSIONS", "w") as f:
        f.write(
            f"python {sys.version.split()[0]}\ntorch {torch.__version__}\n"
            f"torchvision {torchvision.__version__}\ntransformers {transformers.__version__}\n"
            f"onnx {onnx.__version__}\nonnxruntime {onnxruntime.__version__}\n"
            f"numpy {np.__version__}\n"
        )


if __name__ == "__main__":
    main()
