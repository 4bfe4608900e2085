"""Builds a ResNet-50 image classifier (the torchvision architecture: bottleneck blocks of
1x1, 3x3, 1x1 convolutions with batch normalization, residual additions and ReLU) with
random weights and random batch-normalization statistics, exported from torch as a user's
own model would be, for benchmarks of convolutional networks (tools/bench/compare_ort.py,
case "resnet"). Nothing is downloaded.

    .venv/bin/python tools/export/make_resnet.py models/cache/resnet50-random
"""
import os
import sys

import numpy as np
import torch
from torch import nn


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * 4
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return torch.relu(y + (self.down(x) if self.down is not None else x))


class ResNet50(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for width, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
            for b in range(blocks):
                layers.append(Bottleneck(cin, width, stride if b == 0 else 1))
                cin = width * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return torch.softmax(self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)), 1)


def main(out_dir: str) -> None:
    torch.manual_seed(20261124)
    model = ResNet50().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):  # statistics as training leaves them
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.0)
                m.bias.normal_(0, 0.1)
    os.makedirs(os.path.join(out_dir, "test_data_set_0"), exist_ok=True)
    path = os.path.join(out_dir, "model.onnx")
    image = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    torch.onnx.export(model, (image,), path, input_names=["image"], output_names=["probs"],
                      opset_version=17, dynamo=False, dynamic_axes={"image": {0: "batch"}})
    import onnx
    from onnx import numpy_helper
    with torch.no_grad():
        probs = model(image).numpy()
    data = os.path.join(out_dir, "test_data_set_0")
    onnx.save_tensor(numpy_helper.from_array(image.numpy(), "image"), os.path.join(data, "input_0.pb"))
    onnx.save_tensor(numpy_helper.from_array(probs.astype(np.float32), "probs"),
                     os.path.join(data, "output_0.pb"))
    ops = sorted({n.op_type for n in onnx.load(path).graph.node})
    print(f"wrote {path} ({os.path.getsize(path)} bytes), ops {', '.join(ops)}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "models/cache/resnet50-random")
