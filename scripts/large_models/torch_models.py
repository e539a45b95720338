"""Exports full-size PyTorch models to ONNX for `scripts/import-large-models.sh` (issue 31:
larger models than the CI fixtures, imported and checked outside CI):

- `torch_resnet50.onnx`: torchvision's ResNet-50 (randomly initialised, seeded; BatchNorm kept as
  nodes), input `x` (BATCH, 3, SIZE, SIZE);
- `torch_gpt2.onnx`: Hugging Face GPT-2 small (`GPT2Config()`: 12 layers, 768 wide, 12 heads,
  vocabulary 50257; randomly initialised, seeded; eager attention, the tanh GeLU), input
  `input_ids` (BATCH, SEQ), output the logits.

    python torch_models.py OUT_DIR [BATCH] [SIZE] [SEQ]

Each is exported with `torch.onnx.export(..., dynamo=False, opset_version=17)` and run by
onnxruntime on a fixed input; `NAME_forward.npz` holds the input (under its ONNX name) and
onnxruntime's output (`logits`). Needs torch, torchvision, transformers, onnx, onnxruntime
and numpy (`pip install torch torchvision transformers onnx onnxruntime numpy`).
"""
import os
import sys

import numpy as np
import torch


def export(model, args, path, input_name):
    import onnxruntime as ort

    model.eval()
    with torch.no_grad():
        torch.onnx.export(
            model, args, path, dynamo=False, opset_version=17, do_constant_folding=False,
            input_names=[input_name], output_names=["logits"],
        )
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    logits = sess.run(None, {input_name: args[0].numpy()})[0]
    np.savez(path.replace(".onnx", "_forward.npz"), **{input_name: args[0].numpy(), "logits": logits})
    params = sum(p.numel() for p in model.parameters())
    print(f"{os.path.basename(path)}: {params} parameters, input {tuple(args[0].shape)}, logits {logits.shape}")


class Logits(torch.nn.Module):
    """GPT-2's LM head model returning only the logits tensor."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        # An explicit all-ones attention mask: without one, transformers looks for packed
        # sequences with `torch.diff`, which the exporter cannot write.
        mask = torch.ones_like(ids)
        return self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits


def main():
    out = sys.argv[1]
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    size = int(sys.argv[3]) if len(sys.argv) > 3 else 112
    seq = int(sys.argv[4]) if len(sys.argv) > 4 else 16
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(50)

    import torchvision

    torch.manual_seed(50)
    net = torchvision.models.resnet50()
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.from_numpy(rng.standard_normal(m.num_features).astype(np.float32) * 0.1))
            m.running_var.copy_(torch.from_numpy(rng.uniform(0.5, 1.5, m.num_features).astype(np.float32)))
    x = torch.from_numpy(rng.standard_normal((batch, 3, size, size)).astype(np.float32))
    export(net, (x,), os.path.join(out, "torch_resnet50.onnx"), "x")

    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(124)
    config = GPT2Config(activation_function="gelu_pytorch_tanh", attn_implementation="eager")
    gpt2 = Logits(GPT2LMHeadModel(config))
    ids = torch.from_numpy(rng.integers(0, config.vocab_size, size=(batch, seq)).astype(np.int64))
    export(gpt2, (ids,), os.path.join(out, "torch_gpt2.onnx"), "input_ids")


if __name__ == "__main__":
    main()
